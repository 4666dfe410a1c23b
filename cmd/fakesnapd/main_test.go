package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	// --allow-non-root: this test acts as whoever runs it
	d := start(t, "--root", root, "--snapd-version", "2.68", "--allow-non-root")
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
	// snap changes k8s lists it, as it lists a real `snap set`
	code, m = get(t, d.ann.Socket, "GET", "/v2/changes?for=k8s&select=all", "")
	if l, _ := m["result"].([]any); code != 200 || len(l) != 1 || l[0].(map[string]any)["id"] != id {
		t.Errorf("changes for k8s: %d %v", code, m)
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
	// --allow-non-root: snapsvc runs as whoever runs the test
	d := start(t, "--dir", t.TempDir(), "--allow-non-root")
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

// TestSnapClientAccess runs Debian's snap client (SNAPSVC_SNAP_CLIENT,
// .ci/snap-client) against fakesnapd as a user who is not root: nobody
// (setpriv) when the test runs as root, else the user running it. snapd
// refuses such a user what it lets only root do, and the client prints
// "error: access denied (try with sudo)", exit 1: the real-snapd suite
// checks that snap prints exactly that against real snapd 2.57.6, 2.68.3
// and 2.77.1 (integration TestSnapClientMatchesRealSnapd, steps *-user).
// Reads still work, and `snap changes k8s` lists the change `fakesnapd
// ctl hold configure-snap k8s` made, as it lists a real `snap set`.
// Root, and anyone with --allow-non-root, gets through.
func TestSnapClientAccess(t *testing.T) {
	snapBin := os.Getenv("SNAPSVC_SNAP_CLIENT")
	if snapBin == "" {
		t.Skip("SNAPSVC_SNAP_CLIENT (Debian's snap binary, .ci/snap-client) is not set")
	}
	asRoot := os.Geteuid() == 0
	if _, err := exec.LookPath("setpriv"); asRoot && err != nil {
		t.Skip("running as root without setpriv: cannot run snap as another user")
	}
	// A root any user may enter: snapd's sockets are 0666 in a 0755 /run.
	root, err := os.MkdirTemp("", "fakesnapd-root")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// snap runs as a user (nobody, or the one running the test) or as
	// root; it prints what it prints and exits.
	snap := func(user bool, args ...string) (string, int) {
		t.Helper()
		argv := append([]string{snapBin}, args...)
		if user && asRoot {
			argv = append([]string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}, argv...)
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "SNAP_REEXEC=0", "SNAPPY_GLOBAL_ROOT=" + root, "HOME=/nonexistent", "LANG=C.UTF-8", "TZ=UTC"}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("snap %v: %v", args, err)
		}
		return out.String(), cmd.ProcessState.ExitCode()
	}
	d := start(t, "--root", root)
	if out, rc := snap(true, "version"); rc != 0 {
		t.Fatalf("%s cannot run as a user who is not root: exit %d: %s", snapBin, rc, out)
	}
	id, rc := d.ctl("hold", "configure-snap", "k8s")
	if id = strings.TrimSpace(id); rc != 0 {
		t.Fatalf("hold: %d %s", rc, id)
	}
	const denied = "error: access denied (try with sudo)\n"
	for _, args := range [][]string{
		{"restart", "k8s.k8sd"}, {"stop", "k8s.k8sd"}, {"start", "k8s.kubelet"}, {"logs", "k8s.k8sd"},
		{"get", "k8s"}, {"set", "k8s", "a=1"}, {"abort", id},
	} {
		if out, rc := snap(true, args...); rc != 1 || out != denied {
			t.Errorf("as a user, snap %s: exit %d %q; want exit 1 %q", strings.Join(args, " "), rc, out, denied)
		}
	}
	if out, rc := snap(true, "services", "k8s.k8sd"); rc != 0 || !strings.Contains(out, "k8s.k8sd  enabled  active") {
		t.Errorf("as a user, snap services: exit %d %s", rc, out)
	}
	if out, rc := snap(true, "changes", "k8s"); rc != 0 || !regexp.MustCompile(`(?m)^`+id+` +Doing .*Change configuration of "k8s" snap$`).MatchString(out) {
		t.Errorf("as a user, snap changes k8s does not list the held change %s: exit %d\n%s", id, rc, out)
	}
	out, _ := d.ctl("services", "k8s")
	var svcs []struct {
		Name   string
		Active bool
	}
	json.Unmarshal([]byte(out), &svcs)
	for _, sv := range svcs {
		if sv.Name == "k8sd" && !sv.Active || sv.Name == "kubelet" && sv.Active {
			t.Errorf("a refused stop or start acted: %s", out)
		}
	}
	if out, _ := d.ctl("counters"); !strings.Contains(out, `"changes-created": 1`) {
		t.Errorf("a refused request made a change: %s", out)
	}

	d.ctl("finish", id)
	if asRoot {
		if out, rc := snap(false, "restart", "k8s.k8sd"); rc != 0 || out != "Restarted.\n" {
			t.Errorf("as root, snap restart: exit %d %q", rc, out)
		}
	} else {
		t.Log("not root: snap as root not tried")
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()

	start(t, "--root", root, "--allow-non-root")
	if out, rc := snap(true, "restart", "k8s.k8sd"); rc != 0 || out != "Restarted.\n" {
		t.Errorf("with --allow-non-root, as a user, snap restart: exit %d %q", rc, out)
	}
}
