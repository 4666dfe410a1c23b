package fake_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)

func TestSnapFromDirK8s(t *testing.T) {
	sn, err := fake.SnapFromDir(filepath.Join("testdata", "k8s"))
	if err != nil {
		t.Fatal(err)
	}
	if sn.Name != "k8s" || sn.Version != "v1.32.2" || sn.Base != "core22" || sn.Grade != "stable" || sn.License != "GPL-3.0" {
		t.Errorf("metadata: %+v", sn)
	}
	// hooks: "remove" from snap.yaml, "configure" from meta/hooks/
	if !reflect.DeepEqual(sn.Hooks, []string{"configure", "remove"}) {
		t.Errorf("hooks %v", sn.Hooks)
	}
	got := map[string]fake.App{}
	for _, a := range sn.Apps {
		got[a.Name] = a
	}
	if len(got) != 10 {
		t.Fatalf("%d apps", len(got))
	}
	if a := got["k8s"]; a.Daemon != "" || a.Enabled || a.Active {
		t.Errorf("plain app: %+v", a)
	}
	if a := got["k8sd"]; a.Daemon != "simple" || a.DaemonScope != "system" || !a.Enabled || !a.Active {
		t.Errorf("k8sd (install-mode: enable): %+v", a)
	}
	if a := got["containerd"]; a.Daemon != "notify" || a.Enabled || a.Active || !reflect.DeepEqual(a.Before, []string{"kubelet"}) {
		t.Errorf("containerd (install-mode: disable): %+v", a)
	}
	if a := got["kube-apiserver"]; !reflect.DeepEqual(a.Before, []string{"kubelet", "kube-controller-manager", "kube-proxy", "kube-scheduler"}) {
		t.Errorf("kube-apiserver: %+v", a)
	}

	// the ordering works through the fake: a whole-snap start runs the
	// services in before/after order
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(clk), fake.WithSnaps(sn))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","names":["k8s"]}`)
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
	rsp, err := client(s.SocketPath()).Get("http://localhost/v2/logs?names=k8s&n=-1")
	if err != nil {
		t.Fatal(err)
	}
	defer rsp.Body.Close()
	var order []string
	for _, r := range readSeq(t, bufioReader(rsp), 100) {
		name := strings.TrimSuffix(strings.TrimPrefix(strings.Fields(r["message"])[1], "snap.k8s."), ".service")
		order = append(order, name)
	}
	pos := map[string]int{}
	for i, n := range order {
		pos[n] = i
	}
	for _, edge := range [][2]string{{"containerd", "kubelet"}, {"etcd", "kube-apiserver"},
		{"kube-apiserver", "kubelet"}, {"kube-apiserver", "kube-scheduler"}, {"k8s-apiserver-proxy", "kube-proxy"}} {
		if pos[edge[0]] > pos[edge[1]] {
			t.Errorf("%s started after %s: %v", edge[0], edge[1], order)
		}
	}
	if len(order) != 8 { // k8sd was already active
		t.Errorf("started %v", order)
	}
}

func TestSnapFromYAMLIntegrationSnap(t *testing.T) {
	in, err := os.ReadFile(filepath.Join("..", "integration", "snaps", "svcdemo", "meta", "snap.yaml.in"))
	if err != nil {
		t.Fatal(err)
	}
	// as integration/run.sh fills it in
	data := strings.NewReplacer("@SLOW_SECONDS@", "20", "@HELPER_PLUGS@", "snapd-control").Replace(string(in))
	sn, err := fake.SnapFromYAML([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]fake.App{
		"alpha":     {Name: "alpha", Daemon: "simple", DaemonScope: "system", Enabled: true, Active: true},
		"beta":      {Name: "beta", Daemon: "simple", DaemonScope: "system", Enabled: true, Active: true},
		"gamma":     {Name: "gamma", Daemon: "simple", DaemonScope: "system", Enabled: true, Active: true},
		"slowstart": {Name: "slowstart", Daemon: "forking", DaemonScope: "system"},
		"broken":    {Name: "broken", Daemon: "oneshot", DaemonScope: "system"},
		"ctl":       {Name: "ctl"},
		"helper":    {Name: "helper"},
	}
	if len(sn.Apps) != len(want) {
		t.Fatalf("apps %+v", sn.Apps)
	}
	for _, a := range sn.Apps {
		if !reflect.DeepEqual(a, want[a.Name]) {
			t.Errorf("%s: %+v, want %+v", a.Name, a, want[a.Name])
		}
	}
	// the hook is a file in meta/hooks/, not in snap.yaml
	dirSnap := filepath.Join("..", "integration", "snaps", "svcdemo")
	if len(sn.Hooks) != 0 {
		t.Errorf("snap.yaml declares no hooks: %v", sn.Hooks)
	}
	if _, err := os.Stat(filepath.Join(dirSnap, "meta", "hooks", "configure")); err != nil {
		t.Fatal(err)
	}
	// the instance name can be overridden
	sn.Name = "svcdemo_two"
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(sn))
	if st, ok := s.Service("svcdemo_two", "alpha"); !ok || !st.Active {
		t.Errorf("instance: %+v %v", st, ok)
	}
}

