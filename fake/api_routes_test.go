package fake_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/conformance"
)

func TestSnapsList(t *testing.T) {
	k8s, err := fake.SnapFromDir(filepath.Join("testdata", "k8s"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		v                  fake.Version
		links, grade, badQ string
	}{
		// links: absent in 2.57.6, "links,omitempy" (always there) in
		// 2.62..2.68, omitempty from 2.69; grade from 2.77 (client/packages.go)
		{fake.Version257, "", "", `invalid select parameter: "bogus"`},
		{fake.Version268, "null", "", `invalid select parameter: '\x00'`},
		{fake.Version277, "", `"stable"`, `invalid select parameter: '\x00'`},
	} {
		t.Run(string(tc.v), func(t *testing.T) {
			s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(tc.v), fake.WithClock(fake.NewManualClock(t0)), fake.WithSnaps(k8s, demo()))
			code, e := call(t, s.SocketPath(), "GET", "/v2/snaps", "")
			var raw struct {
				Sources []string `json:"sources"`
			}
			if code != 200 || e.Type != "sync" {
				t.Fatalf("%d %+v", code, e)
			}
			var list []map[string]json.RawMessage
			decode(t, e.Result, &list)
			if len(list) != 2 || string(list[0]["name"]) != `"k8s"` || string(list[1]["name"]) != `"svcdemo"` {
				t.Fatalf("list: %s", e.Result)
			}
			_, b := do(t, s.SocketPath(), "GET", "/v2/snaps", "")
			json.Unmarshal(b, &raw)
			if len(raw.Sources) != 1 || raw.Sources[0] != "local" {
				t.Errorf("sources: %s", b)
			}
			m := list[0]
			for k, want := range map[string]string{
				"id": `""`, "name": `"k8s"`, "version": `"v1.32.2"`, "revision": `"x1"`, "status": `"active"`,
				"type": `"app"`, "base": `"core22"`, "confinement": `"classic"`, "developer": `""`, "channel": `""`,
				"contact": `""`, "private": "false", "devmode": "false", "jailmode": "false", "ignore-validation": "false",
				"license": `"GPL-3.0"`, "mounted-from": `"/var/lib/snapd/snaps/k8s_x1.snap"`, "installed-size": "4096",
				"summary": `"Kubernetes-like snap for the fake snapd"`, "install-date": `"2026-12-02T14:00:00Z"`,
			} {
				if string(m[k]) != want {
					t.Errorf("%s = %s, want %s", k, m[k], want)
				}
			}
			for k, want := range map[string]string{"links": tc.links, "grade": tc.grade} {
				if string(m[k]) != want {
					t.Errorf("%s = %q, want %q", k, m[k], want)
				}
			}
			for _, k := range []string{"publisher", "tracking-channel", "health", "title"} {
				if _, ok := m[k]; ok {
					t.Errorf("a sideloaded snap has no %q", k)
				}
			}
			var apps []map[string]any
			decode(t, m["apps"], &apps)
			if len(apps) != 10 || apps[0]["name"] != "containerd" || apps[0]["daemon"] != "notify" || apps[0]["snap"] != "k8s" {
				t.Errorf("apps: %s", m["apps"])
			}
			for _, a := range apps {
				if a["name"] == "k8sd" && (a["enabled"] != true || a["active"] != true) {
					t.Errorf("k8sd: %v", a)
				}
				if a["name"] == "kubelet" && (a["enabled"] != nil || a["active"] != nil) {
					t.Errorf("kubelet (install-mode: disable): %v", a)
				}
				if a["name"] == "k8s" && len(a) != 2 {
					t.Errorf("plain app: %v", a)
				}
			}

			k8sApps := string(m["apps"])
			code, e = call(t, s.SocketPath(), "GET", "/v2/snaps?snaps=svcdemo", "")
			list = nil
			if decode(t, e.Result, &list); code != 200 || len(list) != 1 || string(list[0]["name"]) != `"svcdemo"` {
				t.Errorf("snaps=svcdemo: %s", e.Result)
			}
			code, e = call(t, s.SocketPath(), "GET", "/v2/snaps?select=bogus", "")
			if r := errOf(t, e); code != 400 || r.Message != tc.badQ {
				t.Errorf("bad select: %d %q", code, r.Message)
			}
			code, e = call(t, s.SocketPath(), "GET", "/v2/snaps/k8s", "")
			var one map[string]json.RawMessage
			if decode(t, e.Result, &one); code != 200 || string(one["name"]) != `"k8s"` || string(one["apps"]) != k8sApps {
				t.Errorf("/v2/snaps/k8s: %d %s", code, e.Result)
			}
			code, e = call(t, s.SocketPath(), "GET", "/v2/snaps/nosuch", "")
			if r := errOf(t, e); code != 404 || r.Kind != "snap-not-found" || r.Message != "snap not installed" || string(r.Value) != `"nosuch"` {
				t.Errorf("unknown snap: %d %+v", code, r)
			}
			// snap info asks the store too: the fake's store is empty
			code, e = call(t, s.SocketPath(), "GET", "/v2/find?name=k8s", "")
			if r := errOf(t, e); code != 404 || r.Kind != "snap-not-found" || r.Message != "snap not found" {
				t.Errorf("find: %d %+v", code, r)
			}
			code, e = call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"remove"}`)
			if r := errOf(t, e); code != 400 || !strings.Contains(r.Message, "fake snapd does not remove snaps") {
				t.Errorf("POST /v2/snaps/k8s: %d %+v", code, r)
			}
		})
	}
}

// readSeq reads json-seq records from r until n records or EOF.
func readSeq(t *testing.T, br *bufio.Reader, n int) []map[string]string {
	t.Helper()
	var out []map[string]string
	for len(out) < n {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" {
			break
		}
		if err != nil && err != io.EOF {
			t.Fatal(err)
		}
		if !strings.HasPrefix(line, "\x1e") {
			t.Fatalf("record without RS: %q", line)
		}
		var m map[string]string
		if err := json.Unmarshal([]byte(line[1:]), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestLogs(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(clk), fake.WithSnaps(demo()))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendLog("svcdemo", "alpha", "hello from alpha"); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendLog("svcdemo", "nosuch", "x"); err == nil {
		t.Error("AppendLog to an unknown service")
	}

	rsp, err := client(s.SocketPath()).Get("http://localhost/v2/logs?names=svcdemo.alpha&n=-1")
	if err != nil {
		t.Fatal(err)
	}
	defer rsp.Body.Close()
	if rsp.StatusCode != 200 || rsp.Header.Get("Content-Type") != "application/json-seq" {
		t.Fatalf("%d %s", rsp.StatusCode, rsp.Header.Get("Content-Type"))
	}
	recs := readSeq(t, bufio.NewReader(rsp.Body), 100)
	var msgs []string
	for _, r := range recs {
		msgs = append(msgs, r["sid"]+"["+r["pid"]+"]: "+r["message"])
		if r["timestamp"] != "2026-12-02T14:00:00Z" {
			t.Errorf("timestamp %q", r["timestamp"])
		}
	}
	want := []string{
		`systemd[1]: Stopping snap.svcdemo.alpha.service - Service for snap application svcdemo.alpha...`,
		`systemd[1]: snap.svcdemo.alpha.service: Deactivated successfully.`,
		`systemd[1]: Stopped snap.svcdemo.alpha.service - Service for snap application svcdemo.alpha.`,
		`systemd[1]: Started snap.svcdemo.alpha.service - Service for snap application svcdemo.alpha.`,
		`svcdemo.alpha[4004]: hello from alpha`, // alpha, beta and gamma ran from the start (4001-4003)
	}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") {
		t.Errorf("logs:\n%s\nwant:\n%s", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
	}

	// n (default 10) keeps the last lines; follow streams new ones
	rsp2, err := client(s.SocketPath()).Get("http://localhost/v2/logs?names=svcdemo&n=1&follow=true")
	if err != nil {
		t.Fatal(err)
	}
	defer rsp2.Body.Close()
	br := bufio.NewReader(rsp2.Body)
	if got := readSeq(t, br, 1); got[0]["message"] != "hello from alpha" {
		t.Errorf("n=1: %v", got)
	}
	s.AppendLog("svcdemo", "beta", "beta says hi")
	if got := readSeq(t, br, 1); got[0]["message"] != "beta says hi" || got[0]["sid"] != "svcdemo.beta" {
		t.Errorf("follow: %v", got)
	}

	for q, want := range map[string]string{
		"names=svcdemo.ctl": `snap "svcdemo" has no service "ctl"`,
		"names=nosuch":      `snap "nosuch" not found`,
		"n=x":               `invalid value for n: "x": strconv.ParseInt: parsing "x": invalid syntax`,
		"follow=x":          `invalid value for follow: "x": strconv.ParseBool: parsing "x": invalid syntax`,
	} {
		code, e := call(t, s.SocketPath(), "GET", "/v2/logs?"+q, "")
		if r := errOf(t, e); code/100 != 4 || r.Message != want {
			t.Errorf("%s: %d %q, want %q", q, code, r.Message, want)
		}
	}
	// From 2.73 snapd refuses n <= 0 except -1; before, n=0 sends nothing.
	for _, v := range []fake.Version{fake.Version268, fake.Version277} {
		vs := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(v), fake.WithSnaps(demo()))
		code, e, _ := callErr(vs.SocketPath(), "GET", "/v2/logs?names=svcdemo&n=0", "")
		refused := code == 400 && e.Type == "error" && errOf(t, e).Message == "invalid value for n: 0"
		if refused != (v == fake.Version277) || (!refused && code != 200) {
			t.Errorf("%s: n=0: %d %s", v, code, e.Result)
		}
	}
	empty := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "plain", Apps: []fake.App{{Name: "cli"}}}))
	code, e := call(t, empty.SocketPath(), "GET", "/v2/logs", "")
	if r := errOf(t, e); code != 404 || r.Kind != "app-not-found" || r.Message != "no matching services" {
		t.Errorf("no services: %d %+v", code, r)
	}
}

func TestWarnings(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(clk), fake.WithSnaps(demo()))
	_, e := call(t, s.SocketPath(), "GET", "/v2/warnings", "")
	if string(e.Result) != "[]" {
		t.Errorf("no warnings: %s", e.Result)
	}
	s.AddWarning("something is off")
	clk.Advance(time.Second)
	_, b := do(t, s.SocketPath(), "GET", "/v2/apps?names=svcdemo.alpha", "")
	if !strings.Contains(string(b), `"warning-timestamp":"2026-12-02T14:00:00Z","warning-count":1}`) {
		t.Errorf("warning count missing: %s", b)
	}
	_, b = do(t, s.SocketPath(), "GET", "/v2/apps?names=nosuch", "")
	if strings.Contains(string(b), "warning-count") {
		t.Errorf("errors carry no warning count: %s", b)
	}
	_, e = call(t, s.SocketPath(), "GET", "/v2/warnings", "")
	var ws []map[string]any
	decode(t, e.Result, &ws)
	if len(ws) != 1 || ws[0]["message"] != "something is off" || ws[0]["expire-after"] != "672h0m0s" || ws[0]["repeat-after"] != "24h0m0s" || ws[0]["last-shown"] != nil {
		t.Errorf("warnings: %s", e.Result)
	}
	code, e := call(t, s.SocketPath(), "POST", "/v2/warnings", `{"action":"okay","timestamp":"2026-12-02T14:00:01Z"}`)
	if code != 200 || string(e.Result) != "1" {
		t.Errorf("okay: %d %s", code, e.Result)
	}
	_, b = do(t, s.SocketPath(), "GET", "/v2/apps?names=svcdemo.alpha", "")
	if strings.Contains(string(b), "warning-count") {
		t.Errorf("okayed warning still counted: %s", b)
	}
	_, e = call(t, s.SocketPath(), "GET", "/v2/warnings?select=all", "")
	if !strings.Contains(string(e.Result), `"last-shown":"2026-12-02T14:00:01Z"`) {
		t.Errorf("select=all: %s", e.Result)
	}
	for body, want := range map[string]string{
		`{"action":"bogus"}`: `unknown warning action "bogus"`,
		`nope`:               "cannot decode request body into warnings operation: invalid character 'o' in literal null (expecting 'u')",
	} {
		code, e := call(t, s.SocketPath(), "POST", "/v2/warnings", body)
		if r := errOf(t, e); code != 400 || r.Message != want {
			t.Errorf("%s: %d %q", body, code, r.Message)
		}
	}
	code, e = call(t, s.SocketPath(), "GET", "/v2/warnings?select=x", "")
	if r := errOf(t, e); code != 400 || r.Message != `invalid select parameter: "x"` {
		t.Errorf("bad select: %d %q", code, r.Message)
	}
}

// TestGoldenSystemInfo compares system-info with the captures. The keys
// that describe the capturing machine rather than snapd are set to the
// fake's values first: kernel-version, virtualization (systemd-nspawn
// there, none here: snapd then leaves the key out) and refresh.hold (a
// hold the capture's fresh system had).
func TestGoldenSystemInfo(t *testing.T) {
	for _, v := range []fake.Version{fake.Version268, fake.Version277} {
		s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(v))
		code, b := do(t, s.SocketPath(), "GET", "/v2/system-info", "")
		var got struct{ Result map[string]any }
		json.Unmarshal(b, &got)
		want, err := os.ReadFile(filepath.Join("..", "testdata", "snapd-golden", string(v), "system-info.json"))
		if err != nil {
			t.Fatal(err)
		}
		var env map[string]any
		json.Unmarshal(want, &env)
		res := env["result"].(map[string]any)
		res["kernel-version"] = got.Result["kernel-version"]
		delete(res, "virtualization")
		delete(res["refresh"].(map[string]any), "hold")
		want, _ = json.Marshal(env)
		if code != 200 {
			t.Errorf("%s: %d", v, code)
		}
		if d := conformance.Compare(want, b); len(d) > 0 {
			t.Errorf("%s system-info differs:\n  %s", v, strings.Join(d, "\n  "))
		}
	}
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(fake.Version257))
	_, e := call(t, s.SocketPath(), "GET", "/v2/system-info", "")
	var m map[string]any
	decode(t, e.Result, &m)
	if _, ok := m["features"]; ok {
		t.Error("2.57.6 has no features in system-info")
	}
	if m["version"] != "2.57.6-1+deb12u1+b2" || m["os-release"].(map[string]any)["version-id"] != "12" {
		t.Errorf("2.57.6: %v %v", m["version"], m["os-release"])
	}
	code, _ := call(t, s.SnapSocketPath(), "GET", "/v2/system-info", "")
	if code != http.StatusForbidden {
		t.Errorf("system-info on the snap socket: %d", code)
	}
}
