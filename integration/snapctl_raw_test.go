//go:build realsnapd

package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// snapctlResult is the result of a successful POST /v2/snapctl.
type snapctlResult struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
}

func (w *wire) snapctl(t testing.TB, cookie string, args ...string) response {
	t.Helper()
	return w.do(t, "POST", "/v2/snapctl", map[string]any{"context-id": cookie, "args": args})
}

// snapctlPrefix is what snapd puts before a snapctl error's message.
func (e env) snapctlPrefix() string {
	if versionAtLeast(e.Version, 2, 70) {
		return "snapctl: "
	}
	return "error running snapctl: "
}

// versionAtLeast compares a snapd version such as "2.57.6-1+deb12u1+b2"
// with major.minor.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(strings.FieldsFunc(v, func(r rune) bool { return r == '-' || r == '+' || r == '~' })[0], ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, _ := strconv.Atoi(parts[0])
	mi, _ := strconv.Atoi(parts[1])
	return ma > major || (ma == major && mi >= minor)
}

func TestRawSnapctl(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	ctl := newWire(t, e.SnapSocket)
	cookie := e.cookie(t)
	w.ensureBaseline(t)

	r := ctl.snapctl(t, cookie, "services", "svcdemo.alpha")
	if r.StatusCode != 200 {
		t.Fatalf("snapctl services: %s", r.Raw)
	}
	var out snapctlResult
	decode(t, r, &out)
	mustContain(t, "snapctl services", out.Stdout, "svcdemo.alpha")

	r = ctl.snapctl(t, cookie, "restart", "svcdemo.beta")
	if r.StatusCode != 200 {
		t.Fatalf("snapctl restart: %s", r.Raw)
	}

	// The main socket refuses snapctl, the snap socket refuses /v2/apps.
	if r := w.snapctl(t, cookie, "services"); r.StatusCode != 403 || w.errorOf(t, r).Kind != "login-required" {
		t.Errorf("snapctl on the main socket: want 403 login-required, got %s", r.Raw)
	}
	if r := ctl.postApps(t, "restart", []string{"svcdemo.alpha"}, nil); r.StatusCode != 403 {
		t.Errorf("POST /v2/apps on the snap socket: want 403, got %s", r.Raw)
	}
	if r := ctl.snapctl(t, "bogus", "services"); r.StatusCode != 400 {
		t.Errorf("snapctl with a bad cookie: want 400, got %s", r.Raw)
	}
}

// snapctl service commands return only once their change is ready, and a
// conflict comes back as a 400 whose message carries snapctl's prefix.
func TestRawSnapctlConflict(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	ctl := newWire(t, e.SnapSocket)
	cookie := e.cookie(t)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })

	r := w.postApps(t, "stop", []string{"svcdemo.gamma"}, nil)
	if r.StatusCode != 202 {
		t.Fatalf("stop gamma: %s", r.Raw)
	}
	c := ctl.snapctl(t, cookie, "restart", "svcdemo.alpha")
	if c.StatusCode != 400 {
		t.Fatalf("snapctl restart during a slow stop: want 400, got %s", c.Raw)
	}
	er := w.errorOf(t, c)
	if want := e.snapctlPrefix() + conflictMessage("service-control"); er.Message != want || er.Kind != "" {
		t.Errorf("snapctl conflict: got kind %q message %q, want no kind and %q", er.Kind, er.Message, want)
	}
	w.waitChange(t, r.Change, e.Slow+time.Minute)
	w.ensureBaseline(t)

	// A slow stop through snapctl blocks the request for the whole stop.
	begin := time.Now()
	s := ctl.snapctl(t, cookie, "stop", "svcdemo.gamma")
	took := time.Since(begin)
	if s.StatusCode != 200 {
		t.Fatalf("snapctl stop gamma: %s", s.Raw)
	}
	if took < e.Slow-time.Second {
		t.Errorf("snapctl stop of gamma returned after %v, before its %v stop could end", took, e.Slow)
	}
	if a := w.apps(t, "svcdemo.gamma")["gamma"]; a.Active || !a.Enabled {
		t.Errorf("after snapctl stop: gamma %+v, want enabled and inactive", a)
	}
}