func TestSnapFromYAMLErrors(t *testing.T) {
	for yml, want := range map[string]string{
		"name: x\napps: {a: {daemon: simple, after: [b]}}":                  `refers to missing application "b"`,
		"name: x\napps: {a: {daemon: simple, after: [b]}, b: {command: c}}": `refers to non-service application "b"`,
		"name: x\napps: {a: {daemon: sometimes}}":                           `unknown daemon type "sometimes"`,
		"name: x\napps: {a: {daemon: simple, install-mode: later}}":         `invalid install-mode "later"`,
		"name: x\napps: {a: {daemon: simple, refresh-mode: never}}":         `invalid refresh-mode "never"`,
		"name: x\napps: {a: {daemon: simple, stop-mode: sigkill}}":          `invalid stop-mode "sigkill"`,
		"name: x\napps: {a: {daemon: simple, daemon-scope: world}}":         `invalid daemon-scope "world"`,
		"name: x\napps: {a: {install-mode: disable}}":                       `daemon settings on an app that is not a daemon`,
		"name: Bad_Name":           `invalid snap name: "Bad_Name"`,
		"summary: no name":         `snap.yaml has no name`,
		"name: [":                  `cannot parse snap.yaml`,
		"name: x\napps: {a_b: {}}": `invalid app name: "a_b"`,
	} {
		if _, err := fake.SnapFromYAML([]byte(yml)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", yml, err, want)
		}
	}
	// accepted and ignored: refresh-mode, stop-mode, user daemons (enabled, not active)
	sn, err := fake.SnapFromYAML([]byte("name: x\nversion: 1.0\napps: {u: {daemon: simple, daemon-scope: user, refresh-mode: endure, stop-mode: sigterm-all}}"))
	if err != nil || sn.Version != "1.0" || !sn.Apps[0].Enabled || sn.Apps[0].Active {
		t.Errorf("%+v %v", sn, err)
	}
}

