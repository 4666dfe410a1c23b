package fake_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)

// k8sStore is a store snap (numeric revision) with two services; kubelet
// stops slowly.
func k8sStore() fake.Snap {
	return fake.Snap{Name: "k8s", Revision: "10", Version: "1.30", Apps: []fake.App{
		{Name: "containerd", Daemon: "simple", Enabled: true, Active: true, Before: []string{"kubelet"}},
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true, StopDuration: 2 * time.Second},
		{Name: "debug", Daemon: "simple"}, // disabled and inactive: stays so
		{Name: "k8s"},
	}}
}

func snapOf(t *testing.T, s *fake.Server, name string) map[string]any {
	t.Helper()
	code, e := call(t, s.SocketPath(), "GET", "/v2/snaps/"+name, "")
	if code != 200 {
		t.Fatalf("GET /v2/snaps/%s: %d %s", name, code, e.Result)
	}
	var m map[string]any
	decode(t, e.Result, &m)
	return m
}

func taskKinds(ci fake.ChangeInfo) []string {
	var out []string
	for _, tk := range ci.Tasks {
		out = append(out, tk.Kind+":"+tk.Status)
	}
	return out
}

func TestRefreshFromStore(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sStore()), fake.WithClock(clk),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11", Version: "1.31"}))
	ctx := context.Background()

	code, e := call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	if code != 202 || e.Type != "async" || e.Change == "" {
		t.Fatalf("refresh: %d %s", code, e.Result)
	}
	ci, _ := s.ChangeByID(e.Change)
	if ci.Kind != "refresh-snap" || ci.Summary != `Refresh "k8s" snap` || ci.Ready {
		t.Fatalf("refresh change: %+v", ci)
	}
	// while kubelet stops, the refresh holds the snap
	code, e2 := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["k8s.containerd"]}`)
	if r := errOf(t, e2); code != 400 || r.Kind != "" || r.Message != `snap "k8s" has "refresh-snap" change in progress` {
		t.Errorf("restart during the refresh: %d %+v", code, r)
	}
	code, e2 = call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	if r := errOf(t, e2); code != 409 || r.Kind != "snap-change-conflict" || string(r.Value) != `{"change-kind":"refresh-snap","snap-name":"k8s"}` {
		t.Errorf("refresh during the refresh: %d %+v", code, r)
	}
	refreshStarted := clk.Now()
	if err := s.AdvanceUntilReady(ctx, e.Change); err != nil {
		t.Fatal(err)
	}
	ci, _ = s.ChangeByID(e.Change)
	if ci.Status != "Done" {
		t.Fatalf("refresh ended %s: %s", ci.Status, ci.Err)
	}
	want := []string{"prerequisites", "download-snap", "validate-snap", "prerequisites", "mount-snap", "run-hook",
		"stop-snap-services", "remove-aliases", "unlink-current-snap", "copy-snap-data", "setup-profiles", "link-snap",
		"auto-connect", "set-auto-aliases", "setup-aliases", "run-hook", "start-snap-services", "cleanup", "run-hook",
		"run-hook", "check-rerefresh", "process-delayed-security-backend-effects", "setup-profiles"}
	var got []string
	for _, tk := range ci.Tasks {
		got = append(got, tk.Kind)
		if tk.Status != "Done" {
			t.Errorf("task %s %q is %s", tk.Kind, tk.Summary, tk.Status)
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("tasks:\n got %v\nwant %v", got, want)
	}
	if ci.Tasks[1].Summary != `Download snap "k8s" (11) from channel "latest/stable"` {
		t.Errorf("download summary %q", ci.Tasks[1].Summary)
	}
	sn := snapOf(t, s, "k8s")
	if sn["revision"] != "11" || sn["version"] != "1.31" {
		t.Errorf("after the refresh: revision %v version %v", sn["revision"], sn["version"])
	}
	// every running service was stopped once and started once, in the refresh
	for _, app := range []string{"containerd", "kubelet"} {
		h := s.ServiceHistory("k8s", app)
		if len(h) != 3 || !h[0].Active || h[1].Active || !h[2].Active || h[1].At.Before(refreshStarted) {
			t.Errorf("%s's history: %+v", app, h)
		}
	}
	if h := s.ServiceHistory("k8s", "debug"); len(h) != 1 || h[0].Active || h[0].Enabled {
		t.Errorf("the disabled service was touched: %+v", h)
	}
	// nothing newer now: snapd's 400, no change
	n := len(s.Changes())
	code, e = call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	if r := errOf(t, e); code != 400 || r.Kind != "snap-no-update-available" || r.Message != "snap has no updates available" || string(r.Value) != `""` {
		t.Errorf("no update: %d %+v", code, r)
	}
	if len(s.Changes()) != n {
		t.Errorf("a refresh with no update made a change")
	}
	code, e = call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh","channel":"edge"}`)
	if r := errOf(t, e); code != 404 || r.Kind != "snap-channel-not-available" || r.Message != "no snap revision on specified channel" {
		t.Errorf("unknown channel: %d %+v", code, r)
	}
	if sn["tracking-channel"] != "latest/stable" || sn["channel"] != "latest/stable" {
		t.Errorf("after a refresh from latest/stable: tracking %v channel %v", sn["tracking-channel"], sn["channel"])
	}
	// another channel: the snap tracks it from then on
	s.SetStoreRevision("k8s", fake.StoreRevision{Revision: "14", Version: "1.32", Channel: "beta"})
	code, e = call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh","channel":"beta"}`)
	if code != 202 {
		t.Fatalf("refresh --beta: %d %s", code, e.Result)
	}
	if ci, _ := s.ChangeByID(e.Change); ci.Summary != `Refresh "k8s" snap from "beta" channel` {
		t.Errorf("summary %q", ci.Summary)
	}
	s.AdvanceUntilReady(ctx, e.Change)
	if sn := snapOf(t, s, "k8s"); sn["tracking-channel"] != "latest/beta" || sn["channel"] != "latest/beta" || sn["revision"] != "14" {
		t.Errorf("after a refresh from beta: tracking %v channel %v revision %v", sn["tracking-channel"], sn["channel"], sn["revision"])
	}
	// and a plain refresh now looks at beta: nothing newer there
	code, e = call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	if r := errOf(t, e); code != 400 || r.Kind != "snap-no-update-available" {
		t.Errorf("refresh tracking beta: %d %+v", code, r)
	}
}

