package fake_test

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
)

// svcdemo277 is the 2.77.1 capture's snap: broken was there from the start.
func svcdemo277() fake.Snap {
	return fake.Snap{Name: "svcdemo", Apps: []fake.App{
		{Name: "alpha", Daemon: "simple", Enabled: true, Active: true},
		{Name: "beta", Daemon: "simple", Enabled: true, Active: true},
		{Name: "broken", Daemon: "oneshot", FailStart: fake.SystemctlJobFailed("svcdemo", "broken")},
		{Name: "ctl"},
		{Name: "gamma", Daemon: "simple", Enabled: true, Active: true, StopDuration: 20 * time.Second},
		{Name: "slowstart", Daemon: "forking", StartDuration: 20 * time.Second},
	}}
}

type goldenRun struct {
	t   *testing.T
	s   *fake.Server
	clk *fake.ManualClock
}

func (g *goldenRun) do(sock, method, path, body string) (int, []byte) {
	g.t.Helper()
	code, b, err := conformance.Do(context.Background(), sock, method, path, body)
	if err != nil {
		g.t.Fatalf("%s %s: %v", method, path, err)
	}
	return code, b
}

// check compares a body with testdata/2.77.1/name.json.
func (g *goldenRun) check(name string, code int, body []byte) {
	g.t.Helper()
	want, err := os.ReadFile(filepath.Join("testdata", "2.77.1", name+".json"))
	if err != nil {
		g.t.Fatal(err)
	}
	var env struct {
		StatusCode int `json:"status-code"`
	}
	json.Unmarshal(want, &env)
	if code != env.StatusCode {
		g.t.Errorf("%s: HTTP %d, want %d (%s)", name, code, env.StatusCode, body)
	}
	if d := conformance.Compare(want, body); len(d) > 0 {
		g.t.Errorf("%s differs from snapd 2.77.1:\n  %s\n  got: %s", name, strings.Join(d, "\n  "), body)
	}
}

func (g *goldenRun) main(method, path, body string) (int, []byte) {
	return g.do(g.s.SocketPath(), method, path, body)
}

func (g *goldenRun) snapctl(cookie string, args ...string) (int, []byte) {
	return g.do(g.s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(cookie, args...))
}

func changeID(t *testing.T, b []byte) string {
	var env struct{ Change string }
	if err := json.Unmarshal(b, &env); err != nil || env.Change == "" {
		t.Fatalf("no change in %s", b)
	}
	return env.Change
}

