package fake_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)


// Aborting a service-control change while its task is Doing: the task runs
// to the end, the runner moves it Abort -> Undo, and with no undo handler
// it goes back to Done, so the change ends Done (overlord/state/taskrunner.go).
func TestAbortServiceControlEndsDone(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.WithSnaps(demo()), fake.WithClock(clk))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
	code, e2 := call(t, s.SocketPath(), "POST", "/v2/changes/"+e.Change, `{"action":"abort"}`)
	var ch change
	decode(t, e2.Result, &ch)
	if code != 200 || ch.Status != "Abort" || ch.Ready {
		t.Fatalf("%d %s", code, e2.Result)
	}
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
	info, _ := s.ChangeByID(e.Change)
	if info.Status != "Done" || info.Tasks[0].Status != "Done" || info.Err != "" {
		t.Fatalf("%+v", info)
	}
	if st, _ := s.Service("svcdemo", "gamma"); st.Active {
		t.Fatalf("gamma still active: the stop ran to the end")
	}
}

// A failing task aborts its change first (the task passes through Abort),
// so a failed change has one more change-update occurrence (4) than a
// successful one (3), as golden 2.77.1 notices-all shows; Done tasks of a
// foreign change are undone, and pending ones are put on Hold.
func TestFailureAbortsChange(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.WithSnaps(demo()), fake.WithClock(clk))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","names":["svcdemo.broken"]}`)
	code, n := call(t, s.SocketPath(), "GET", "/v2/notices?keys="+e.Change, "")
	var ns []struct {
		Occurrences int `json:"occurrences"`
	}
	decode(t, n.Result, &ns)
	if code != 200 || len(ns) != 1 || ns[0].Occurrences != 4 {
		t.Fatalf("%s", n.Result)
	}

	chg := s.AddChange(fake.ChangeSpec{Kind: "install-snap", Snap: "svcdemo", Tasks: []fake.TaskSpec{
		{Kind: "mount-snap", Summary: "Mount"}, {Kind: "link-snap", Summary: "Link"}, {Kind: "start-snap-services", Summary: "Start"}}})
	chg.Next()
	chg.Fail("boom")
	info := chg.Info()
	got := []string{info.Status, info.Tasks[0].Status, info.Tasks[1].Status, info.Tasks[2].Status}
	if strings.Join(got, " ") != "Error Undone Error Hold" || !info.Ready {
		t.Fatalf("%v", got)
	}
}

// start --enable that fails disables every service of the batch again,
// also one that was enabled before (wrappers/services.go StartServices:
// "always disable if enable was requested").
func TestFailedStartEnableDisablesAll(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.WithSnaps(demo()), fake.WithClock(clk))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","enable":true,"names":["svcdemo.alpha","svcdemo.broken"]}`)
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"alpha", "broken"} {
		if st, _ := s.Service("svcdemo", app); st.Enabled || st.Active {
			t.Fatalf("%s: %+v", app, st)
		}
	}
}

// A stop goes through the services in name order, not reverse start order
// (overlord/servicestate/service_control.go sorts only for start/restart).
func TestStopInNameOrder(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.WithClock(clk), fake.WithSnaps(fake.Snap{Name: "k", Apps: []fake.App{
		{Name: "a", Daemon: "simple", Enabled: true, Active: true, Before: []string{"b"}, StopDuration: time.Second},
		{Name: "b", Daemon: "simple", Enabled: true, Active: true, StopDuration: time.Second},
	}}))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["k"]}`)
	clk.Advance(time.Second)
	a, _ := s.Service("k", "a")
	b, _ := s.Service("k", "b")
	if a.Active || !b.Active {
		t.Fatalf("after 1s: a=%+v b=%+v (a stops first)", a, b)
	}
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
}

// restart --reload of an inactive enabled service that fails names
// "reload-or-restart" (one systemctl call), a plain restart names "start"
// (systemd.Restart is Stop then Start).
func TestReloadFailureVerb(t *testing.T) {
	s := fake.NewServer(t, fake.WithSnaps(fake.Snap{Name: "k", Apps: []fake.App{
		{Name: "a", Daemon: "simple", Enabled: true, FailStart: "boom\n"},
	}}))
	for action, verb := range map[string]string{`"restart","reload":true`: "reload-or-restart", `"restart"`: "start"} {
		_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":`+action+`,"names":["k.a"]}`)
		if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
			t.Fatal(err)
		}
		info, _ := s.ChangeByID(e.Change)
		if !strings.Contains(info.Err, "systemctl command ["+verb+" snap.k.a.service]") {
			t.Fatalf("%s: %q", action, info.Err)
		}
	}
}