func TestRefreshNewServicesFailToStart(t *testing.T) {
	clk := fake.NewManualClock(t0)
	apps := []fake.App{
		{Name: "containerd", Daemon: "simple", Before: []string{"kubelet"}},
		{Name: "kubelet", Daemon: "simple", FailStart: fake.SystemctlJobFailed("k8s", "kubelet")},
		{Name: "debug", Daemon: "simple"},
		{Name: "k8s"},
	}
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sStore()), fake.WithClock(clk), fake.WithVersion(fake.Version268),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11", Apps: apps}))
	ctx := context.Background()
	code, e := call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	if code != 202 {
		t.Fatalf("refresh: %d %s", code, e.Result)
	}
	if err := s.AdvanceUntilReady(ctx, e.Change); err != nil {
		t.Fatal(err)
	}
	ci, _ := s.ChangeByID(e.Change)
	wantErr := "cannot perform the following tasks:\n- Start snap \"k8s\" (11) services (systemctl command [start snap.k8s.kubelet.service] failed with exit status 1: stderr:\nJob for snap.k8s.kubelet.service failed"
	if ci.Status != "Error" || !strings.HasPrefix(ci.Err, wantErr) {
		t.Fatalf("refresh: %s %q", ci.Status, ci.Err)
	}
	st := map[string]string{}
	for _, tk := range ci.Tasks {
		st[tk.Kind] = tk.Status
	}
	for kind, want := range map[string]string{"start-snap-services": "Error", "link-snap": "Undone", "stop-snap-services": "Undone",
		"prerequisites": "Done", "cleanup": "Hold", "check-rerefresh": "Done"} {
		if st[kind] != want {
			t.Errorf("%s is %s, want %s (%v)", kind, st[kind], want, taskKinds(ci))
		}
	}
	// undone: the old revision, its services running again
	if sn := snapOf(t, s, "k8s"); sn["revision"] != "10" || sn["version"] != "1.30" {
		t.Errorf("after the failed refresh: %v %v", sn["revision"], sn["version"])
	}
	for _, app := range []string{"containerd", "kubelet"} {
		if a, _ := s.Service("k8s", app); !a.Active || !a.Enabled {
			t.Errorf("%s after the undo: %+v", app, a)
		}
	}
	// containerd: running, stopped by the refresh, started (new), stopped (rollback), started (undo)
	h := s.ServiceHistory("k8s", "containerd")
	var seq []bool
	for _, x := range h {
		seq = append(seq, x.Active)
	}
	if want := []bool{true, false, true, false, true}; len(seq) != len(want) || seq[1] || !seq[2] || seq[3] || !seq[4] {
		t.Errorf("containerd's history %v, want %v", seq, want)
	}
}