// TestGolden277 rebuilds situations captured from snapd 2.77.1 and compares
// the fake's bodies with the captured ones: task data, systemctl error
// format, snapctl prefix and command list, notices and long-polls,
// configure-hook and install conflicts.
func TestGolden277(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(svcdemo277()), fake.WithClock(clk), fake.WithVersion(fake.Version277))
	g := &goldenRun{t: t, s: s, clk: clk}
	ctx := context.Background()
	cookie := s.Cookie("svcdemo")

	code, b := g.main("GET", "/v2/apps?names=svcdemo", "")
	g.check("apps-snap", code, b)
	s.SetService("svcdemo", "slowstart", fake.AppState{Active: true})
	code, b = g.snapctl(cookie, "services")
	g.check("snapctl-services", code, b)
	code, b = g.snapctl(cookie, "frob")
	g.check("snapctl-unknown-cmd", code, b)
	code, b = g.snapctl("bogus", "services")
	g.check("snapctl-bad-cookie", code, b)
	code, b = g.snapctl(cookie, "restart", "tinybase.x")
	g.check("snapctl-other-snap-svc", code, b)
	code, b = g.snapctl(cookie)
	g.check("snapctl-no-args", code, b)
	code, b = g.main("POST", "/v2/snapctl", cookieBody(cookie, "services"))
	g.check("snapctl-services-mainsock", code, b)

	// REST start/restart/failing start
	_, b = g.main("POST", "/v2/apps", `{"action":"stop","names":["svcdemo.alpha"]}`)
	s.AdvanceUntilReady(ctx, changeID(t, b))
	_, b = g.main("POST", "/v2/apps", `{"action":"start","names":["svcdemo.alpha"]}`)
	id := changeID(t, b)
	s.AdvanceUntilReady(ctx, id)
	code, b = g.main("GET", "/v2/changes/"+id, "")
	g.check("change-start-alpha-done", code, b)
	_, b = g.main("POST", "/v2/apps", `{"action":"restart","names":["svcdemo"]}`)
	id = changeID(t, b)
	s.AdvanceUntilReady(ctx, id)
	code, b = g.main("GET", "/v2/changes/"+id, "")
	g.check("change-restart-snap-done", code, b)
	_, b = g.main("POST", "/v2/apps", `{"action":"start","names":["svcdemo.broken"]}`)
	id = changeID(t, b)
	code, b = g.main("GET", "/v2/changes/"+id, "")
	g.check("change-start-broken-error", code, b)
	code, b = g.main("GET", "/v2/apps?names=svcdemo.broken", "")
	g.check("apps-broken", code, b)

	// a snapctl stop that blocks, and the conflicts it causes
	type res struct {
		code int
		b    []byte
	}
	bg := make(chan res, 1)
	go func() {
		c, b, _ := conformance.Do(ctx, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(cookie, "stop", "svcdemo.gamma"))
		bg <- res{c, b}
	}()
	s.WaitFor(ctx, func(v fake.View) bool { return len(v.InProgress()) > 0 })
	clk.Advance(1500 * time.Millisecond) // the capture read it once the stop had logged "Waiting for"
	code, b = g.main("GET", "/v2/changes?select=in-progress", "")
	g.check("changes-during-snapctl-stop", code, b)
	code, b = g.snapctl(cookie, "restart", "svcdemo.alpha")
	g.check("snapctl-conflict-restart-alpha", code, b)
	code, b = g.main("POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	g.check("rest-conflict-during-snapctl", code, b)
	s.AdvanceUntilIdle(ctx)
	r := <-bg
	g.check("snapctl-bg-stop-gamma-slow", r.code, r.b)

	// notices and long-polls around a slow stop
	_, b = g.main("POST", "/v2/apps", `{"action":"start","names":["svcdemo.gamma"]}`)
	s.AdvanceUntilReady(ctx, changeID(t, b))
	_, b = g.main("POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
	id = changeID(t, b)
	code, b = g.main("GET", "/v2/notices?types=change-update&keys="+id+"&timeout=10s", "")
	g.check("lp-keys-timeout10-noafter", code, b)
	var ns []struct {
		ID           string    `json:"id"`
		LastRepeated time.Time `json:"last-repeated"`
	}
	var env struct{ Result json.RawMessage }
	json.Unmarshal(b, &env)
	json.Unmarshal(env.Result, &ns)
	after := ns[0].LastRepeated.Format(time.RFC3339Nano)
	go func() {
		c, b, _ := conformance.Do(ctx, s.SocketPath(), "GET", "/v2/notices?types=change-update&keys="+id+"&after="+after+"&timeout=30s", "")
		bg <- res{c, b}
	}()
	s.WaitFor(ctx, func(v fake.View) bool { return v.InFlight() > 0 })
	s.AdvanceUntilReady(ctx, id)
	r = <-bg
	g.check("lp-keys-after-loop1", r.code, r.b)
	code, b = g.main("GET", "/v2/notices?types=change-update&keys="+id, "")
	g.check("lp-notice-after-done", code, b)
	g.check("notices-change-update-key", code, b)
	go func() {
		c, b, _ := conformance.Do(ctx, s.SocketPath(), "GET", "/v2/notices?types=change-update&keys=999999&timeout=3s", "")
		bg <- res{c, b}
	}()
	s.WaitFor(ctx, func(v fake.View) bool { return v.InFlight() > 0 })
	waitTimers(clk, 1)
	clk.Advance(3 * time.Second)
	r = <-bg
	g.check("notices-timeout-nomatch", r.code, r.b)
	for name, path := range map[string]string{
		"notices-bad-type":    "/v2/notices?types=bogus",
		"notices-bad-after":   "/v2/notices?after=yesterday",
		"notices-bad-timeout": "/v2/notices?timeout=xyz",
		"x-after-plus-raw":    "/v2/notices?after=2026-12-02T14:00:00+00:00",
		"x-notice-by-id-404":  "/v2/notices/999999",
	} {
		code, b = g.main("GET", path, "")
		g.check(name, code, b)
	}

	// a configure hook (snap set) holds a configure-snap change
	h := s.StartHook("svcdemo", "configure")
	clk.Advance(10 * time.Millisecond)
	code, b = g.main("GET", "/v2/changes/"+h.ChangeID(), "")
	g.check("change-configure-doing", code, b)
	code, b = g.main("GET", "/v2/changes?select=in-progress", "")
	g.check("changes-in-progress-configure", code, b)
	code, b = g.main("POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	g.check("conflict-restart-during-configure", code, b)
	code, b = g.main("POST", "/v2/apps", `{"action":"stop","names":["svcdemo"]}`)
	g.check("conflict-stop-snap-during-configure", code, b)
	code, b = g.snapctl(cookie, "restart", "svcdemo.alpha")
	g.check("snapctl-restart-during-configure", code, b)
	code, b = g.main("GET", "/v2/notices?types=change-update&keys="+h.ChangeID(), "")
	g.check("cfg-notice-now", code, b)
	clk.Advance(15 * time.Second)
	h.Finish()
	code, b = g.main("GET", "/v2/changes/"+h.ChangeID(), "")
	g.check("change-configure-done", code, b)
	code, b = g.main("GET", "/v2/notices?types=change-update&keys="+h.ChangeID(), "")
	g.check("lp-cfg-loop1", code, b)

	// an install of the snap in progress
	inst := s.AddChange(fake.ChangeSpec{Kind: "install-snap", Snap: "svcdemo", WithSnapNames: true})
	code, b = g.main("POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	g.check("x-conflict-apps-during-install", code, b)
	code, b = g.snapctl(cookie, "restart", "svcdemo.alpha")
	g.check("x-conflict-snapctl-during-install", code, b)
	inst.Finish()
	_, b = g.main("GET", "/v2/notices?types=change-update&keys="+inst.ID(), "")
	json.Unmarshal(b, &env)
	json.Unmarshal(env.Result, &ns)
	code, b = g.main("GET", "/v2/notices/"+ns[0].ID, "")
	g.check("x-notice-by-id", code, b)

	// a long-poll in flight when snapd goes away
	go func() {
		c, b, _ := conformance.Do(ctx, s.SocketPath(), "GET", "/v2/notices?keys=999999&timeout=1h", "")
		bg <- res{c, b}
	}()
	s.WaitFor(ctx, func(v fake.View) bool { return v.InFlight() > 0 })
	s.StopListening()
	r = <-bg
	g.check("restart-longpoll-inflight", r.code, r.b)
}