func TestParseSnaps(t *testing.T) {
	yml := `
snaps:
  - name: k8s
    hooks: [configure]
    configure-hook-duration: 2s
    config: {cluster: {name: one}}
    apps:
      - {name: containerd, daemon: notify, before: [kubelet], start-duration: 500ms, enabled: true, active: true}
      - {name: kubelet, daemon: simple, after: [containerd], stop-duration: 1.5s}
      - {name: broken, daemon: oneshot, fail-start: true}
      - {name: custom, daemon: oneshot, fail-start: "no way\n"}
      - {name: k8s}
`
	snaps, err := fake.ParseSnaps([]byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	sn := snaps[0]
	if sn.ConfigureHookDuration != 2*time.Second || sn.Apps[0].StartDuration != 500*time.Millisecond ||
		sn.Apps[1].StopDuration != 1500*time.Millisecond || sn.Apps[2].FailStart != fake.SystemctlJobFailed("k8s", "broken") ||
		sn.Apps[3].FailStart != "no way\n" || !sn.Apps[0].Active || sn.Apps[1].Active {
		t.Errorf("%+v", sn)
	}
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(snaps...))
	if v, ok := s.Config("k8s", "cluster.name"); !ok || v != "one" {
		t.Errorf("config: %v %v", v, ok)
	}
	// JSON is YAML too; a bare list works
	if snaps, err := fake.ParseSnaps([]byte(`[{"name":"a","apps":[{"name":"d","daemon":"simple"}]}]`)); err != nil || snaps[0].Apps[0].Daemon != "simple" {
		t.Errorf("JSON list: %+v %v", snaps, err)
	}
	for in, want := range map[string]string{
		"snaps: [{name: a, apps: [{name: d, deamon: simple}]}]": "field deamon not found",
		"snaps: [{name: a, apps: [{name: d, daemon: sure}]}]":   `unknown daemon type "sure"`,
		"snaps: [{apps: []}]":           "has no name",
		"snaps: []":                     "lists no snaps",
		"snaps: [{name: a}, {name: a}]": "listed twice",
		"snaps: [{name: a, configure-hook-duration: soon}]": `invalid duration "soon"`,
	} {
		if _, err := fake.ParseSnaps([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", in, err, want)
		}
	}
}

func TestControlHandler(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()))
	h := httptest.NewServer(s.ControlHandler())
	defer h.Close()
	ctl := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, h.URL+path, strings.NewReader(body))
		rsp, err := h.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer rsp.Body.Close()
		b, _ := io.ReadAll(rsp.Body)
		return rsp.StatusCode, string(b)
	}
	code, out := ctl("POST", "/changes", `{"kind":"configure-snap","snap":"svcdemo","with-snap-names":true}`)
	if code != 200 || !strings.Contains(out, `"kind":"configure-snap"`) || !strings.Contains(out, `"status":"Doing"`) {
		t.Fatalf("hold: %d %s", code, out)
	}
	c, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	if c != 400 || !strings.Contains(string(e.Result), "configure-snap") {
		t.Fatalf("no conflict: %d %s", c, e.Result)
	}
	code, out = ctl("GET", "/wait?conflicts=1&timeout=5s", "")
	if code != 200 || !strings.Contains(out, `"conflicts":1`) {
		t.Errorf("wait: %d %s", code, out)
	}
	code, out = ctl("POST", "/changes/1/finish", "")
	if code != 200 || !strings.Contains(out, `"status":"Done"`) {
		t.Errorf("finish: %d %s", code, out)
	}
	for _, tc := range []struct{ method, path, body, want string }{
		{"POST", "/changes/99/finish", "", `no change \"99\"`},
		{"POST", "/changes", `{"snap":"svcdemo"}`, "a change needs a kind"},
		{"POST", "/changes", `{"kind":"x","snap":"nosuch"}`, `no snap \"nosuch\"`},
		{"POST", "/changes", `{"kind":"x","bogus":1}`, "unknown field"},
		{"POST", "/fail-start", `{"snap":"svcdemo","app":"ctl"}`, "no service svcdemo.ctl"},
		{"GET", "/nosuch", "", "no control endpoint"},
		{"GET", "/wait?conflicts=5&timeout=1ms", "", "not reached within 1ms"},
	} {
		code, out := ctl(tc.method, tc.path, tc.body)
		if code < 400 || !strings.Contains(out, tc.want) {
			t.Errorf("%s %s: %d %s, want %q", tc.method, tc.path, code, out, tc.want)
		}
	}
	if code, out := ctl("POST", "/fail-start", `{"snap":"svcdemo","app":"alpha"}`); code != 200 || !strings.Contains(out, "Job for snap.svcdemo.alpha.service failed") {
		t.Errorf("fail-start: %d %s", code, out)
	}
	_, e = call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	<-s.ChangeReady(e.Change)
	if info, _ := s.ChangeByID(e.Change); info.Status != "Error" {
		t.Errorf("restart with failing start: %s", info.Status)
	}
	if code, out := ctl("GET", "/cookie?snap=svcdemo", ""); code != 200 || !strings.Contains(out, s.Cookie("svcdemo")) {
		t.Errorf("cookie: %d %s", code, out)
	}
	if code, out := ctl("POST", "/maintenance", `{}`); code != 200 || !strings.Contains(out, "daemon-restart") {
		t.Errorf("maintenance: %d %s", code, out)
	}
	_, e = call(t, s.SocketPath(), "GET", "/v2/apps", "")
	if !strings.Contains(string(e.Maintenance), "daemon is restarting") {
		t.Errorf("maintenance not served: %s", e.Maintenance)
	}
	ctl("DELETE", "/maintenance", "")
	if code, out := ctl("GET", "/requests", ""); code != 200 || !strings.Contains(out, `"path":"/v2/apps"`) {
		t.Errorf("requests: %d %s", code, out)
	}
	if code, out := ctl("GET", "/state", ""); code != 200 || !strings.Contains(out, `"name":"alpha"`) || !strings.Contains(out, `"version":"2.77.1"`) {
		t.Errorf("state: %d %s", code, out)
	}
}

// Issue 27, item 10: the default k8s snap lacked etcd, which k8sd's
// bootstrap now starts, so that bootstrap failed with app-not-found against
// fakesnapd. Every service k8sd names (canonical/k8sd 1417866:
// pkg/snap/util/services.go's worker, control-plane and k8s lists,
// StartEtcdServices, and k8sd itself) is a daemon of the snap, the snap is
// classic as k8s-snap's snapcraft.yaml says, and only k8sd runs at install.
func TestK8sSnapHasK8sdServices(t *testing.T) {
	sn, err := fake.SnapFromDir(filepath.Join("testdata", "k8s"))
	if err != nil {
		t.Fatal(err)
	}
	daemons := map[string]fake.App{}
	for _, a := range sn.Apps {
		if a.Daemon != "" {
			daemons[a.Name] = a
		}
	}
	k8sd := []string{"containerd", "etcd", "k8s-apiserver-proxy", "k8sd", "kube-apiserver", "kube-controller-manager",
		"kube-proxy", "kube-scheduler", "kubelet"}
	for _, name := range k8sd {
		if _, ok := daemons[name]; !ok {
			t.Errorf("k8sd's service %q is not a service of the default k8s snap", name)
		}
	}
	if len(daemons) != len(k8sd) {
		t.Errorf("services %v, want exactly k8sd's %v", daemons, k8sd)
	}
	for name, a := range daemons {
		if a.Enabled != (name == "k8sd") || a.Active != (name == "k8sd") {
			t.Errorf("%s: enabled %t active %t at install", name, a.Enabled, a.Active)
		}
	}
	b, err := os.ReadFile(filepath.Join("testdata", "k8s", "meta", "snap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nconfinement: classic\n") {
		t.Error("the k8s snap is not classic")
	}
}