func TestRefreshServiceDiesAfterStart(t *testing.T) {
	clk := fake.NewManualClock(t0)
	apps := []fake.App{
		{Name: "containerd", Daemon: "simple"},
		{Name: "kubelet", Daemon: "simple", DiesAfterStart: true},
		{Name: "debug", Daemon: "simple"},
		{Name: "k8s"},
	}
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sStore()), fake.WithClock(clk),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "12", Apps: apps}))
	code, e := call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	if code != 202 {
		t.Fatalf("refresh: %d %s", code, e.Result)
	}
	s.AdvanceUntilReady(context.Background(), e.Change)
	if ci, _ := s.ChangeByID(e.Change); ci.Status != "Done" {
		t.Fatalf("refresh: %s %s", ci.Status, ci.Err)
	}
	// snapd saw the start succeed; the service is not running
	if a, _ := s.Service("k8s", "kubelet"); a.Active || !a.Enabled {
		t.Errorf("kubelet after the refresh: %+v", a)
	}
	h := s.ServiceHistory("k8s", "kubelet")
	if n := len(h); n < 2 || !h[n-2].Active || h[n-1].Active {
		t.Errorf("kubelet's history: %+v", h)
	}
	code, e = call(t, s.SocketPath(), "GET", "/v2/apps?names=k8s.kubelet", "")
	var list []map[string]any
	decode(t, e.Result, &list)
	if code != 200 || len(list) != 1 || list[0]["active"] != nil {
		t.Errorf("GET /v2/apps: %d %s", code, e.Result)
	}
}

