package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// bins holds the fakesnapd and snapsvc binaries TestMain builds.
var bins string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakesnapd-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		fmt.Fprintln(os.Stderr, "the go command is not in PATH:", err)
		os.Exit(1)
	}
	for _, pkg := range []string{".", "../snapsvc"} {
		out := filepath.Join(dir, filepath.Base(pkg))
		if pkg == "." {
			out = filepath.Join(dir, "fakesnapd")
		}
		cmd := exec.Command(goBin, "build", "-o", out, pkg)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "go build %s: %v\n", pkg, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	bins = dir
	code := m.Run()
	if err := goleak.Find(); code == 0 && err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// daemon is a running fakesnapd.
type daemon struct {
	t   *testing.T
	cmd *exec.Cmd
	ann Announcement
	dir string
}

// start runs fakesnapd --json with args and waits for its announcement.
func start(t *testing.T, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(filepath.Join(bins, "fakesnapd"), append(args, "--json")...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, cmd: cmd}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Wait()
		t.Fatalf("fakesnapd %v: no announcement (%v): %s", args, err, stderr.String())
	}
	if err := json.Unmarshal([]byte(line), &d.ann); err != nil {
		t.Fatalf("announcement %q: %v", line, err)
	}
	d.dir = filepath.Dir(d.ann.Socket)
	return d
}

// ctl runs fakesnapd ctl --dir D args and returns its stdout and exit code.
func (d *daemon) ctl(args ...string) (string, int) {
	d.t.Helper()
	return runBin(d.t, "fakesnapd", append([]string{"ctl", "--dir", d.dir}, args...)...)
}

func runBin(t *testing.T, name string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bins, name), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String() + errb.String(), code
}

// get calls the fake's main socket.
func get(t *testing.T, sock, method, path, body string) (int, map[string]any) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", sock)
	}}}
	req, _ := http.NewRequest(method, "http://localhost"+path, strings.NewReader(body))
	rsp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer rsp.Body.Close()
	b, _ := io.ReadAll(rsp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s: %q: %v", method, path, b, err)
	}
	return rsp.StatusCode, m
}

