//go:build realsnapd

package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The refresh wire on real snapd: refresh (svcdemo is a local snap and
// there is no store, so what snapd answers a store refresh, and a local
// amend to a retained revision), the second revision installed over the
// first as `snap install --dangerous` does while a service-control change
// runs, conflicts both ways, and hold/unhold read back from GET
// /v2/snaps/svcdemo (2.58+; 2.57.6 has no such action). Every body is
// recorded (refreshRecorder) for the fake's conformance tests
// (fake/testdata/refresh-VERSION). docs/refresh-wire.md says what each
// shows.

// refreshRecorder writes raw bodies to the logs directory:
// refresh-responses/NAME.json and a cases.tsv (name, method, path, HTTP).
type refreshRecorder struct {
	t   *testing.T
	dir string
}

func newRefreshRecorder(t *testing.T) *refreshRecorder {
	r := &refreshRecorder{t: t}
	if c := os.Getenv("SNAPSVC_REALSNAPD_CAPTURE"); c != "" {
		r.dir = filepath.Join(filepath.Dir(c), "refresh-responses")
		if err := os.MkdirAll(r.dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func (r *refreshRecorder) keep(name, method, path string, rsp response) response {
	r.t.Helper()
	r.t.Logf("%s: %s %s -> %d %s", name, method, path, rsp.HTTPStatus, rsp.Raw)
	if r.dir == "" {
		return rsp
	}
	if err := os.WriteFile(filepath.Join(r.dir, name+".json"), append(append([]byte(nil), rsp.Raw...), '\n'), 0o644); err != nil {
		r.t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(r.dir, "cases.tsv"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "%s\t%s\t%s\t%d\n", name, method, path, rsp.HTTPStatus)
	return rsp
}

// do sends and records one request.
func (r *refreshRecorder) do(w *wire, name, method, path string, body any) response {
	r.t.Helper()
	return r.keep(name, method, path, w.do(r.t, method, path, body))
}

// sideload posts a snap file as `snap install --dangerous FILE` does:
// multipart/form-data with the file in "snap" and dangerous=true.
func (w *wire) sideload(t testing.TB, file string) response {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("reading the snap to install: %v", err)
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if err := mw.WriteField("dangerous", "true"); err != nil {
		t.Fatal(err)
	}
	fw, err := mw.CreateFormFile("snap", filepath.Base(file))
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(data)
	mw.Close()
	req, err := http.NewRequest("POST", "http://localhost/v2/snaps", &buf)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	res, err := w.hc.Do(req)
	if err != nil {
		t.Fatalf("POST /v2/snaps (multipart): %v", err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	var r response
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("POST /v2/snaps (multipart): %d %s", res.StatusCode, raw)
	}
	r.Raw, r.HTTPStatus = raw, res.StatusCode
	return r
}

// snapInfo is the part of GET /v2/snaps/NAME these tests read.
type snapInfo struct {
	Version  string     `json:"version"`
	Revision string     `json:"revision"`
	Hold     *time.Time `json:"hold"`
}

func (w *wire) snapInfo(t testing.TB, r response) snapInfo {
	t.Helper()
	if r.StatusCode != 200 {
		t.Fatalf("GET /v2/snaps/svcdemo: %s", r.Raw)
	}
	var s snapInfo
	decode(t, r, &s)
	return s
}

func wantError(t testing.TB, what string, r response, status int, kind, message string) {
	t.Helper()
	if r.HTTPStatus != status || r.Type != "error" {
		t.Errorf("%s: HTTP %d %s, want an error %d: %s", what, r.HTTPStatus, r.Type, status, r.Raw)
		return
	}
	var e errorResult
	if err := json.Unmarshal(r.Result, &e); err != nil {
		t.Fatal(err)
	}
	if e.Kind != kind || (message != "" && e.Message != message) {
		t.Errorf("%s: kind %q message %q, want kind %q message %q", what, e.Kind, e.Message, kind, message)
	}
}

func hasTask(c change, kind string) bool {
	for _, tk := range c.Tasks {
		if tk.Kind == kind {
			return true
		}
	}
	return false
}

// startSlowStop stops gamma (its stop takes SLOW_SECONDS): a
// service-control change in Doing for that long. It returns the change id.
func startSlowStop(t *testing.T, w *wire) string {
	t.Helper()
	r := w.postApps(t, "stop", []string{"svcdemo.gamma"}, nil)
	if r.StatusCode != 202 {
		t.Fatalf("stop gamma: %s", r.Raw)
	}
	return r.Change
}

func TestRawRefreshWire(t *testing.T) {
	e := loadEnv(t)
	v2 := os.Getenv("SNAPSVC_REALSNAPD_SVCDEMO2")
	if v2 == "" {
		t.Skip("SNAPSVC_REALSNAPD_SVCDEMO2 not set: run through integration/run.sh")
	}
	w := newWire(t, e.Socket)
	rec := newRefreshRecorder(t)
	hasHold := versionAtLeast(e.Version, 2, 58)
	w.ensureBaseline(t)
	// The install's configure hook must neither sleep nor restart.
	w.waitChange(t, w.setConf(t, map[string]any{"hook-sleep": "0", "hook-restart": nil}), time.Minute)
	before := w.snapInfo(t, rec.do(w, "snap-before", "GET", "/v2/snaps/svcdemo", nil))
	t.Logf("svcdemo before: version %s revision %s", before.Version, before.Revision)
	t.Cleanup(func() {
		// Whatever happened, leave no hold and the services as found.
		if hasHold {
			w.doErr("POST", "/v2/snaps/svcdemo", map[string]any{"action": "unhold"})
		}
	})

	// ---- refresh of a local snap with no store
	r := rec.do(w, "refresh-local", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "refresh"})
	rc := rec.do(w, "refresh-local-channel", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "refresh", "channel": "beta"})
	ru := rec.do(w, "refresh-unknown-snap", "POST", "/v2/snaps/nosuchsnap", map[string]any{"action": "refresh"})
	rv := rec.do(w, "refresh-unknown-revision", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "refresh", "revision": "x99"})
	rb := rec.do(w, "refresh-bad-json", "POST", "/v2/snaps/svcdemo", "{")
	for what, r := range map[string]response{"refresh": r, "refresh --channel": rc, "refresh --revision x99": rv} {
		wantError(t, what+" of a local snap", r, 400, "snap-local", "cannot perform operation on local snap")
	}
	if versionAtLeast(e.Version, 2, 68) {
		// a value NotInstalledError: errToResponse's pointer case misses it
		wantError(t, "refresh of an unknown snap", ru, 400, "", `cannot refresh "nosuchsnap": snap "nosuchsnap" is not installed`)
	} else {
		wantError(t, "refresh of an unknown snap", ru, 400, "snap-not-installed", `snap "nosuchsnap" is not installed`)
	}
	wantError(t, "refresh with bad JSON", rb, 400, "", "cannot decode request body into snap instruction: unexpected EOF")

	// ---- hold and unhold
	r = rec.do(w, "hold-forever-general", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "hold", "time": "forever", "hold-level": "general"})
	if !hasHold {
		wantError(t, "hold on "+e.Version, r, 400, "", "unknown action hold")
		wantError(t, "unhold on "+e.Version, rec.do(w, "unhold", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "unhold"}), 400, "", "unknown action unhold")
		wantError(t, "hold without fields on "+e.Version, rec.do(w, "hold-no-fields", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "hold"}), 400, "", "unknown action hold")
		if s := w.snapInfo(t, rec.do(w, "snap-after-hold", "GET", "/v2/snaps/svcdemo", nil)); s.Hold != nil {
			t.Errorf("2.57 snap info has a hold: %v", s.Hold)
		}
	} else {
		if r.StatusCode != 202 {
			t.Fatalf("hold: %s", r.Raw)
		}
		c := w.change(t, r.Change)
		rec.do(w, "change-hold-forever", "GET", "/v2/changes/"+r.Change, nil)
		if c.Kind != "hold-snap" || c.Status != "Done" || !c.Ready || len(c.Tasks) != 0 || c.Summary != `Hold general refreshes for "svcdemo"` {
			t.Errorf("hold change: %+v", c)
		}
		s := w.snapInfo(t, rec.do(w, "snap-held-forever", "GET", "/v2/snaps/svcdemo", nil))
		if s.Hold == nil || s.Hold.Before(time.Now().Add(100*365*24*time.Hour)) {
			t.Errorf("held forever, read back %v", s.Hold)
		}
		until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
		r = rec.do(w, "hold-auto-refresh-until", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "hold", "time": until.Format(time.RFC3339), "hold-level": "auto-refresh"})
		if r.StatusCode != 202 {
			t.Fatalf("hold until: %s", r.Raw)
		}
		c = w.change(t, r.Change)
		rec.do(w, "change-hold-auto-refresh", "GET", "/v2/changes/"+r.Change, nil)
		if c.Summary != `Hold auto-refreshes for "svcdemo"` || c.Status != "Done" {
			t.Errorf("hold auto-refresh change: %+v", c)
		}
		s = w.snapInfo(t, rec.do(w, "snap-held-until", "GET", "/v2/snaps/svcdemo", nil))
		if s.Hold == nil || s.Hold.Sub(until).Abs() > 2*time.Second {
			t.Errorf("held until %v, read back %v", until, s.Hold)
		}
		for _, b := range []struct {
			name string
			body map[string]any
			msg  string
		}{
			{"hold-no-time", map[string]any{"action": "hold", "hold-level": "general"}, "hold action requires a non-empty time value"},
			{"hold-bad-time", map[string]any{"action": "hold", "time": "tomorrow", "hold-level": "general"}, ""},
			{"hold-no-level", map[string]any{"action": "hold", "time": "forever"}, "hold action requires a non-empty hold-level value"},
			{"hold-bad-level", map[string]any{"action": "hold", "time": "forever", "hold-level": "everything"}, `hold action requires hold-level to be either "auto-refresh" or "general"`},
			{"unhold-with-time", map[string]any{"action": "unhold", "time": "forever"}, `time can only be specified for the "hold" action`},
			{"refresh-with-hold-level", map[string]any{"action": "refresh", "hold-level": "general"}, `hold-level can only be specified for the "hold" action`},
		} {
			wantError(t, b.name, rec.do(w, b.name, "POST", "/v2/snaps/svcdemo", b.body), 400, "", b.msg)
		}
		wantError(t, "hold of an unknown snap", rec.do(w, "hold-unknown-snap", "POST", "/v2/snaps/nosuchsnap", map[string]any{"action": "hold", "time": "forever", "hold-level": "general"}),
			400, "", `cannot hold "nosuchsnap": snap "nosuchsnap" is not installed`) // a value NotInstalledError: errToResponse's pointer case misses it
		r = rec.do(w, "unhold", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "unhold"})
		if r.StatusCode != 202 {
			t.Fatalf("unhold: %s", r.Raw)
		}
		c = w.change(t, r.Change)
		rec.do(w, "change-unhold", "GET", "/v2/changes/"+r.Change, nil)
		if c.Kind != "unhold-snap" || c.Status != "Done" || c.Summary != `Remove refresh hold on "svcdemo"` {
			t.Errorf("unhold change: %+v", c)
		}
		if s := w.snapInfo(t, rec.do(w, "snap-unheld", "GET", "/v2/snaps/svcdemo", nil)); s.Hold != nil {
			t.Errorf("unheld, read back hold %v", s.Hold)
		}
		rec.do(w, "unhold-unknown-snap", "POST", "/v2/snaps/nosuchsnap", map[string]any{"action": "unhold"})
		rec.do(w, "unhold-again", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "unhold"})
	}

	// ---- conflicts with a running service-control change (gamma's slow stop)
	stop := startSlowStop(t, w)
	r = rec.keep("sideload-during-stop", "POST", "/v2/snaps (multipart)", w.sideload(t, v2))
	wantError(t, "sideload during a service-control change", r, 409, "snap-change-conflict", conflictMessage("service-control"))
	rec.do(w, "refresh-during-stop", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "refresh"})
	rec.do(w, "refresh-revision-during-stop", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "refresh", "revision": before.Revision})
	if hasHold {
		r = rec.do(w, "hold-during-stop", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "hold", "time": "forever", "hold-level": "general"})
		if r.StatusCode != 202 {
			t.Errorf("hold during a service-control change: %s", r.Raw)
		}
	}
	if c := w.change(t, stop); c.Ready {
		t.Fatalf("gamma's stop (change %s) ended before the conflicts were read: make SNAPSVC_SLOW_SECONDS longer", stop)
	}
	w.waitChange(t, stop, 2*time.Minute)
	w.serviceOp(t, "start", []string{"svcdemo.gamma"}, nil, "Done")

	// ---- the second revision installed over the first (held: a hold does not stop it)
	r = rec.keep("sideload-v2", "POST", "/v2/snaps (multipart)", w.sideload(t, v2))
	if r.StatusCode != 202 {
		t.Fatalf("sideload of version 2: %s", r.Raw)
	}
	inst := r.Change
	rec.do(w, "change-sideload-doing", "GET", "/v2/changes/"+inst, nil)
	// stop-snap-services waits for gamma's slow stop: the change is in progress for seconds.
	ra := rec.do(w, "apps-during-sideload", "POST", "/v2/apps", map[string]any{"action": "restart", "names": []string{"svcdemo.alpha"}})
	rc = rec.do(w, "conf-during-sideload", "PUT", "/v2/snaps/svcdemo/conf", map[string]any{"k": "v"})
	rr := rec.do(w, "refresh-during-sideload", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "refresh", "revision": before.Revision})
	rs := rec.keep("sideload-during-sideload", "POST", "/v2/snaps (multipart)", w.sideload(t, v2))
	if hasHold {
		rec.do(w, "unhold-during-sideload", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "unhold"})
	}
	if c := w.change(t, inst); c.Ready {
		t.Fatalf("the install (change %s) ended before the conflicts were read", inst)
	}
	wantError(t, "POST /v2/apps during install-snap", ra, 400, "", conflictMessage("install-snap"))
	wantError(t, "PUT conf during install-snap", rc, 409, "snap-change-conflict", conflictMessage("install-snap"))
	wantError(t, "refresh during install-snap", rr, 409, "snap-change-conflict", conflictMessage("install-snap"))
	wantError(t, "sideload during install-snap", rs, 409, "snap-change-conflict", conflictMessage("install-snap"))
	c := w.waitChange(t, inst, 3*time.Minute)
	rec.do(w, "change-sideload-done", "GET", "/v2/changes/"+inst, nil)
	if c.Kind != "install-snap" || c.Status != "Done" || !hasTask(c, "stop-snap-services") || !hasTask(c, "start-snap-services") {
		t.Errorf("install of version 2: %s %s, tasks %+v", c.Kind, c.Status, c.Tasks)
	}
	mustContain(t, "install summary", c.Summary, `Install "svcdemo" snap from file "svcdemo_2_`)
	after := w.snapInfo(t, rec.do(w, "snap-after-sideload", "GET", "/v2/snaps/svcdemo", nil))
	if after.Version != "2" || after.Revision == before.Revision {
		t.Errorf("after the install: version %s revision %s (before %s %s)", after.Version, after.Revision, before.Version, before.Revision)
	}
	rec.do(w, "apps-after-sideload", "GET", "/v2/apps?names=svcdemo&select=service", nil)
	apps := w.apps(t, "svcdemo")
	for _, n := range []string{"alpha", "beta", "gamma"} {
		if !apps[n].Active || !apps[n].Enabled {
			t.Errorf("after the install %s is %+v", n, apps[n])
		}
	}
	for _, n := range []string{"slowstart", "broken"} {
		if apps[n].Active || apps[n].Enabled {
			t.Errorf("after the install %s is %+v (was disabled)", n, apps[n])
		}
	}

	// ---- back to the first revision: a refresh to a retained local revision
	stop = startSlowStop(t, w)
	rec.do(w, "refresh-revision-conflict", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "refresh", "revision": before.Revision})
	w.waitChange(t, stop, 2*time.Minute)
	w.serviceOp(t, "start", []string{"svcdemo.gamma"}, nil, "Done")
	r = rec.do(w, "refresh-revision", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "refresh", "revision": before.Revision})
	if r.StatusCode == 202 {
		rec.do(w, "change-refresh-doing", "GET", "/v2/changes/"+r.Change, nil)
		ra := rec.do(w, "apps-during-refresh", "POST", "/v2/apps", map[string]any{"action": "restart", "names": []string{"svcdemo.alpha"}})
		rs := rec.keep("sideload-during-refresh", "POST", "/v2/snaps (multipart)", w.sideload(t, v2))
		if c := w.change(t, r.Change); !c.Ready {
			wantError(t, "POST /v2/apps during refresh-snap", ra, 400, "", conflictMessage("refresh-snap"))
			wantError(t, "sideload during refresh-snap", rs, 409, "snap-change-conflict", conflictMessage("refresh-snap"))
		}
		c := w.waitChange(t, r.Change, 3*time.Minute)
		rec.do(w, "change-refresh-done", "GET", "/v2/changes/"+r.Change, nil)
		if c.Kind != "refresh-snap" || c.Status != "Done" || !hasTask(c, "stop-snap-services") || !hasTask(c, "start-snap-services") {
			t.Errorf("refresh to %s: %s %s, tasks %+v", before.Revision, c.Kind, c.Status, c.Tasks)
		}
		rec.do(w, "changes-svcdemo", "GET", "/v2/changes?for=svcdemo&select=all", nil)
	} else {
		t.Logf("snapd %s refuses a refresh to the retained revision %s: %s", e.Version, before.Revision, r.Raw)
		// Put version 1 back the way it came.
		r = w.sideload(t, os.Getenv("SNAPSVC_REALSNAPD_SVCDEMO1"))
		if r.StatusCode != 202 {
			t.Fatalf("reinstalling version 1: %s", r.Raw)
		}
		w.waitChange(t, r.Change, 3*time.Minute)
	}
	end := w.snapInfo(t, rec.do(w, "snap-end", "GET", "/v2/snaps/svcdemo", nil))
	if end.Version != "1" {
		t.Errorf("svcdemo ends at version %s revision %s", end.Version, end.Revision)
	}
	if hasHold {
		rec.do(w, "unhold-end", "POST", "/v2/snaps/svcdemo", map[string]any{"action": "unhold"})
	}
	w.ensureBaseline(t)
	if !strings.HasPrefix(e.Version, "2.") {
		t.Errorf("snapd version %q", e.Version)
	}
}
