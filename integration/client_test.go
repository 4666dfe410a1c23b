//go:build realsnapd

package integration

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// These tests drive snapsvc.Client against the real snapd.

func newClient(t testing.TB, e env, opts ...snapsvc.Option) *snapsvc.Client {
	t.Helper()
	base := []snapsvc.Option{
		snapsvc.WithSocket(e.Socket),
		snapsvc.WithSnapSocket(e.SnapSocket),
		snapsvc.WithLockDir(t.TempDir()),
		snapsvc.WithLogger(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))),
	}
	c, err := snapsvc.New(append(base, opts...)...)
	if err != nil {
		t.Fatalf("snapsvc.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testWriter sends the client's log lines to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestClientServices(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	c := newClient(t, e, snapsvc.WithMode(snapsvc.ModeREST))
	ctx := ctxFor(t, time.Minute)

	svcs, err := c.Services(ctx, "svcdemo")
	if err != nil {
		t.Fatalf("Services(svcdemo): %v", err)
	}
	got := map[string]snapsvc.Service{}
	for _, s := range svcs {
		got[s.Name] = s
	}
	want := map[string]snapsvc.Service{
		"alpha":     {Snap: "svcdemo", Name: "alpha", Daemon: "simple", DaemonScope: "system", Enabled: true, Active: true},
		"beta":      {Snap: "svcdemo", Name: "beta", Daemon: "simple", DaemonScope: "system", Enabled: true, Active: true},
		"gamma":     {Snap: "svcdemo", Name: "gamma", Daemon: "simple", DaemonScope: "system", Enabled: true, Active: true},
		"slowstart": {Snap: "svcdemo", Name: "slowstart", Daemon: "forking", DaemonScope: "system"},
		"broken":    {Snap: "svcdemo", Name: "broken", Daemon: "oneshot", DaemonScope: "system"},
	}
	if len(got) != len(want) {
		t.Errorf("Services(svcdemo): got %d services %+v, want %d", len(got), svcs, len(want))
	}
	for n, ws := range want {
		gs := got[n]
		if !versionAtLeast(e.Version, 2, 59) && gs.DaemonScope == "" {
			gs.DaemonScope = "system" // older snapd may omit it
		}
		if gs != ws {
			t.Errorf("service %s: got %+v, want %+v", n, got[n], ws)
		}
	}
	one, err := c.Services(ctx, "svcdemo.alpha")
	if err != nil || len(one) != 1 || one[0].Name != "alpha" {
		t.Errorf("Services(svcdemo.alpha) = %+v, %v", one, err)
	}
	if _, err := c.Services(ctx, "svcdemo.nosuch"); !errors.Is(err, snapsvc.ErrNotFound) {
		t.Errorf("Services(svcdemo.nosuch): want ErrNotFound, got %v", err)
	}
}

func TestClientStartStopRestart(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })
	c := newClient(t, e, snapsvc.WithMode(snapsvc.ModeREST))
	ctx := ctxFor(t, 2*time.Minute)

	check := func(step, app string, enabled, active bool) {
		t.Helper()
		a := w.apps(t, "svcdemo."+app)[app]
		if a.Enabled != enabled || a.Active != active {
			t.Errorf("after %s: %s enabled=%v active=%v, want %v %v", step, app, a.Enabled, a.Active, enabled, active)
		}
	}
	done := func(step string, res *snapsvc.Result, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if res.Status != "Done" || res.ChangeID == "" || res.Attempts != 1 || res.Conflicts != 0 {
			t.Errorf("%s: result %+v, want Done with a change id, one attempt, no conflicts", step, res)
		}
		chg := w.change(t, res.ChangeID)
		if chg.Kind != "service-control" || chg.Status != "Done" {
			t.Errorf("%s: change %s is %s %s", step, chg.ID, chg.Kind, chg.Status)
		}
	}

	res, err := c.Stop(ctx, []string{"svcdemo.alpha"}, snapsvc.StopOptions{})
	done("stop", res, err)
	check("stop", "alpha", true, false)

	res, err = c.Start(ctx, []string{"svcdemo.alpha"}, snapsvc.StartOptions{})
	done("start", res, err)
	check("start", "alpha", true, true)

	res, err = c.Stop(ctx, []string{"svcdemo.alpha", "svcdemo.beta"}, snapsvc.StopOptions{Disable: true})
	done("stop --disable", res, err)
	check("stop --disable", "alpha", false, false)
	check("stop --disable", "beta", false, false)

	res, err = c.Start(ctx, []string{"svcdemo.alpha", "svcdemo.beta"}, snapsvc.StartOptions{Enable: true})
	done("start --enable", res, err)
	check("start --enable", "alpha", true, true)
	check("start --enable", "beta", true, true)

	before := servicePIDs(t, "alpha")
	if len(before) == 0 {
		t.Errorf("found no process of svcdemo.alpha by its cgroup")
	}
	res, err = c.Restart(ctx, []string{"svcdemo.alpha"}, snapsvc.RestartOptions{})
	done("restart", res, err)
	check("restart", "alpha", true, true)
	after := servicePIDs(t, "alpha")
	for pid := range after {
		if before[pid] {
			t.Errorf("restart: alpha's process %s survived (before %v, after %v)", pid, sortedKeys(before), sortedKeys(after))
		}
	}
	if len(after) == 0 {
		t.Errorf("restart: svcdemo.alpha has no process afterwards")
	}

	// Reload: svcdemo's daemons have no reload-command, so systemd's
	// reload-or-restart restarts them.
	res, err = c.Restart(ctx, []string{"svcdemo.beta"}, snapsvc.RestartOptions{Reload: true})
	done("restart --reload", res, err)
	check("restart --reload", "beta", true, true)
	if chg := w.change(t, res.ChangeID); len(chg.Tasks) == 0 || !strings.Contains(chg.Tasks[0].Summary, "reload-or-restart") {
		t.Errorf("restart --reload: task %+v, want a reload-or-restart service command", chg.Tasks)
	}

	// The async form hands back the change at once.
	op, err := c.StopAsync(ctx, []string{"svcdemo.gamma"}, snapsvc.StopOptions{})
	if err != nil {
		t.Fatalf("StopAsync(gamma): %v", err)
	}
	if op.ChangeID() == "" {
		t.Fatal("StopAsync: no change id")
	}
	if chg := w.change(t, op.ChangeID()); chg.Ready {
		t.Errorf("StopAsync returned after gamma's slow stop had ended (change %s ready)", chg.ID)
	}
	res, err = op.Wait(ctx)
	done("stop gamma (async)", res, err)
	check("stop gamma (async)", "gamma", true, false)
}

