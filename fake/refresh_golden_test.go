package fake_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/conformance"
)

// svcdemoRefresh is the integration suite's svcdemo as the refresh
// captures had it (SNAPSVC_SLOW_SECONDS=3, hook-sleep 0).
func svcdemoRefresh() fake.Snap {
	slow := 3 * time.Second
	return fake.Snap{Name: "svcdemo", Hooks: []string{"configure"}, ConfigureHookSleepKey: "hook-sleep",
		Config: map[string]any{"hook-sleep": "0"},
		Apps: []fake.App{
			{Name: "alpha", Daemon: "simple", Enabled: true, Active: true},
			{Name: "beta", Daemon: "simple", Enabled: true, Active: true},
			{Name: "broken", Daemon: "oneshot", FailStart: fake.SystemctlJobFailed("svcdemo", "broken")},
			{Name: "ctl"},
			{Name: "gamma", Daemon: "simple", Enabled: true, Active: true, StopDuration: slow},
			{Name: "helper"},
			{Name: "slowstart", Daemon: "forking", StartDuration: slow},
		}}
}

// refreshGolden replays the integration suite's TestRawRefreshWire on the
// fake and compares each body with the one real snapd answered
// (testdata/refresh/VERSION, captured by that test).
type refreshGolden struct {
	t   *testing.T
	s   *fake.Server
	dir string
}

var localInstallRe = regexp.MustCompile(`\.local-install-[0-9]+`)

// normalise makes a body comparable: the temporary file of a local install
// has a random name; with doing, task statuses, logs and progress (which
// depend on when the body was read) are dropped.
func normalise(t *testing.T, b []byte, doing bool) []byte {
	t.Helper()
	b = localInstallRe.ReplaceAll(b, []byte(".local-install-N"))
	if !doing {
		return b
	}
	var env map[string]any
	if err := json.Unmarshal(b, &env); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	res := env["result"].(map[string]any)
	res["status"] = "?"
	for _, tk := range res["tasks"].([]any) {
		m := tk.(map[string]any)
		m["status"] = "?"
		delete(m, "log")
		delete(m, "progress")
		delete(m, "ready-time")
	}
	out, _ := json.Marshal(env)
	return out
}

func (g *refreshGolden) check(name string, code int, body []byte) {
	g.checkAs(name, code, body, false)
}

func (g *refreshGolden) checkAs(name string, code int, body []byte, doing bool) {
	g.t.Helper()
	want, err := os.ReadFile(filepath.Join(g.dir, name+".json"))
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
	if d := conformance.Compare(normalise(g.t, want, doing), normalise(g.t, body, doing)); len(d) > 0 {
		g.t.Errorf("%s differs from snapd %s:\n  %s\n  got: %s", name, g.s.Version(), strings.Join(d, "\n  "), body)
	}
}

func (g *refreshGolden) do(method, path, body string) (int, []byte) {
	g.t.Helper()
	code, b, err := conformance.Do(context.Background(), g.s.SocketPath(), method, path, body)
	if err != nil {
		g.t.Fatalf("%s %s: %v", method, path, err)
	}
	return code, b
}

func (g *refreshGolden) post(name, path, body string) (int, []byte) {
	g.t.Helper()
	code, b := g.do("POST", path, body)
	g.check(name, code, b)
	return code, b
}

// sideload posts a file as `snap install --dangerous` does.
func sideload(t *testing.T, sock, filename string, content []byte) (int, []byte) {
	t.Helper()
	return sideloadForm(t, sock, filename, content, true)
}

// sideloadForm posts a file as `snap install [--dangerous]` does.
func sideloadForm(t *testing.T, sock, filename string, content []byte, dangerous bool) (int, []byte) {
	t.Helper()
	var fields [][2]string
	if dangerous {
		fields = append(fields, [2]string{"dangerous", "true"})
	}
	return postSnapForm(t, sock, fields, filename, content)
}

// postSnapForm posts fields, in order, then content as the "snap" file
// part named filename, to POST /v2/snaps.
func postSnapForm(t *testing.T, sock string, fields [][2]string, filename string, content []byte) (int, []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range fields {
		mw.WriteField(f[0], f[1])
	}
	fw, _ := mw.CreateFormFile("snap", filename)
	fw.Write(content)
	mw.Close()
	req, _ := http.NewRequest("POST", "http://localhost/v2/snaps", &buf)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	rsp, err := client(sock).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer rsp.Body.Close()
	b, _ := io.ReadAll(rsp.Body)
	return rsp.StatusCode, b
}

