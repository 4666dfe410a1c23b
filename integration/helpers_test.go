//go:build realsnapd

package integration

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// change is the part of snapd's change we look at.
type change struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	Summary   string    `json:"summary"`
	Status    string    `json:"status"`
	Ready     bool      `json:"ready"`
	Err       string    `json:"err"`
	SpawnTime time.Time `json:"spawn-time"`
	ReadyTime time.Time `json:"ready-time"`
	Tasks     []struct {
		Kind    string   `json:"kind"`
		Summary string   `json:"summary"`
		Status  string   `json:"status"`
		Log     []string `json:"log"`
	} `json:"tasks"`
}

// appInfo is one entry of GET /v2/apps.
type appInfo struct {
	Snap    string `json:"snap"`
	Name    string `json:"name"`
	Daemon  string `json:"daemon"`
	Enabled bool   `json:"enabled"`
	Active  bool   `json:"active"`
}

func decode(t testing.TB, r response, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Result, v); err != nil {
		t.Fatalf("decoding result %s: %v", r.Result, err)
	}
}

func (w *wire) errorOf(t testing.TB, r response) errorResult {
	t.Helper()
	if r.Type != "error" {
		t.Fatalf("expected an error response, got %s", r.Raw)
	}
	var e errorResult
	decode(t, r, &e)
	return e
}

func (w *wire) change(t testing.TB, id string) change {
	t.Helper()
	r := w.do(t, "GET", "/v2/changes/"+id, nil)
	if r.StatusCode != 200 {
		t.Fatalf("GET /v2/changes/%s: %s", id, r.Raw)
	}
	var c change
	decode(t, r, &c)
	return c
}

// waitChange polls change id until it is ready (at most limit).
func (w *wire) waitChange(t testing.TB, id string, limit time.Duration) change {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		c := w.change(t, id)
		if c.Ready {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("change %s (%s) not ready after %v: status %s", id, c.Kind, limit, c.Status)
		}
		<-tick.C
	}
}

// apps returns the services of svcdemo keyed by app name.
func (w *wire) apps(t testing.TB, names string) map[string]appInfo {
	t.Helper()
	r := w.do(t, "GET", "/v2/apps?select=service&names="+names, nil)
	if r.StatusCode != 200 {
		t.Fatalf("GET /v2/apps: %s", r.Raw)
	}
	var list []appInfo
	decode(t, r, &list)
	m := map[string]appInfo{}
	for _, a := range list {
		m[a.Name] = a
	}
	return m
}

// serviceOp posts a service action and waits for its change; it fails the
// test unless the change ends with wantStatus.
func (w *wire) serviceOp(t testing.TB, action string, names []string, opts map[string]any, wantStatus string) change {
	t.Helper()
	r := w.postApps(t, action, names, opts)
	if r.StatusCode != 202 {
		t.Fatalf("POST /v2/apps %s %v: %s", action, names, r.Raw)
	}
	c := w.waitChange(t, r.Change, 2*time.Minute)
	if wantStatus != "" && c.Status != wantStatus {
		t.Fatalf("%s %v: change %s ended %s: %s", action, names, c.ID, c.Status, c.Err)
	}
	return c
}

func (w *wire) postApps(t testing.TB, action string, names []string, opts map[string]any) response {
	t.Helper()
	body := map[string]any{"action": action, "names": names}
	for k, v := range opts {
		body[k] = v
	}
	return w.do(t, "POST", "/v2/apps", body)
}

// setConf puts svcdemo's configuration; the configure hook runs (and sleeps
// hook-sleep seconds) in a configure-snap change, whose id is returned.
func (w *wire) setConf(t testing.TB, conf map[string]any) string {
	t.Helper()
	r := w.do(t, "PUT", "/v2/snaps/svcdemo/conf", conf)
	if r.StatusCode != 202 {
		t.Fatalf("PUT /v2/snaps/svcdemo/conf: %s", r.Raw)
	}
	return r.Change
}

// waitIdle waits until svcdemo has no change in progress (a test that fails
// midway must not leave its slow change in the way of the next test).
func (w *wire) waitIdle(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		r := w.do(t, "GET", "/v2/changes?select=in-progress", nil)
		var cs []change
		decode(t, r, &cs)
		busy := false
		for _, c := range cs {
			busy = busy || touchesSvcdemo(c)
		}
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("svcdemo changes still in progress after 2m: %s", r.Raw)
		}
		<-tick.C
	}
}

// touchesSvcdemo reports whether a change works on svcdemo (snapd's own
// background changes, such as a device-serial request that cannot reach
// the store, do not count).
func touchesSvcdemo(c change) bool {
	if strings.Contains(c.Summary, "svcdemo") {
		return true
	}
	for _, tk := range c.Tasks {
		if strings.Contains(tk.Summary, "svcdemo") {
			return true
		}
	}
	return false
}

// ensureBaseline brings svcdemo's services to a known state: alpha, beta, gamma
// enabled and active; slowstart and broken disabled and inactive.
func (w *wire) ensureBaseline(t testing.TB) {
	t.Helper()
	w.waitIdle(t)
	apps := w.apps(t, "svcdemo")
	var start, stop []string
	for _, n := range []string{"alpha", "beta", "gamma"} {
		if a := apps[n]; !a.Enabled || !a.Active {
			start = append(start, "svcdemo."+n)
		}
	}
	for _, n := range []string{"slowstart", "broken"} {
		if a := apps[n]; a.Enabled || a.Active {
			stop = append(stop, "svcdemo."+n)
		}
	}
	if len(start) > 0 {
		w.serviceOp(t, "start", start, map[string]any{"enable": true}, "Done")
	}
	if len(stop) > 0 {
		w.serviceOp(t, "stop", stop, map[string]any{"disable": true}, "")
	}
}

func mustContain(t testing.TB, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Errorf("%s: %q does not contain %q", what, got, want)
	}
}

func conflictMessage(kind string) string {
	return fmt.Sprintf("snap %q has %q change in progress", "svcdemo", kind)
}