// servicePIDs lists the (host) pids of a service's processes, found by
// their cgroup; the test process shares the host's /proc.
func servicePIDs(t testing.TB, app string) map[string]bool {
	t.Helper()
	unit := "/snap.svcdemo." + app + ".service\n"
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]bool{}
	for _, d := range dirs {
		b, err := os.ReadFile("/proc/" + d.Name() + "/cgroup")
		if err == nil && strings.Contains(string(b), unit) {
			pids[d.Name()] = true
		}
	}
	return pids
}

// blockedOp runs op while a blocking change (made by block) is in progress
// and checks that the client absorbed the conflict and acted right after
// the blocking change ended.
func blockedOp(t *testing.T, e env, w *wire, c *snapsvc.Client, blocking string, op func(context.Context) (*snapsvc.Result, error)) {
	t.Helper()
	ctx := ctxFor(t, 2*time.Minute)
	res, err := op(ctx)
	if err != nil {
		t.Fatalf("operation during change %s: %v", blocking, err)
	}
	blk := w.change(t, blocking)
	if !blk.Ready {
		t.Fatalf("operation returned while blocking change %s is still %s", blocking, blk.Status)
	}
	if res.Conflicts < 1 || res.Attempts < 2 {
		t.Errorf("result %+v: want at least one conflict absorbed", res)
	}
	if !slices.Contains(res.WaitedFor, blocking) {
		t.Errorf("result %+v: WaitedFor does not name blocking change %s", res, blocking)
	}
	if res.ChangeID == "" {
		return // snapctl mode: snapd reports no change id
	}
	own := w.change(t, res.ChangeID)
	lag := own.SpawnTime.Sub(blk.ReadyTime)
	t.Logf("snapd %s: blocking change %s (%s) ready at %s; our change %s spawned %v later",
		e.Version, blk.ID, blk.Kind, blk.ReadyTime.Format(time.RFC3339Nano), own.ID, lag)
	if lag < 0 {
		t.Errorf("our change %s spawned before blocking change %s was ready", own.ID, blk.ID)
	}
	if lag > 2*time.Second {
		t.Errorf("our change %s spawned %v after the blocking change ended; want right after", own.ID, lag)
	}
}

func TestClientConflictAbsorbed(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })
	c := newClient(t, e, snapsvc.WithMode(snapsvc.ModeREST))

	r := w.postApps(t, "stop", []string{"svcdemo.gamma"}, nil)
	if r.StatusCode != 202 {
		t.Fatalf("stop gamma: %s", r.Raw)
	}
	blockedOp(t, e, w, c, r.Change, func(ctx context.Context) (*snapsvc.Result, error) {
		return c.Restart(ctx, []string{"svcdemo.alpha"}, snapsvc.RestartOptions{})
	})
}