func TestRefreshConflictsWithForeignChange(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sStore()),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11"}))
	c := s.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
	code, e := call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	if r := errOf(t, e); code != 409 || r.Kind != "snap-change-conflict" || r.Message != `snap "k8s" has "configure-snap" change in progress` ||
		string(r.Value) != `{"change-kind":"configure-snap","snap-name":"k8s"}` {
		t.Errorf("refresh during configure: %d %+v", code, r)
	}
	// a hold never conflicts
	code, e = call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"hold","time":"forever","hold-level":"auto-refresh"}`)
	if code != 202 {
		t.Errorf("hold during configure: %d %s", code, e.Result)
	}
	c.Finish()
	code, e = call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	if code != 202 {
		t.Errorf("refresh after configure: %d %s", code, e.Result)
	}
}

func TestRefreshAbortedUndone(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sStore()), fake.WithClock(clk),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11"}))
	_, e := call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	// kubelet is still stopping
	code, _ := call(t, s.SocketPath(), "POST", "/v2/changes/"+e.Change, `{"action":"abort"}`)
	if code != 200 {
		t.Fatalf("abort: %d", code)
	}
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
	ci, _ := s.ChangeByID(e.Change)
	if !ci.Ready || ci.Status == "Done" {
		t.Fatalf("aborted refresh: %s %v", ci.Status, taskKinds(ci))
	}
	if sn := snapOf(t, s, "k8s"); sn["revision"] != "10" {
		t.Errorf("aborted refresh left revision %v", sn["revision"])
	}
	for _, app := range []string{"containerd", "kubelet"} {
		if a, _ := s.Service("k8s", app); !a.Active {
			t.Errorf("%s after the aborted refresh: %+v", app, a)
		}
	}
}

func TestSideloadOverInstalled(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sStore()), fake.WithClock(clk), fake.WithVersion(fake.Version257))
	yaml := []byte("name: k8s\nversion: '1.31-dev'\napps:\n  containerd: {daemon: simple, command: x}\n  kubelet: {daemon: simple, command: x}\n  debug: {daemon: simple, command: x}\n  k8s: {command: x}\n  extra: {daemon: simple, command: x, install-mode: disable}\n")
	code, b := sideload(t, s.SocketPath(), "k8s_1.31-dev_amd64.snap", yaml)
	var e env
	json.Unmarshal(b, &e)
	if code != 202 || e.Change == "" {
		t.Fatalf("sideload: %d %s", code, b)
	}
	s.AdvanceUntilReady(context.Background(), e.Change)
	ci, _ := s.ChangeByID(e.Change)
	if ci.Kind != "install-snap" || ci.Status != "Done" || ci.Summary != `Install "k8s" snap from file "k8s_1.31-dev_amd64.snap"` {
		t.Fatalf("sideload change: %+v", ci)
	}
	sn := snapOf(t, s, "k8s")
	if sn["revision"] != "x1" || sn["version"] != "1.31-dev" {
		t.Errorf("after the sideload: %v %v", sn["revision"], sn["version"])
	}
	if a, ok := s.Service("k8s", "extra"); !ok || a.Enabled || a.Active {
		t.Errorf("new install-mode: disable service: %+v %v", a, ok)
	}
	if a, _ := s.Service("k8s", "debug"); a.Enabled || a.Active {
		t.Errorf("disabled service after the sideload: %+v", a)
	}
	// again: a new local revision every time
	code, b = sideload(t, s.SocketPath(), "k8s_1.31-dev_amd64.snap", yaml)
	json.Unmarshal(b, &e)
	s.AdvanceUntilReady(context.Background(), e.Change)
	if sn := snapOf(t, s, "k8s"); code != 202 || sn["revision"] != "x2" {
		t.Errorf("second sideload: %d revision %v", code, sn["revision"])
	}
	// the snap client's form: snap-path names the file in the summary
	code, b = sideloadPath(t, s.SocketPath(), "/root/snaps/k8s_1.31-dev_amd64.snap", yaml)
	json.Unmarshal(b, &e)
	if ci, _ := s.ChangeByID(e.Change); code != 202 || ci.Summary != `Install "k8s" snap from file "/root/snaps/k8s_1.31-dev_amd64.snap"` {
		t.Errorf("sideload with snap-path: %d %q", code, ci.Summary)
	}
	s.AdvanceUntilReady(context.Background(), e.Change)
	// refused: not dangerous, not installed, unreadable
	for _, c := range []struct {
		name, file string
		data       []byte
		dangerous  bool
		msg        string
	}{
		{"signatures", "k8s_1_amd64.snap", yaml, false, `cannot find signatures with metadata for snap "k8s_1_amd64.snap"`},
		{"not installed", "other_1_amd64.snap", []byte("name: other\nversion: '1'\n"), true, `fake snapd installs a snap file only over the installed snap ("other" is not installed)`},
		{"unreadable", "junk.snap", []byte("\x00\x01"), true, "cannot read snap file: "},
	} {
		code, b := sideloadForm(t, s.SocketPath(), c.file, c.data, c.dangerous)
		var e env
		json.Unmarshal(b, &e)
		if r := errOf(t, e); code != 400 || !strings.HasPrefix(r.Message, c.msg) {
			t.Errorf("%s: %d %+v", c.name, code, r)
		}
	}
}

// sideloadPath posts a file as the snap client does (client/snap_op.go
// sendSnapFiles): action, name, snap-path, dangerous, then the file part
// named by its base name.
func sideloadPath(t *testing.T, sock, path string, content []byte) (int, []byte) {
	t.Helper()
	base := filepath.Base(path)
	return postSnapForm(t, sock, [][2]string{{"action", "install"}, {"name", strings.SplitN(base, "_", 2)[0]},
		{"snap-path", path}, {"dangerous", "true"}}, base, content)
}

func TestControlStoreAndHold(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sStore()))
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
	code, out := ctl("POST", "/store", `{"snap":"k8s","revision":"11","version":"1.31","apps":[{"name":"containerd","daemon":"simple"},{"name":"kubelet","daemon":"simple","dies-after-start":true}]}`)
	if code != 200 || !strings.Contains(out, `"channel":"latest/stable"`) {
		t.Fatalf("POST /store: %d %s", code, out)
	}
	for _, tc := range []struct{ body, want string }{
		{`{"snap":"nosuch","revision":"2"}`, `no snap \"nosuch\"`},
		{`{"snap":"k8s","revision":"x2"}`, "is not a positive number"},
		{`{"snap":"k8s","revision":"2","apps":[{"name":"a","daemon":"bogus"}]}`, "unknown daemon type"},
	} {
		if code, out := ctl("POST", "/store", tc.body); code != 400 && code != 404 || !strings.Contains(out, tc.want) {
			t.Errorf("POST /store %s: %d %s", tc.body, code, out)
		}
	}
	c, e := call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"refresh"}`)
	if c != 202 {
		t.Fatalf("refresh: %d %s", c, e.Result)
	}
	s.AdvanceUntilReady(context.Background(), e.Change)
	if a, _ := s.Service("k8s", "kubelet"); a.Active || !a.Enabled {
		t.Errorf("kubelet (dies after start): %+v", a)
	}
	if code, out := ctl("GET", "/hold?snap=k8s", ""); code != 200 || strings.Contains(out, "until") {
		t.Errorf("GET /hold before: %d %s", code, out)
	}
	call(t, s.SocketPath(), "POST", "/v2/snaps/k8s", `{"action":"hold","time":"forever","hold-level":"general"}`)
	if code, out := ctl("GET", "/hold?snap=k8s", ""); code != 200 || !strings.Contains(out, `"level":"general"`) || !strings.Contains(out, `"until":"2`) {
		t.Errorf("GET /hold after: %d %s", code, out)
	}
}

