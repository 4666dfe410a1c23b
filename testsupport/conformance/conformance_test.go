package conformance_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/conformance"
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
	// read slow changes 1.5 s in, where the real target waits too
	conformance.Run(t, target, "testdata/2.57.6", conformance.Settled(conformance.Scenario257), notReproducible257)
}

// TestRealTargetWaitsByPolling checks RealTarget's polling against a fake on
// the real clock, as the integration suite uses it against a real snapd.
func TestRealTargetWaitsByPolling(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "svcdemo", Apps: []fake.App{
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

// TestSettledScenario checks where Settled lets time pass, and that the fake
// target does it on its manual clock.
func TestSettledScenario(t *testing.T) {
	var after []string
	steps := conformance.Settled(conformance.Scenario257)
	for i, st := range steps {
		if st.Op == "prepare" && st.Name == conformance.StepSettle {
			after = append(after, steps[i-1].Op+" "+steps[i-1].Name)
		}
	}
	want := "req post-stop-gamma-slow,req post-start-slowstart,inprogress snapctl-bg-stop-gamma-slow"
	if got := strings.Join(after, ","); got != want {
		t.Fatalf("settles after %s, want after %s", got, want)
	}
	ft := conformance.NewFakeTarget(t, fake.Version257)
	before := ft.Clock.Now()
	if err := ft.Prepare(context.Background(), conformance.StepSettle); err != nil {
		t.Fatal(err)
	}
	if d := ft.Clock.Now().Sub(before); d != conformance.SettleDelay {
		t.Fatalf("settle advanced the clock by %v, want %v", d, conformance.SettleDelay)
	}
}