func TestServeAndControl(t *testing.T) {
	root := t.TempDir()
	d := start(t, "--root", root, "--snapd-version", "2.68")
	if d.ann.Version != "2.68.3" || d.ann.Socket != filepath.Join(root, "run", "snapd.socket") ||
		d.ann.SnapSocket != filepath.Join(root, "run", "snapd-snap.socket") ||
		d.ann.ControlSocket != filepath.Join(root, "run", "control.socket") || len(d.ann.Snaps) != 1 || d.ann.Snaps[0] != "k8s" {
		t.Fatalf("announcement %+v", d.ann)
	}
	code, m := get(t, d.ann.Socket, "GET", "/v2/apps?names=k8s.k8sd", "")
	if code != 200 || !strings.Contains(fmt.Sprint(m["result"]), "active:true") {
		t.Fatalf("apps: %d %v", code, m)
	}

	// a foreign change held through the control socket blocks the snap
	id, rc := d.ctl("hold", "configure-snap", "k8s")
	id = strings.TrimSpace(id)
	if rc != 0 || id != "1" {
		t.Fatalf("hold: %q %d", id, rc)
	}
	code, m = get(t, d.ann.Socket, "POST", "/v2/apps", `{"action":"restart","names":["k8s.k8sd"]}`)
	if code != 400 || m["result"].(map[string]any)["message"] != `snap "k8s" has "configure-snap" change in progress` {
		t.Fatalf("conflict: %d %v", code, m)
	}
	if out, rc := d.ctl("wait", "conflicts=1", "timeout=10s"); rc != 0 || !strings.Contains(out, `"conflicts": 1`) {
		t.Errorf("wait: %d %s", rc, out)
	}
	if out, rc := d.ctl("finish", id); rc != 0 || !strings.Contains(out, `"status": "Done"`) {
		t.Errorf("finish: %d %s", rc, out)
	}
	code, m = get(t, d.ann.Socket, "POST", "/v2/apps", `{"action":"restart","names":["k8s.k8sd"]}`)
	if code != 202 {
		t.Fatalf("restart after finish: %d %v", code, m)
	}
	if out, rc := d.ctl("wait", "idle", "timeout=10s"); rc != 0 {
		t.Errorf("wait idle: %d %s", rc, out)
	}

	// the cookie works for snapctl on the snap socket
	cookie, rc := d.ctl("cookie", "k8s")
	if rc != 0 || len(strings.TrimSpace(cookie)) < 20 {
		t.Fatalf("cookie %q %d", cookie, rc)
	}
	code, m = get(t, d.ann.SnapSocket, "POST", "/v2/snapctl",
		fmt.Sprintf(`{"context-id":%q,"args":["services","k8s.k8sd"]}`, strings.TrimSpace(cookie)))
	if code != 200 || !strings.Contains(fmt.Sprint(m["result"]), "k8s.k8sd  enabled  active") {
		t.Errorf("snapctl services: %d %v", code, m)
	}

	// failing starts, maintenance, service state, request log and counters
	if _, rc := d.ctl("fail-start", "k8s.kubelet"); rc != 0 {
		t.Fatal("fail-start")
	}
	_, m = get(t, d.ann.Socket, "POST", "/v2/apps", `{"action":"start","names":["k8s.kubelet"]}`)
	d.ctl("wait", "idle", "timeout=10s")
	_, m = get(t, d.ann.Socket, "GET", "/v2/changes/"+m["change"].(string), "")
	if r := m["result"].(map[string]any); r["status"] != "Error" || !strings.Contains(r["err"].(string), "Job for snap.k8s.kubelet.service failed") {
		t.Errorf("failing start: %v", r)
	}
	d.ctl("maintenance", "on")
	_, m = get(t, d.ann.Socket, "GET", "/v2/apps?names=k8s.k8sd", "")
	if mt, _ := m["maintenance"].(map[string]any); mt["kind"] != "daemon-restart" {
		t.Errorf("maintenance: %v", m)
	}
	d.ctl("maintenance", "off")
	if out, rc := d.ctl("service", "k8s.kubelet", "enabled", "active"); rc != 0 || !strings.Contains(out, `"active": true`) {
		t.Errorf("service: %d %s", rc, out)
	}
	// a store revision to refresh to, and a refresh hold read back
	// (kubelet, enabled now, must start again in the new revision)
	d.ctl("clear-fail-start", "k8s.kubelet")
	if out, rc := d.ctl("store", "k8s", "2", "1.31"); rc != 0 || !strings.Contains(out, `"revision": "2"`) {
		t.Errorf("store: %d %s", rc, out)
	}
	code, m = get(t, d.ann.Socket, "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	d.ctl("wait", "idle", "timeout=10s")
	if code != 202 {
		t.Errorf("refresh: %d %v", code, m)
	}
	_, m = get(t, d.ann.Socket, "GET", "/v2/snaps/k8s", "")
	if r := m["result"].(map[string]any); r["revision"] != "2" || r["version"] != "1.31" {
		t.Errorf("after the refresh: %v %v", r["revision"], r["version"])
	}
	get(t, d.ann.Socket, "POST", "/v2/snaps/k8s", `{"action":"hold","time":"forever","hold-level":"general"}`)
	if out, rc := d.ctl("held", "k8s"); rc != 0 || !strings.Contains(out, `"level": "general"`) {
		t.Errorf("held: %d %s", rc, out)
	}
	out, rc := d.ctl("requests")
	var reqs []map[string]any
	if err := json.Unmarshal([]byte(out), &reqs); rc != 0 || err != nil || len(reqs) < 5 || reqs[1]["method"] != "POST" || reqs[1]["status"] != float64(400) {
		t.Errorf("requests: %d %v %s", rc, err, out)
	}
	if out, rc := d.ctl("counters"); rc != 0 || !strings.Contains(out, `"POST /v2/apps": 3`) {
		t.Errorf("counters: %d %s", rc, out)
	}

	// a snapd restart: sockets gone, back without maintenance
	if out, rc := d.ctl("restart", "100ms"); rc != 0 || !strings.Contains(out, `"listening": true`) {
		t.Errorf("restart: %d %s", rc, out)
	}
	if code, _ := get(t, d.ann.Socket, "GET", "/v2/system-info", ""); code != 200 {
		t.Errorf("after restart: %d", code)
	}

	// bad commands and unknown things
	for _, args := range [][]string{{"finish", "99"}, {"cookie", "nosuch"}, {"fail-start", "k8s.nosuch"}} {
		if out, rc := d.ctl(args...); rc != 1 {
			t.Errorf("%v: %d %s", args, rc, out)
		}
	}
	if out, rc := d.ctl("bogus"); rc != 2 || !strings.Contains(out, `unknown command "bogus"`) {
		t.Errorf("bogus: %d %s", rc, out)
	}

	// SIGTERM: a clean exit that removes the sockets
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.cmd.Wait(); err != nil {
		t.Errorf("exit after SIGTERM: %v", err)
	}
	for _, p := range []string{d.ann.Socket, d.ann.SnapSocket, d.ann.ControlSocket} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
	if out, rc := runBin(t, "fakesnapd", "ctl", "--root", root, "state"); rc != 3 || !strings.Contains(out, "cannot reach fakesnapd") {
		t.Errorf("ctl without fakesnapd: %d %s", rc, out)
	}
}

func TestSnapsFileAndSnapYAML(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "snaps.yaml")
	os.WriteFile(file, []byte(`
- name: web
  apps:
    - {name: server, daemon: simple, enabled: true, active: true, stop-duration: 1s}
    - {name: worker, daemon: simple, fail-start: true}
`), 0o644)
	d := start(t, "--dir", filepath.Join(dir, "s"), "--snaps", file, "--version", "2.57")
	if d.ann.Version != "2.57.6" || d.ann.Snaps[0] != "web" {
		t.Fatalf("%+v", d.ann)
	}
	out, rc := d.ctl("services", "web")
	if rc != 0 || !strings.Contains(out, `"name": "server"`) || !strings.Contains(out, `"name": "worker"`) {
		t.Errorf("services: %d %s", rc, out)
	}
	// 2.57 has no notices
	if code, _ := get(t, d.ann.Socket, "GET", "/v2/notices", ""); code != 404 {
		t.Errorf("notices on 2.57: %d", code)
	}

	d2 := start(t, "--dir", filepath.Join(dir, "y"), "--snap-yaml", filepath.Join("..", "..", "fake", "testdata", "k8s"))
	code, m := get(t, d2.ann.Socket, "GET", "/v2/snaps/k8s", "")
	if code != 200 || m["result"].(map[string]any)["version"] != "v1.32.2" {
		t.Errorf("snap from a directory: %d %v", code, m)
	}

	for _, args := range [][]string{
		{"--snaps", filepath.Join(dir, "missing.yaml"), "--dir", dir},
		{"--dir", dir, "--root", dir},
		{"--snapd-version", "3.1", "--dir", dir},
		{"--version", "3.1", "--dir", dir}, // v0.1's spelling, still read
		{},
	} {
		if out, rc := runBin(t, "fakesnapd", args...); rc != 2 {
			t.Errorf("%v: exit %d: %s", args, rc, out)
		}
	}
	// snapsvc's style: GNU flag errors and suggestions (exit 2), help and
	// completion on stdout.
	for args, want := range map[string]string{
		"--bogus": "error: unknown flag: --bogus\nRun 'fakesnapd --help' for usage.",
		"ctll":    "Did you mean this?\n\tctl",
	} {
		if out, rc := runBin(t, "fakesnapd", args); rc != 2 || !strings.Contains(out, want) {
			t.Errorf("%s: exit %d: %s", args, rc, out)
		}
	}
	for _, args := range [][]string{{"--help"}, {"completion", "bash"}, {"ctl", "-h"}} {
		cmd := exec.Command(filepath.Join(bins, "fakesnapd"), args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if out, err := cmd.Output(); err != nil || len(out) == 0 || stderr.Len() > 0 {
			t.Errorf("%q: %v, %d bytes on stdout, stderr %q", args, err, len(out), stderr.String())
		}
	}
	// --version alone is the build, in snapsvc's style.
	if out, rc := runBin(t, "fakesnapd", "--version"); rc != 0 || !regexp.MustCompile(`^fakesnapd \S+ \(github.com/snapsvc/snapsvc/cmd, go`).MatchString(out) {
		t.Errorf("--version: exit %d: %s", rc, out)
	}
}

// TestSnapsvcWaitsOutHeldChange: the snapsvc CLI against fakesnapd, as
// cmd/fakesnapd/README.md shows it: status, then a restart that waits out
// a foreign configure-snap change until `fakesnapd ctl finish` releases it.
func TestSnapsvcWaitsOutHeldChange(t *testing.T) {
	d := start(t, "--dir", t.TempDir())
	out, rc := runBin(t, "snapsvc", "--socket", d.ann.Socket, "status", "k8s")
	if rc != 0 || !strings.Contains(out, "k8s.k8sd") || !strings.Contains(out, "enabled   active") {
		t.Fatalf("status: %d\n%s", rc, out)
	}
	id, _ := d.ctl("hold", "configure-snap", "k8s")
	id = strings.TrimSpace(id)

	restart := exec.Command(filepath.Join(bins, "snapsvc"), "--socket", d.ann.Socket, "--json", "restart", "k8s.k8sd")
	var rout, rerr bytes.Buffer
	restart.Stdout, restart.Stderr = &rout, &rerr // progress lines go to stderr
	if err := restart.Start(); err != nil {
		t.Fatal(err)
	}
	// the restart has run into the held change...
	if out, rc := d.ctl("wait", "conflicts=1", "timeout=60s"); rc != 0 {
		restart.Process.Kill()
		restart.Wait()
		t.Fatalf("no conflict seen: %s\n%s", out, rout.String())
	}
	// ...and cannot have made its change while it is held
	if out, _ := d.ctl("changes"); strings.Contains(out, `"kind": "service-control"`) {
		t.Errorf("a service-control change exists while the snap is held:\n%s", out)
	}
	if _, rc := d.ctl("finish", id); rc != 0 {
		t.Fatal("finish")
	}
	if err := restart.Wait(); err != nil {
		t.Fatalf("snapsvc restart: %v\n%s%s", err, rout.String(), rerr.String())
	}
	var res struct {
		Change, Status string
		Waited         bool
		Conflicts      int
	}
	if err := json.Unmarshal(rout.Bytes(), &res); err != nil {
		t.Fatalf("%v: %s", err, rout.String())
	}
	if res.Status != "Done" || !res.Waited || res.Conflicts < 1 || res.Change == id {
		t.Errorf("restart result: %+v", res)
	}
	out, _ = d.ctl("changes")
	var chs []struct {
		ID, Kind, Status string
		Spawn            time.Time `json:"spawn-time"`
		Ready            time.Time `json:"ready-time"`
	}
	if err := json.Unmarshal([]byte(out), &chs); err != nil {
		t.Fatalf("changes: %v: %s", err, out)
	}
	// the restart's change was made only once the held one was ready
	if len(chs) != 2 || chs[1].Kind != "service-control" || chs[1].Status != "Done" || chs[1].Spawn.Before(chs[0].Ready) {
		t.Errorf("changes: %s", out)
	}
}

// TestDefaultSnapMatchesTestdata keeps the embedded k8s snap.yaml and the
// fake's testdata copy the same.
func TestDefaultSnapMatchesTestdata(t *testing.T) {
	want, err := os.ReadFile(filepath.Join("..", "..", "fake", "testdata", "k8s", "meta", "snap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, k8sSnapYAML) {
		t.Error("cmd/fakesnapd/k8s-snap.yaml differs from fake/testdata/k8s/meta/snap.yaml")
	}
}

// Issue 36: --no-refresh-observe refuses change and notice reads on the
// snap socket as snapd refuses a snap without snap-refresh-observe: 403
// access denied, kind login-required; the main socket and snapctl still
// answer.
func TestNoRefreshObserve(t *testing.T) {
	d := start(t, "--dir", t.TempDir(), "--no-refresh-observe")
	for _, path := range []string{"/v2/changes?select=in-progress", "/v2/changes/1", "/v2/notices?types=change-update", "/v2/snaps"} {
		code, m := get(t, d.ann.SnapSocket, "GET", path, "")
		r, _ := m["result"].(map[string]any)
		if code != 403 || r["message"] != "access denied" || r["kind"] != "login-required" {
			t.Errorf("snap socket GET %s: %d %v", path, code, m)
		}
	}
	if code, m := get(t, d.ann.Socket, "GET", "/v2/changes?select=all", ""); code != 200 {
		t.Errorf("main socket: %d %v", code, m)
	}
	cookie, _ := d.ctl("cookie", "k8s")
	code, m := get(t, d.ann.SnapSocket, "POST", "/v2/snapctl", fmt.Sprintf(`{"context-id":%q,"args":["services","k8s.k8sd"]}`, strings.TrimSpace(cookie)))
	if code != 200 {
		t.Errorf("snapctl: %d %v", code, m)
	}
}