// TestRefreshInstantaneous: with no durations anywhere the whole chain runs
// at once; the change still ends Done (check-rerefresh and
// process-delayed-security-backend-effects ended with it), for a store
// refresh and for two local installs in a row, on every version.
func TestRefreshInstantaneous(t *testing.T) {
	for _, v := range []fake.Version{fake.Version257, fake.Version268, fake.Version277} {
		t.Run(string(v), func(t *testing.T) {
			s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(v), fake.WithSnaps(fake.Snap{Name: "svcdemo", Revision: "1", Apps: []fake.App{
				{Name: "alpha", Daemon: "simple", Enabled: true, Active: true},
				{Name: "beta", Daemon: "simple", Enabled: true, Active: true}}}),
				fake.WithStoreRevision("svcdemo", fake.StoreRevision{Revision: "2"}))
			file := []byte("name: svcdemo\nversion: '1.1'\napps:\n  alpha:\n    daemon: simple\n  beta:\n    daemon: simple\n")
			var ids []string
			_, e := call(t, s.SocketPath(), "POST", "/v2/snaps/svcdemo", `{"action":"refresh"}`)
			ids = append(ids, e.Change)
			for i := 0; i < 2; i++ {
				_, b := sideload(t, s.SocketPath(), "svcdemo_1.1_amd64.snap", file)
				ids = append(ids, changeID(t, b))
			}
			for _, id := range ids {
				ci, ok := s.ChangeByID(id)
				if !ok || ci.Status != "Done" || !ci.Ready {
					t.Errorf("change %q: %s %v", id, ci.Status, taskKinds(ci))
				}
			}
			if sn := snapOf(t, s, "svcdemo"); sn["revision"] != "x2" || sn["version"] != "1.1" {
				t.Errorf("at the end: %v %v", sn["revision"], sn["version"])
			}
		})
	}
}

