package fake_test

import (
	"context"
	"testing"

	"github.com/snapsvc/snapsvc/fake"
)

// A service's history starts with the state it had, then records each
// change of it with its time: a change's stop, then SetService.
func TestServiceHistory(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(clk), fake.WithSnaps(demo()))
	if h := s.ServiceHistory("svcdemo", "alpha"); len(h) != 1 || !h[0].At.IsZero() || !h[0].Active || !h[0].Enabled {
		t.Fatalf("untouched: %+v", h)
	}
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.alpha"],"disable":true}`)
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
	stoppedBy := clk.Now()
	s.SetService("svcdemo", "alpha", fake.AppState{Enabled: true, Active: true})
	h := s.ServiceHistory("svcdemo", "alpha")
	if len(h) < 3 || !h[0].Active || !h[0].At.IsZero() {
		t.Fatalf("history %+v", h)
	}
	last := h[len(h)-1]
	if !last.Active || !last.Enabled || last.At.Before(stoppedBy) {
		t.Fatalf("last %+v, want active and enabled at or after %v", last, stoppedBy)
	}
	// Between them: stopped and disabled, timed within the change.
	mid := h[len(h)-2]
	if mid.Active || mid.Enabled || mid.At.After(stoppedBy) || mid.At.Before(t0) {
		t.Fatalf("stopped %+v, want inactive and disabled by %v", mid, stoppedBy)
	}
	if s.ServiceHistory("svcdemo", "nosuch") != nil {
		t.Fatal("history of an unknown service")
	}
}
