package conformance_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/internal/conformance"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// notReproducible257 lists the 2.57.6 cases the fake does not reproduce,
// (currently none; differences from snapd outside the captured cases are
// listed with their reasons in fake/doc.go, "Known differences from snapd"),
// with the reason. Run fails if a listed case starts matching, so the list
// cannot silently go stale (or grow without a reason written here).
var notReproducible257 = map[string]string{}

func TestFakeConforms257(t *testing.T) {
	target := conformance.NewFakeTarget(t, fake.Version257)
	conformance.Run(t, target, "testdata/2.57.6", conformance.Scenario257, notReproducible257)
}

// TestRealTargetWaitsByPolling checks RealTarget's polling against a fake on
// the real clock, as the integration suite uses it against a real snapd.
func TestRealTargetWaitsByPolling(t *testing.T) {
	s := fake.NewServer(t, fake.WithSnaps(fake.Snap{Name: "svcdemo", Apps: []fake.App{
		{Name: "gamma", Daemon: "simple", Enabled: true, Active: true, StopDuration: 50 * time.Millisecond},
	}}))
	rt := &conformance.RealTarget{Main: s.SocketPath(), Snap: s.SnapSocketPath(), SnapCookie: s.Cookie("svcdemo"), PollInterval: 5 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, b, err := conformance.Do(ctx, rt.MainSocket(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
	if err != nil || code != 202 {
		t.Fatalf("%d %s %v", code, b, err)
	}
	if err := rt.WaitInProgress(ctx); err != nil {
		t.Fatal(err)
	}
	var env struct{ Change string }
	json.Unmarshal(b, &env)
	if err := rt.WaitChangeReady(ctx, env.Change); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Service("svcdemo", "gamma"); st.Active {
		t.Fatal("change ready but gamma active")
	}
	if _, err := os.Stat(filepath.Join(conformance.GoldenDir("2.57.6"), "cases.tsv")); err != nil {
		t.Fatal(err)
	}
}