func TestSnapctlRefreshGateHook(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sStore(), fake.Snap{Name: "other", Apps: []fake.App{{Name: "d", Daemon: "simple"}}}),
		fake.WithClock(clk), fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11", Version: "1.31"}))
	ctl := func(cookie string, args ...string) (int, string, errRes) {
		t.Helper()
		code, e := call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(cookie, args...))
		if e.Type == "error" {
			return code, "", errOf(t, e)
		}
		var r struct{ Stdout string }
		decode(t, e.Result, &r)
		return code, r.Stdout, errRes{}
	}
	h := s.StartHook("k8s", "gate-auto-refresh")
	if ci, _ := s.ChangeByID(h.ChangeID()); ci.Kind != "auto-refresh" || ci.Tasks[0].Summary != `Run hook gate-auto-refresh of snap "k8s"` {
		t.Errorf("gate hook change: %+v", ci)
	}
	code, out, _ := ctl(h.Cookie(), "refresh", "--pending")
	if code != 200 || out != "pending: ready\nchannel: latest/stable\nversion: \"1.31\"\nrevision: 11\nbase: false\nrestart: false\n" {
		t.Errorf("--pending: %d %q", code, out)
	}
	clk.Advance(24 * time.Hour)
	code, out, _ = ctl(h.Cookie(), "refresh", "--hold")
	if code != 200 || out != "hold: 2136h0m0s\n" || h.RefreshAction() != "hold" {
		t.Errorf("--hold: %d %q %q", code, out, h.RefreshAction())
	}
	if g := snapOf(t, s, "k8s")["gating-hold"]; g != t0.Add(90*24*time.Hour).Format(time.RFC3339) {
		t.Errorf("gating-hold read back %v", g)
	}
	for _, c := range []struct {
		cookie string
		args   []string
		msg    string
	}{
		{h.Cookie(), []string{"refresh", "--hold", "--proceed"}, "cannot use --proceed and --hold together"},
		{h.Cookie(), []string{"refresh", "--frob"}, "unknown flag `frob'"},
		{s.Cookie("k8s"), []string{"refresh", "--hold"}, "cannot hold outside of gate-auto-refresh hook"},
		{s.Cookie("k8s"), []string{"refresh", "--proceed"}, "cannot proceed: requires snap-refresh-control interface"},
		{s.StartHook("other", "configure").Cookie(), []string{"refresh", "--proceed"}, "can only be used from gate-auto-refresh hook"},
		{s.StartHook("other", "gate-auto-refresh").Cookie(), []string{"refresh", "--hold"}, `internal error: snap "other" is not affected by any snaps`},
	} {
		if code, _, r := ctl(c.cookie, c.args...); code != 400 || r.Message != "snapctl: "+c.msg {
			t.Errorf("%v: %d %q", c.args, code, r.Message)
		}
	}
	code, out, _ = ctl(h.Cookie(), "refresh", "--proceed")
	if code != 200 || out != "" || h.RefreshAction() != "proceed" {
		t.Errorf("--proceed: %d %q %q", code, out, h.RefreshAction())
	}
	if g := snapOf(t, s, "k8s")["gating-hold"]; g != nil {
		t.Errorf("gating-hold after --proceed: %v", g)
	}
	// a snap with nothing pending
	code, out, _ = ctl(s.Cookie("other"), "refresh", "--pending")
	if code != 200 || out != "pending: none\nbase: false\nrestart: false\n" {
		t.Errorf("--pending, nothing pending: %d %q", code, out)
	}
}
