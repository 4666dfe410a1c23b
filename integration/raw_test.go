//go:build realsnapd

package integration

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
)

// These tests talk to snapd over the raw wire. They pin the facts the fake
// and the client rely on, so that a change in snapd shows up here first.

func TestRawServiceStatus(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	apps := w.apps(t, "svcdemo")
	want := map[string]appInfo{
		"alpha":     {Snap: "svcdemo", Name: "alpha", Daemon: "simple", Enabled: true, Active: true},
		"beta":      {Snap: "svcdemo", Name: "beta", Daemon: "simple", Enabled: true, Active: true},
		"gamma":     {Snap: "svcdemo", Name: "gamma", Daemon: "simple", Enabled: true, Active: true},
		"slowstart": {Snap: "svcdemo", Name: "slowstart", Daemon: "forking"},
		"broken":    {Snap: "svcdemo", Name: "broken", Daemon: "oneshot"},
	}
	if len(apps) != len(want) {
		t.Errorf("got %d services, want %d: %+v", len(apps), len(want), apps)
	}
	for n, w := range want {
		if apps[n] != w {
			t.Errorf("service %s: got %+v, want %+v", n, apps[n], w)
		}
	}
	// "ctl" is not a service: it is listed without select=service only.
	r := w.do(t, "GET", "/v2/apps?names=svcdemo.ctl", nil)
	if r.StatusCode != 200 {
		t.Errorf("GET /v2/apps?names=svcdemo.ctl: %s", r.Raw)
	}
	r = w.do(t, "GET", "/v2/apps?names=svcdemo.nosuch", nil)
	if r.StatusCode != 404 {
		t.Errorf("unknown app: want 404, got %s", r.Raw)
	}
}

// A stop whose stop-command is slow holds a service-control change; any
// other service action on the snap is refused with a 400 that has no kind.
func TestRawConflictDuringSlowStop(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })

	r := w.postApps(t, "stop", []string{"svcdemo.gamma"}, nil)
	if r.StatusCode != 202 {
		t.Fatalf("stop gamma: %s", r.Raw)
	}
	blocking := r.Change
	c := w.postApps(t, "restart", []string{"svcdemo.alpha"}, nil)
	if c.StatusCode != 400 {
		t.Fatalf("restart during a slow stop: want 400, got %s", c.Raw)
	}
	er := w.errorOf(t, c)
	if er.Kind != "" || er.Message != conflictMessage("service-control") {
		t.Errorf("conflict: got kind %q message %q", er.Kind, er.Message)
	}
	done := w.waitChange(t, blocking, e.Slow+time.Minute)
	if done.Status != "Done" {
		t.Errorf("slow stop ended %s: %s", done.Status, done.Err)
	}
	if took := done.ReadyTime.Sub(done.SpawnTime); took < e.Slow-time.Second {
		t.Errorf("slow stop took %v, want about %v", took, e.Slow)
	}
}

// A foreign configure-snap change (configure hook sleeping) blocks service
// actions with the same 400; other endpoints answer 409 snap-change-conflict.
func TestRawConflictDuringConfigure(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() {
		w.waitIdle(t)
		w.waitChange(t, w.setConf(t, map[string]any{"hook-sleep": 0}), time.Minute)
	})

	cfg := w.setConf(t, map[string]any{"hook-sleep": int(e.Slow / time.Second)})
	c := w.postApps(t, "restart", []string{"svcdemo.alpha"}, nil)
	if c.StatusCode != 400 {
		t.Fatalf("restart during configure: want 400, got %s", c.Raw)
	}
	er := w.errorOf(t, c)
	if er.Kind != "" || er.Message != conflictMessage("configure-snap") {
		t.Errorf("conflict: got kind %q message %q", er.Kind, er.Message)
	}
	p := w.do(t, "PUT", "/v2/snaps/svcdemo/conf", map[string]any{"foo": "bar"})
	if p.StatusCode != 409 {
		t.Fatalf("PUT conf during configure: want 409, got %s", p.Raw)
	}
	if er := w.errorOf(t, p); er.Kind != "snap-change-conflict" {
		t.Errorf("PUT conf conflict: kind %q, want snap-change-conflict (%s)", er.Kind, p.Raw)
	}
	done := w.waitChange(t, cfg, e.Slow+time.Minute)
	if done.Kind != "configure-snap" || done.Status != "Done" {
		t.Errorf("configure change: %s %s %s", done.Kind, done.Status, done.Err)
	}
}

// A oneshot that exits non-zero makes its start change end in Error, with
// systemctl's text in err.
func TestRawFailingStart(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	c := w.serviceOp(t, "start", []string{"svcdemo.broken"}, nil, "Error")
	mustContain(t, "change err", c.Err, "cannot perform the following tasks")
	mustContain(t, "change err", c.Err, "snap.svcdemo.broken.service")
}