func TestClientConfigureConflictAbsorbed(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() {
		w.waitIdle(t)
		w.waitChange(t, w.setConf(t, map[string]any{"hook-sleep": 0}), time.Minute)
	})
	c := newClient(t, e, snapsvc.WithMode(snapsvc.ModeREST))

	cfg := w.setConf(t, map[string]any{"hook-sleep": int(e.Slow / time.Second)})
	blockedOp(t, e, w, c, cfg, func(ctx context.Context) (*snapsvc.Result, error) {
		return c.Restart(ctx, []string{"svcdemo.alpha", "svcdemo.beta"}, snapsvc.RestartOptions{})
	})
}

func TestClientFailingStart(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	c := newClient(t, e, snapsvc.WithMode(snapsvc.ModeREST))
	ctx := ctxFor(t, time.Minute)

	res, err := c.Start(ctx, []string{"svcdemo.broken"}, snapsvc.StartOptions{})
	if err == nil {
		t.Fatalf("starting broken succeeded: %+v", res)
	}
	var oe *snapsvc.OpError
	if !errors.As(err, &oe) {
		t.Fatalf("error %T %v: want *snapsvc.OpError", err, err)
	}
	if oe.ChangeID == "" || oe.Op != "start" {
		t.Errorf("OpError %+v: want op start with the change id", oe)
	}
	var ce *snapsvc.ChangeError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v: want a *snapsvc.ChangeError inside", err)
	}
	chg := w.change(t, oe.ChangeID)
	if ce.ID != chg.ID || ce.Status != "Error" || ce.Err != chg.Err {
		t.Errorf("ChangeError %+v, want change %s status Error and snapd's err %q", ce, chg.ID, chg.Err)
	}
	msg := err.Error()
	for _, want := range []string{"svcdemo.broken", "change " + chg.ID, "cannot perform the following tasks", "snap.svcdemo.broken.service"} {
		mustContain(t, "error text", msg, want)
	}
	if oe.Retryable() || retry.IsRetryable(err) {
		t.Errorf("a failed start is reported retryable: %v", err)
	}
}

// snapctl mode: what a snap's own code does with its cookie.
func TestClientSnapctl(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })
	c := newClient(t, e, snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithCookie(e.cookie(t)), snapsvc.WithSnap("svcdemo"))
	ctx := ctxFor(t, 2*time.Minute)

	res, err := c.Restart(ctx, []string{"svcdemo.alpha"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatalf("snapctl restart alpha: %v", err)
	}
	if res.Status != "Done" || res.Attempts != 1 {
		t.Errorf("snapctl restart: %+v", res)
	}
	if _, err := c.Stop(ctx, []string{"svcdemo.beta"}, snapsvc.StopOptions{Disable: true}); err != nil {
		t.Fatalf("snapctl stop --disable beta: %v", err)
	}
	if a := w.apps(t, "svcdemo.beta")["beta"]; a.Enabled || a.Active {
		t.Errorf("after snapctl stop --disable: beta %+v", a)
	}
	if _, err := c.Start(ctx, []string{"svcdemo.beta"}, snapsvc.StartOptions{Enable: true}); err != nil {
		t.Fatalf("snapctl start --enable beta: %v", err)
	}
	if a := w.apps(t, "svcdemo.beta")["beta"]; !a.Enabled || !a.Active {
		t.Errorf("after snapctl start --enable: beta %+v", a)
	}
	if _, err := c.Restart(ctx, []string{"tinybase.x"}, snapsvc.RestartOptions{}); err == nil {
		t.Errorf("snapctl restart of another snap's service succeeded")
	}

	// A conflict held by the slow stop, absorbed through snapctl.
	r := w.postApps(t, "stop", []string{"svcdemo.gamma"}, nil)
	if r.StatusCode != 202 {
		t.Fatalf("stop gamma: %s", r.Raw)
	}
	begin := time.Now()
	blockedOp(t, e, w, c, r.Change, func(ctx context.Context) (*snapsvc.Result, error) {
		return c.Restart(ctx, []string{"svcdemo.alpha"}, snapsvc.RestartOptions{})
	})
	blk := w.change(t, r.Change)
	t.Logf("snapctl restart returned %v after the blocking change was ready", time.Since(begin)-blk.ReadyTime.Sub(begin))
}

// sortedKeys returns m's keys, sorted.
func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
