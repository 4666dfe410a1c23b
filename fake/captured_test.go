package fake_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/conformance"
)

// svcdemoIntegration is the integration suite's svcdemo (slow operations 3 s),
// as in the run that captured testdata/captured-*.
func svcdemoIntegration() fake.Snap {
	return fake.Snap{Name: "svcdemo", Apps: []fake.App{
		{Name: "alpha", Daemon: "simple", Enabled: true, Active: true},
		{Name: "beta", Daemon: "simple", Enabled: true, Active: true},
		{Name: "broken", Daemon: "oneshot", FailStart: fake.SystemctlJobFailed("svcdemo", "broken")},
		{Name: "ctl"},
		{Name: "gamma", Daemon: "simple", Enabled: true, Active: true, StopDuration: 3 * time.Second},
		{Name: "helper"},
		{Name: "slowstart", Daemon: "forking", StartDuration: 3 * time.Second},
	}}
}

var pidRE = regexp.MustCompile(`for pid \d+`)

// TestCapturedRealSnapd rebuilds situations of the integration suite's
// real-snapd run (bodies in testdata/captured-VERSION, copied from
// integration/testdata/captured) where the fake used to differ: the
// failed-start error text, snapctl's command list, a non-snap reader of
// changes/notices on the snap socket, and when a slow stop logs "Waiting for
// ... to stop.".
func TestCapturedRealSnapd(t *testing.T) {
	for _, v := range []fake.Version{fake.Version257, fake.Version268} {
		t.Run(string(v), func(t *testing.T) {
			clk := fake.NewManualClock(t0)
			s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(svcdemoIntegration()), fake.WithClock(clk),
				fake.WithVersion(v), fake.WithSnapSocketObserveDenied())
			g := &goldenRun{t: t, s: s, clk: clk}
			ctx := context.Background()
			check := func(name string, code int, body []byte) {
				t.Helper()
				want, err := os.ReadFile(filepath.Join("testdata", "captured-"+string(v), name+".json"))
				if err != nil {
					t.Fatal(err)
				}
				var env struct {
					StatusCode int `json:"status-code"`
				}
				json.Unmarshal(want, &env)
				if code != env.StatusCode {
					t.Errorf("%s: HTTP %d, want %d (%s)", name, code, env.StatusCode, body)
				}
				// the pid in "cannot find a snap for pid N" is the caller's
				want = pidRE.ReplaceAll(want, []byte("for pid N"))
				body = pidRE.ReplaceAll(body, []byte("for pid N"))
				if d := conformance.Compare(want, body); len(d) > 0 {
					t.Errorf("%s differs from snapd %s:\n  %s\n  got: %s", name, v, strings.Join(d, "\n  "), body)
				}
			}

			_, b := g.main("POST", "/v2/apps", `{"action":"start","names":["svcdemo.broken"]}`)
			id := changeID(t, b)
			if err := s.AdvanceUntilReady(ctx, id); err != nil {
				t.Fatal(err)
			}
			code, b := g.main("GET", "/v2/changes/"+id, "")
			check("change-start-broken", code, b)

			code, b = g.snapctl(s.Cookie("svcdemo"), "frob")
			check("snapctl-unknown-cmd", code, b)

			// gamma's stop takes 3 s: no log at first, nor just before 1 s
			_, b = g.main("POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
			gamma := changeID(t, b)
			posted := clk.Now()
			code, b = g.main("GET", "/v2/changes/"+gamma, "")
			check("change-stop-gamma-doing", code, b)
			clk.Advance(time.Second - time.Millisecond)
			if l := taskLog(t, g, gamma); len(l) != 0 {
				t.Fatalf("log before 1 s into the stop: %q", l)
			}
			clk.Advance(500 * time.Millisecond)
			code, b = g.main("GET", "/v2/changes/"+gamma, "")
			check("change-stop-gamma-doing-1.5s", code, b)
			want := []string{posted.Add(time.Second).Format(time.RFC3339) + ` INFO Waiting for "snap.svcdemo.gamma.service" to stop.`}
			if l := taskLog(t, g, gamma); strings.Join(l, "\n") != strings.Join(want, "\n") {
				t.Fatalf("log 1.5 s into the stop: %q, want %q", l, want)
			}

			code, b = g.do(s.SnapSocketPath(), "GET", "/v2/notices?types=change-update&keys="+gamma, "")
			check("notices-snap-socket", code, b)
			code, b = g.do(s.SnapSocketPath(), "GET", "/v2/changes/"+gamma, "")
			check("changes-snap-socket", code, b)
			if err := s.AdvanceUntilReady(ctx, gamma); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStopWaitingLogOnlyWhileStopping: a stop that ends within the first
// second logs nothing, one still running at 1 s logs once, and a stop that
// was already over when the 1 s timer would fire does not log late.
func TestStopWaitingLogOnlyWhileStopping(t *testing.T) {
	for _, tc := range []struct {
		stop time.Duration
		logs int
	}{
		{500 * time.Millisecond, 0},
		{time.Second, 0},
		{time.Second + time.Millisecond, 1},
		{20 * time.Second, 1},
	} {
		t.Run(tc.stop.String(), func(t *testing.T) {
			clk := fake.NewManualClock(t0)
			s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(clk), fake.WithSnaps(fake.Snap{Name: "svcdemo", Apps: []fake.App{
				{Name: "gamma", Daemon: "simple", Enabled: true, Active: true, StopDuration: tc.stop},
			}}))
			g := &goldenRun{t: t, s: s, clk: clk}
			_, b := g.main("POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
			id := changeID(t, b)
			if err := s.AdvanceUntilReady(context.Background(), id); err != nil {
				t.Fatal(err)
			}
			clk.Advance(2 * time.Second) // nothing may log after the end
			l := taskLog(t, g, id)
			if len(l) != tc.logs {
				t.Fatalf("stop of %v: log %q, want %d entries", tc.stop, l, tc.logs)
			}
			if info, _ := s.ChangeByID(id); info.Status != "Done" {
				t.Fatalf("%+v", info)
			}
		})
	}
}

func taskLog(t *testing.T, g *goldenRun, id string) []string {
	t.Helper()
	_, b := g.main("GET", "/v2/changes/"+id, "")
	var e env
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	var c change
	decode(t, e.Result, &c)
	if len(c.Tasks) != 1 {
		t.Fatalf("change %s: %d tasks: %s", id, len(c.Tasks), b)
	}
	return c.Tasks[0].Log
}