// snapd's stop waits for the unit and, if it is still running about a
// second in, logs "Waiting for ... to stop." on the task; the fake
// imitates this, so measure when it appears.
func TestRawStopWaitingLog(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })

	r := w.postApps(t, "stop", []string{"svcdemo.gamma"}, nil)
	if r.StatusCode != 202 {
		t.Fatalf("stop gamma: %s", r.Raw)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var c change
	for {
		c = w.change(t, r.Change)
		if c.Ready || len(c.Tasks) > 0 && len(c.Tasks[0].Log) > 0 {
			break
		}
		<-tick.C
	}
	if c.Ready {
		t.Fatalf("stop of gamma ended without a waiting log: %+v", c)
	}
	seen := time.Now()
	want := `INFO Waiting for "snap.svcdemo.gamma.service" to stop.`
	if got := c.Tasks[0].Log[0]; !strings.HasSuffix(got, want) {
		t.Errorf("task log %q, want it to end with %q", got, want)
	}
	after := seen.Sub(c.SpawnTime)
	t.Logf("snapd %s: waiting log seen %v after the change spawned", e.Version, after.Round(time.Millisecond))
	if after < 500*time.Millisecond || after > 3*time.Second {
		t.Errorf("waiting log appeared %v after spawn, want about 1s", after)
	}
	w.waitChange(t, r.Change, e.Slow+time.Minute)
}

// snapd >= 2.62 records change-update notices; a long-poll for a change's
// notice wakes right after the change is ready. Older snapd answers 404.
func TestRawNoticesLongPoll(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	if !versionAtLeast(e.Version, 2, 62) {
		if r := w.do(t, "GET", "/v2/notices", nil); r.StatusCode != 404 {
			t.Errorf("GET /v2/notices on snapd %s: want 404, got %s", e.Version, r.Raw)
		}
		t.Skipf("snapd %s has no notices", e.Version)
	}
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })

	r := w.postApps(t, "stop", []string{"svcdemo.gamma"}, nil)
	if r.StatusCode != 202 {
		t.Fatalf("stop gamma: %s", r.Raw)
	}
	after := time.Now().UTC().Format(time.RFC3339Nano)
	// Notices for this change after "after" that are not the Doing one:
	// loop until the notice's last data says the change is ready.
	var woke time.Time
	for i := 0; ; i++ {
		n := w.do(t, "GET", "/v2/notices?types=change-update&keys="+r.Change+"&after="+after+"&timeout=30s", nil)
		woke = time.Now()
		var ns []struct {
			LastRepeated time.Time `json:"last-repeated"`
		}
		decode(t, n, &ns)
		if len(ns) == 0 {
			t.Fatalf("long-poll timed out with no notice for change %s", r.Change)
		}
		if c := w.change(t, r.Change); c.Ready || i > 10 {
			break
		}
		after = ns[0].LastRepeated.UTC().Format(time.RFC3339Nano)
	}
	c := w.change(t, r.Change)
	lag := woke.Sub(c.ReadyTime)
	t.Logf("snapd %s: long-poll woke %v after change %s was ready", e.Version, lag.Round(100*time.Microsecond), c.ID)
	if lag < 0 || lag > time.Second {
		t.Errorf("long-poll woke %v after the change's ready-time, want within a second", lag)
	}
}

// Tasks carry data.affected-snaps from 2.68 on (2.68.3 and 2.77.1; 2.57.6
// has none), except the exec-command task of a snapctl-made change; a
// service-control change itself carries no data on any version.
func TestRawTaskData(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	ctl := newWire(t, e.SnapSocket)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })
	want := "null"
	if versionAtLeast(e.Version, 2, 68) {
		want = `{"affected-snaps":["svcdemo"]}`
	}

	rest := w.serviceOp(t, "restart", []string{"svcdemo.alpha"}, nil, "Done")
	if r := ctl.snapctl(t, e.cookie(t), "restart", "svcdemo.beta"); r.StatusCode != 200 {
		t.Fatalf("snapctl restart: %s", r.Raw)
	}
	// The newest snapctl-made change (snapctl answered once it was ready).
	var snapctlMade string
	newest := 0
	r := w.do(t, "GET", "/v2/changes?select=all", nil)
	var all []change
	decode(t, r, &all)
	for _, c := range all {
		if n, _ := strconv.Atoi(c.ID); n > newest && c.Summary == `Running service command for snap "svcdemo"` {
			snapctlMade, newest = c.ID, n
		}
	}
	if snapctlMade == "" {
		t.Fatalf("no snapctl-made change among %s", r.Raw)
	}

	type rawTask struct {
		Kind string          `json:"kind"`
		Data json.RawMessage `json:"data"`
	}
	type rawChange struct {
		Data  json.RawMessage `json:"data"`
		Tasks []rawTask       `json:"tasks"`
	}
	read := func(id string) rawChange {
		r := w.do(t, "GET", "/v2/changes/"+id, nil)
		var c rawChange
		decode(t, r, &c)
		return c
	}
	data := func(m json.RawMessage) string {
		if len(m) == 0 {
			return "null"
		}
		return string(m)
	}
	for _, id := range []string{rest.ID, snapctlMade} {
		c := read(id)
		if data(c.Data) != "null" {
			t.Errorf("snapd %s: change %s has data %s, want none", e.Version, id, c.Data)
		}
		for _, tk := range c.Tasks {
			exp := want
			if tk.Kind == "exec-command" {
				exp = "null"
			}
			if got := data(tk.Data); got != exp {
				t.Errorf("snapd %s: change %s task %s: data %s, want %s", e.Version, id, tk.Kind, got, exp)
			}
		}
	}
	var kinds []string
	for _, tk := range read(snapctlMade).Tasks {
		kinds = append(kinds, tk.Kind)
	}
	if got := strings.Join(kinds, ","); got != "exec-command,service-control" {
		t.Errorf("snapctl-made change %s has tasks %s, want exec-command,service-control", snapctlMade, got)
	}
}