type snapRead struct {
	Version  string     `json:"version"`
	Revision string     `json:"revision"`
	Hold     *time.Time `json:"hold"`
}

func (g *refreshGolden) snap() snapRead {
	g.t.Helper()
	_, b := g.do("GET", "/v2/snaps/svcdemo", "")
	var env struct{ Result snapRead }
	if err := json.Unmarshal(b, &env); err != nil {
		g.t.Fatal(err)
	}
	return env.Result
}

func TestRefreshGolden(t *testing.T) {
	for _, v := range []fake.Version{fake.Version257, fake.Version268, fake.Version277} {
		t.Run(string(v), func(t *testing.T) {
			clk := fake.NewManualClock(t0)
			s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(svcdemoRefresh()), fake.WithClock(clk), fake.WithVersion(v))
			g := &refreshGolden{t: t, s: s, dir: filepath.Join("testdata", "refresh", string(v))}
			replayRefreshCapture(t, g, clk)
		})
	}
}

func replayRefreshCapture(t *testing.T, g *refreshGolden, clk *fake.ManualClock) {
	ctx := context.Background()
	s := g.s
	hold := s.Version() != fake.Version257
	v2 := append([]byte("hsqs"), make([]byte, 60)...) // a squashfs to the fake: name and version from the file name
	const snapPath = "/v2/snaps/svcdemo"
	if sn := g.snap(); sn.Version != "1" || sn.Revision != "x1" {
		t.Fatalf("svcdemo before: %+v", sn)
	}

	g.post("refresh-local", snapPath, `{"action":"refresh"}`)
	g.post("refresh-local-channel", snapPath, `{"action":"refresh","channel":"beta"}`)
	g.post("refresh-unknown-snap", "/v2/snaps/nosuchsnap", `{"action":"refresh"}`)
	g.post("refresh-unknown-revision", snapPath, `{"action":"refresh","revision":"x99"}`)
	g.post("refresh-bad-json", snapPath, `{`)

	_, b := g.post("hold-forever-general", snapPath, `{"action":"hold","time":"forever","hold-level":"general"}`)
	if !hold {
		g.post("unhold", snapPath, `{"action":"unhold"}`)
		g.post("hold-no-fields", snapPath, `{"action":"hold"}`)
		if sn := g.snap(); sn.Hold != nil {
			t.Errorf("2.57 snap has a hold: %v", sn.Hold)
		}
	} else {
		code, b := g.do("GET", "/v2/changes/"+changeID(t, b), "")
		g.check("change-hold-forever", code, b)
		if sn := g.snap(); sn.Hold == nil || sn.Hold.Before(clk.Now().Add(100*365*24*time.Hour)) {
			t.Errorf("held forever: read back %v", sn.Hold)
		}
		until := clk.Now().Add(time.Hour).UTC().Truncate(time.Second)
		_, b = g.post("hold-auto-refresh-until", snapPath, `{"action":"hold","time":"`+until.Format(time.RFC3339)+`","hold-level":"auto-refresh"}`)
		code, b = g.do("GET", "/v2/changes/"+changeID(t, b), "")
		g.check("change-hold-auto-refresh", code, b)
		if sn := g.snap(); sn.Hold == nil || !sn.Hold.Equal(until) {
			t.Errorf("held until %v: read back %v", until, sn.Hold)
		}
		if _, level := s.Hold("svcdemo"); level != "auto-refresh" {
			t.Errorf("hold level %q", level)
		}
		for name, body := range map[string]string{
			"hold-no-time":            `{"action":"hold","hold-level":"general"}`,
			"hold-bad-time":           `{"action":"hold","time":"tomorrow","hold-level":"general"}`,
			"hold-no-level":           `{"action":"hold","time":"forever"}`,
			"hold-bad-level":          `{"action":"hold","time":"forever","hold-level":"everything"}`,
			"unhold-with-time":        `{"action":"unhold","time":"forever"}`,
			"refresh-with-hold-level": `{"action":"refresh","hold-level":"general"}`,
		} {
			g.post(name, snapPath, body)
		}
		g.post("hold-unknown-snap", "/v2/snaps/nosuchsnap", `{"action":"hold","time":"forever","hold-level":"general"}`)
		_, b = g.post("unhold", snapPath, `{"action":"unhold"}`)
		code, b = g.do("GET", "/v2/changes/"+changeID(t, b), "")
		g.check("change-unhold", code, b)
		if sn := g.snap(); sn.Hold != nil {
			t.Errorf("unheld: read back %v", sn.Hold)
		}
		g.post("unhold-unknown-snap", "/v2/snaps/nosuchsnap", `{"action":"unhold"}`)
		g.post("unhold-again", snapPath, `{"action":"unhold"}`)
	}

	// conflicts with gamma's slow stop
	_, b = g.do("POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
	stop := changeID(t, b)
	code, b := sideload(t, s.SocketPath(), "svcdemo_2_amd64.snap", v2)
	g.check("sideload-during-stop", code, b)
	g.post("refresh-during-stop", snapPath, `{"action":"refresh"}`)
	g.post("refresh-revision-during-stop", snapPath, `{"action":"refresh","revision":"x1"}`)
	if hold {
		g.post("hold-during-stop", snapPath, `{"action":"hold","time":"forever","hold-level":"general"}`)
	}
	s.AdvanceUntilReady(ctx, stop)
	_, b = g.do("POST", "/v2/apps", `{"action":"start","names":["svcdemo.gamma"]}`)
	s.AdvanceUntilReady(ctx, changeID(t, b))

	// the second revision over the first
	code, b = sideload(t, s.SocketPath(), "svcdemo_2_amd64.snap", v2)
	g.check("sideload-v2", code, b)
	inst := changeID(t, b)
	code, b = g.do("GET", "/v2/changes/"+inst, "")
	g.checkAs("change-sideload-doing", code, b, true)
	g.post("apps-during-sideload", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	code, b = g.do("PUT", "/v2/snaps/svcdemo/conf", `{"k":"v"}`)
	g.check("conf-during-sideload", code, b)
	g.post("refresh-during-sideload", snapPath, `{"action":"refresh","revision":"x1"}`)
	code, b = sideload(t, s.SocketPath(), "svcdemo_2_amd64.snap", v2)
	g.check("sideload-during-sideload", code, b)
	if hold {
		g.post("unhold-during-sideload", snapPath, `{"action":"unhold"}`)
	}
	s.AdvanceUntilReady(ctx, inst)
	code, b = g.do("GET", "/v2/changes/"+inst, "")
	g.check("change-sideload-done", code, b)
	if sn := g.snap(); sn.Version != "2" || sn.Revision != "x2" {
		t.Errorf("after the install: %+v", sn)
	}
	code, b = g.do("GET", "/v2/apps?names=svcdemo&select=service", "")
	g.check("apps-after-sideload", code, b)

	// back to x1: a refresh to the retained revision
	_, b = g.do("POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
	stop = changeID(t, b)
	g.post("refresh-revision-conflict", snapPath, `{"action":"refresh","revision":"x1"}`)
	s.AdvanceUntilReady(ctx, stop)
	_, b = g.do("POST", "/v2/apps", `{"action":"start","names":["svcdemo.gamma"]}`)
	s.AdvanceUntilReady(ctx, changeID(t, b))
	_, b = g.post("refresh-revision", snapPath, `{"action":"refresh","revision":"x1"}`)
	ref := changeID(t, b)
	code, b = g.do("GET", "/v2/changes/"+ref, "")
	g.checkAs("change-refresh-doing", code, b, true)
	g.post("apps-during-refresh", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	code, b = sideload(t, s.SocketPath(), "svcdemo_2_amd64.snap", v2)
	g.check("sideload-during-refresh", code, b)
	s.AdvanceUntilReady(ctx, ref)
	code, b = g.do("GET", "/v2/changes/"+ref, "")
	g.check("change-refresh-done", code, b)
	if sn := g.snap(); sn.Version != "1" || sn.Revision != "x1" {
		t.Errorf("at the end: %+v", sn)
	}
	if hold {
		g.post("unhold-end", snapPath, `{"action":"unhold"}`)
	}
}
