package fake_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)

func cookieBody(cookie string, args ...string) string {
	b, _ := json.Marshal(map[string]any{"context-id": cookie, "args": args})
	return string(b)
}

func TestAccessRulesAndRoutes(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithVersion(fake.Version257))
	code, e := call(t, s.SnapSocketPath(), "GET", "/v2/apps", "")
	if r := errOf(t, e); code != 403 || r.Kind != "login-required" || r.Message != "access denied" {
		t.Fatalf("apps on snap socket: %d %+v", code, r)
	}
	code, e = call(t, s.SocketPath(), "POST", "/v2/snapctl", cookieBody(s.Cookie("svcdemo"), "services"))
	if r := errOf(t, e); code != 403 || r.Kind != "login-required" || e.Status != "Forbidden" {
		t.Fatalf("snapctl on main socket: %d %+v", code, r)
	}
	code, e = call(t, s.SocketPath(), "GET", "/v2/nosuch", "")
	if r := errOf(t, e); code != 404 || r.Message != "not found" || r.Kind != "" {
		t.Fatalf("unknown route: %d %+v", code, r)
	}
	// 2.57 has no notices API
	code, e = call(t, s.SocketPath(), "GET", "/v2/notices?timeout=1s", "")
	if r := errOf(t, e); code != 404 || r.Message != "not found" {
		t.Fatalf("notices on 2.57: %d %+v", code, r)
	}
	_, e = call(t, s.SocketPath(), "GET", "/v2/system-info", "")
	var si struct{ Version string }
	decode(t, e.Result, &si)
	// Debian 12's build reports its package version (snap version of snapd_2.57.6-1+deb12u1+b2)
	if si.Version != "2.57.6-1+deb12u1+b2" {
		t.Fatalf("version %q", si.Version)
	}
	code, e = call(t, s.SocketPath(), "GET", "/v2/changes?select=bogus", "")
	if r := errOf(t, e); code != 400 || r.Message != "select should be one of: all,in-progress,ready" {
		t.Fatalf("%d %+v", code, r)
	}
}

func TestForeignChangeBlocksUntilFinished(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	chg := s.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "svcdemo"})
	code, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo"]}`)
	if r := errOf(t, e); code != 400 || r.Message != `snap "svcdemo" has "configure-snap" change in progress` {
		t.Fatalf("%d %+v", code, r)
	}
	_, e = call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(s.Cookie("svcdemo"), "restart", "svcdemo.alpha"))
	if r := errOf(t, e); r.Message != `snapctl: snap "svcdemo" has "configure-snap" change in progress` {
		t.Fatalf("%+v", r)
	}
	// the in-progress list shows it with affected-snaps (2.77 profile)
	var list []change
	_, e = call(t, s.SocketPath(), "GET", "/v2/changes?select=in-progress", "")
	decode(t, e.Result, &list)
	if len(list) != 1 || list[0].Kind != "configure-snap" || list[0].Tasks[0].Kind != "run-hook" ||
		list[0].Summary != `Change configuration of "svcdemo" snap` || list[0].Tasks[0].Data["affected-snaps"] == nil {
		t.Fatalf("%s", e.Result)
	}
	clk.Advance(time.Second)
	chg.Finish()
	<-chg.Ready()
	clk.Advance(15 * time.Millisecond)
	code, e = call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo"]}`)
	if code != 202 {
		t.Fatalf("%d %s", code, e.Result)
	}
	reqs := s.Requests()
	last := reqs[len(reqs)-1]
	if got := last.Time.Sub(chg.ReadyTime()); got != 15*time.Millisecond {
		t.Fatalf("retry %v after ready", got)
	}
	c := s.Counters()
	if c.Conflicts != 2 || c.ChangesCreated != 2 {
		t.Fatalf("%+v", c)
	}
	// other snaps are not blocked by it, but exclusive kinds block everything
	s.AddChange(fake.ChangeSpec{Kind: "remodel"})
	_, e = call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.alpha"]}`)
	if r := errOf(t, e); r.Message != "remodeling in progress, no other changes allowed until this is done" {
		t.Fatalf("%+v", r)
	}
}

func TestConflictAs409AndFailedForeignChange(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithConflictAs409())
	chg := s.AddChange(fake.ChangeSpec{Kind: "auto-refresh", Snap: "svcdemo", WithSnapNames: true})
	code, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","names":["svcdemo.alpha"]}`)
	r := errOf(t, e)
	if code != 409 || r.Kind != "snap-change-conflict" || string(r.Value) != `{"change-kind":"auto-refresh","snap-name":"svcdemo"}` {
		t.Fatalf("%d %+v %s", code, r, r.Value)
	}
	_, e = call(t, s.SocketPath(), "GET", "/v2/changes?for=svcdemo", "")
	var list []change
	decode(t, e.Result, &list)
	if len(list) != 1 {
		t.Fatalf("for= does not see a change with snap-names: %s", e.Result)
	}
	chg.Fail("cannot refresh: boom")
	info := chg.Info()
	if info.Status != "Error" || info.Err != "cannot perform the following tasks:\n- Make snap \"svcdemo\" available to the system (cannot refresh: boom)" {
		t.Fatalf("%+v", info)
	}
}

func TestAbort(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()))
	chg := s.AddChange(fake.ChangeSpec{Kind: "install-snap", Snap: "svcdemo", Tasks: []fake.TaskSpec{
		{Kind: "mount-snap", Summary: "Mount"}, {Kind: "link-snap", Summary: "Link"}}})
	code, e := call(t, s.SocketPath(), "POST", "/v2/changes/"+chg.ID(), `{"action":"frob"}`)
	if r := errOf(t, e); code != 400 || r.Message != `change action "frob" is unsupported` {
		t.Fatalf("%+v", r)
	}
	code, e = call(t, s.SocketPath(), "POST", "/v2/changes/"+chg.ID(), `{"action":"abort"}`)
	var ch change
	decode(t, e.Result, &ch)
	if code != 200 || ch.Status != "Abort" || ch.Tasks[0].Status != "Abort" || ch.Tasks[1].Status != "Hold" {
		t.Fatalf("%d %s", code, e.Result)
	}
	chg.Finish() // the running task ends; with nothing to undo it is Undone
	if info := chg.Info(); info.Status != "Undone" || !info.Ready {
		t.Fatalf("%+v", info)
	}
	code, e = call(t, s.SocketPath(), "POST", "/v2/changes/"+chg.ID(), `{"action":"abort"}`)
	if r := errOf(t, e); code != 400 || r.Message != "cannot abort change "+chg.ID()+" with nothing pending" {
		t.Fatalf("%+v", r)
	}
	code, e = call(t, s.SocketPath(), "GET", "/v2/changes/77", "")
	if r := errOf(t, e); code != 404 || r.Message != `cannot find change with id "77"` {
		t.Fatalf("%+v", r)
	}
}

func TestSnapctlTakingTooLongAndOtherHooks(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk), fake.WithSnapctlTimeout(10*time.Second))
	got := make(chan env, 1)
	go func() {
		_, e := call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(s.Cookie("svcdemo"), "stop", "svcdemo.gamma"))
		got <- e
	}()
	waitTimers(clk, 3) // the 1s "Waiting for ... to stop" log, the 20s stop and the 10s snapctl timeout
	clk.Advance(10 * time.Second)
	e := <-got
	if r := errOf(t, e); r.Message != "snapctl: stop command is taking too long" {
		t.Fatalf("%+v", r)
	}
	// the change carries on and still blocks the snap
	if v := s.Changes(); v[len(v)-1].Ready || v[len(v)-1].Summary != `Running service command for snap "svcdemo"` || len(v[len(v)-1].SnapNames) != 0 {
		t.Fatalf("%+v", v[len(v)-1])
	}
	if err := s.AdvanceUntilIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Service("svcdemo", "gamma"); st.Active {
		t.Fatal("gamma still active")
	}

	// an install hook: snapctl makes its own change and ignores the hook's
	s.SetDurations("svcdemo", "slowstart", 5*time.Second, 0)
	h := s.StartHook("svcdemo", "install")
	go func() {
		_, e := call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(h.Cookie(), "start", "svcdemo.slowstart"))
		got <- e
	}()
	waitTimers(clk, 2)
	if err := s.AdvanceUntilReady(context.Background(), h.ChangeID()); err == nil {
		t.Fatal("hook change became ready by itself")
	}
	if e := <-got; e.Type != "sync" {
		t.Fatalf("%s", e.Result)
	}
	h.Fail("hook failed")
	if info, _ := s.ChangeByID(h.ChangeID()); info.Status != "Error" {
		t.Fatalf("%+v", info)
	}
}

func TestDropNextResponseCreatesChange(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()))
	s.DropNextResponse("POST", "/v2/apps")
	if _, _, err := callErr(s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.alpha"]}`); err == nil {
		t.Fatal("got an answer")
	}
	reqs := s.Requests()
	if len(reqs) != 1 || !reqs[0].Dropped || reqs[0].Change == "" {
		t.Fatalf("%+v", reqs)
	}
	if _, ok := s.ChangeByID(reqs[0].Change); !ok {
		t.Fatal("change not created")
	}
	if code, _ := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","names":["svcdemo.alpha"]}`); code != 202 {
		t.Fatal(code)
	}
}

func TestMaintenanceRestartAndLateSocket(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithoutListening())
	_, _, err := callErr(s.SocketPath(), "GET", "/v2/apps", "")
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("late socket: %v", err)
	}
	if err := s.StartListening(); err != nil {
		t.Fatal(err)
	}
	s.BeginMaintenance("daemon-restart", "daemon is restarting")
	_, e := call(t, s.SocketPath(), "GET", "/v2/apps?names=nosuch", "")
	if string(e.Maintenance) != `{"message":"daemon is restarting","kind":"daemon-restart"}` {
		t.Fatalf("maintenance %s", e.Maintenance)
	}
	// a long-poll in flight is answered 500 "request canceled"
	got := make(chan env, 1)
	go func() {
		_, e := call(t, s.SocketPath(), "GET", "/v2/notices?keys=999&timeout=1h", "")
		got <- e
	}()
	if err := s.WaitFor(context.Background(), func(v fake.View) bool { return v.InFlight() > 0 }); err != nil {
		t.Fatal(err)
	}
	s.StopListening()
	if e := <-got; e.StatusCode != 500 || !strings.Contains(string(e.Result), "request canceled") {
		t.Fatalf("%+v %s", e, e.Result)
	}
	if _, err := os.Stat(s.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket still there: %v", err)
	}
	if _, _, err := callErr(s.SocketPath(), "GET", "/v2/apps", ""); err == nil {
		t.Fatal("answered while stopped")
	}
	s.EndMaintenance()
	if err := s.StartListening(); err != nil {
		t.Fatal(err)
	}
	if _, e := call(t, s.SocketPath(), "GET", "/v2/apps", ""); e.Maintenance != nil {
		t.Fatal("maintenance left")
	}
}

func TestBatchOrderAndLatency(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(clk), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", After: []string{"containerd"}, StartDuration: time.Second},
		{Name: "containerd", Daemon: "notify", Before: []string{"kubelet"}, StartDuration: time.Second},
		{Name: "kube-proxy", Daemon: "simple", After: []string{"kubelet"}, StartDuration: time.Second},
	}}))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","names":["k8s.kube-proxy","k8s.kubelet","k8s.containerd"]}`)
	var order []string
	for i := 0; i < 3; i++ {
		clk.Advance(time.Second)
		for _, app := range []string{"containerd", "kubelet", "kube-proxy"} {
			if st, _ := s.Service("k8s", app); st.Active && !contains(order, app) {
				order = append(order, app)
			}
		}
		if len(order) != i+1 {
			t.Fatalf("after %ds: %v", i+1, order)
		}
	}
	if strings.Join(order, ",") != "containerd,kubelet,kube-proxy" {
		t.Fatal(order)
	}
	info, _ := s.ChangeByID(e.Change)
	if info.Tasks[0].Summary != `Run service command "start" for services ["containerd" "kube-proxy" "kubelet"] of snap "k8s"` {
		t.Fatal(info.Tasks[0].Summary)
	}

	s.SetLatency(2 * time.Second)
	got := make(chan env, 1)
	added := clk.TimerAdded()
	go func() { _, e := call(t, s.SocketPath(), "GET", "/v2/apps", ""); got <- e }()
	<-added
	clk.Advance(2 * time.Second)
	<-got
	r := s.Requests()[1]
	if r.Done.Sub(r.Time) != 2*time.Second {
		t.Fatalf("%+v", r)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func TestRealClockDurations(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Active: true, StopDuration: 30 * time.Millisecond},
	}}))
	start := time.Now()
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["k8s.kubelet"]}`)
	<-s.ChangeReady(e.Change)
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Fatalf("stopped after %v", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	// DropConnections cuts a long-poll in flight: the client gets no answer
	got := make(chan error, 1)
	go func() {
		_, _, err := callErr(s.SocketPath(), "GET", "/v2/notices?keys=999&timeout=1h", "")
		got <- err
	}()
	if err := s.WaitFor(ctx, func(v fake.View) bool { return v.InFlight() > 0 }); err != nil {
		t.Fatal(err)
	}
	s.DropConnections()
	if err := <-got; err == nil {
		t.Fatal("long-poll answered after DropConnections")
	}
	if code, _ := call(t, s.SocketPath(), "GET", "/v2/apps", ""); code != 200 {
		t.Fatal(code)
	}
}

func TestChangeNextWalksTasks(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()))
	chg := s.AddChange(fake.ChangeSpec{Kind: "install-snap", Snap: "svcdemo", Tasks: []fake.TaskSpec{
		{Kind: "mount-snap", Summary: "Mount"}, {Kind: "link-snap", Summary: "Link"}}})
	if !chg.Next() {
		t.Fatal("nothing to finish")
	}
	info := chg.Info()
	if info.Status != "Doing" || info.Tasks[0].Status != "Done" || info.Tasks[1].Status != "Doing" {
		t.Fatalf("%+v", info)
	}
	// a Done task in an unfinished change still blocks the snap
	if _, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.alpha"]}`); e.StatusCode != 400 {
		t.Fatalf("%s", e.Result)
	}
	chg.Next()
	if info := chg.Info(); !info.Ready || info.Status != "Done" || chg.Next() {
		t.Fatalf("%+v", info)
	}
}

func TestRestartDaemon(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
	back := s.RestartDaemon(5 * time.Second)
	if _, _, err := callErr(s.SocketPath(), "GET", "/v2/changes/"+e.Change, ""); err == nil {
		t.Fatal("answered during restart")
	}
	clk.Advance(5 * time.Second)
	<-back
	var ch change
	_, e2 := call(t, s.SocketPath(), "GET", "/v2/changes/"+e.Change, "")
	decode(t, e2.Result, &ch)
	if ch.Status != "Doing" || e2.Maintenance != nil {
		t.Fatalf("%s %s", e2.Result, e2.Maintenance)
	}
	clk.Advance(15 * time.Second)
	if info, _ := s.ChangeByID(e.Change); info.Status != "Done" {
		t.Fatalf("%+v", info)
	}
}

func TestSnapSocketObserveDeniedAndUnsuccessful(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithSnapSocketObserveDenied())
	code, e := call(t, s.SnapSocketPath(), "GET", "/v2/notices", "")
	if r := errOf(t, e); code != 403 || r.Kind != "login-required" || !strings.HasPrefix(r.Message, "could not determine snap name for pid: ") {
		t.Fatalf("%d %+v", code, r)
	}
	if code, _ := call(t, s.SocketPath(), "GET", "/v2/notices", ""); code != 200 {
		t.Fatal(code)
	}
	s.SetSnapctlUnsuccessful("is-connected", "", "not connected\n", 1)
	code, e = call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(s.Cookie("svcdemo"), "is-connected", "network"))
	r := errOf(t, e)
	if code != 200 || e.Type != "error" || r.Kind != "unsuccessful" || r.Message != "unsuccessful with exit code: 1" ||
		string(r.Value) != `{"exit-code":1,"stderr":"not connected\n","stdout":""}` {
		t.Fatalf("%d %+v %s", code, r, r.Value)
	}
}

// FaultLate: the client loses its connection at once; the request is
// acted on only when Hold is closed, and logged then.
func TestFaultLateActsAfterTheConnectionIsGone(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Active: true, Enabled: true}}}))
	hold := make(chan struct{})
	srv.InjectFault(fake.Fault{Kind: fake.FaultLate, Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold})
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", srv.SocketPath())
	}}}
	defer hc.CloseIdleConnections()
	rsp, err := hc.Post("http://localhost/v2/apps", "application/json", strings.NewReader(`{"action":"restart","names":["k8s.kubelet"]}`))
	if err == nil {
		rsp.Body.Close()
		t.Fatalf("answered %d; want the connection closed", rsp.StatusCode)
	}
	if n := srv.Counters().ChangesCreated; n != 0 {
		t.Fatalf("%d changes before Hold was closed", n)
	}
	close(hold)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Requests() == 1 }); err != nil {
		t.Fatal(err)
	}
	reqs := srv.Requests()
	if reqs[0].Change == "" || !reqs[0].Dropped || reqs[0].Fault != "late" || srv.Counters().ChangesCreated != 1 {
		t.Fatalf("request %+v, counters %+v", reqs[0], srv.Counters())
	}
}

// FaultWedge holds a request without acting on it until Hold is closed,
// then handles and answers it.
func TestFaultWedgeActsOnceReleased(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Active: true, Enabled: true}}}))
	hold := make(chan struct{})
	srv.InjectFault(fake.Fault{Kind: fake.FaultWedge, Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold})
	type answer struct {
		status int
		err    error
	}
	out := make(chan answer, 1)
	go func() {
		status, _, err := callErr(srv.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["k8s.kubelet"]}`)
		out <- answer{status, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.InFlight() > 0 }); err != nil {
		t.Fatal(err)
	}
	if n := srv.Counters().ChangesCreated; n != 0 {
		t.Fatalf("%d changes while wedged", n)
	}
	close(hold)
	a := <-out
	if a.err != nil || a.status != 202 || srv.Counters().ChangesCreated != 1 {
		t.Fatalf("answer %d, %v, counters %+v; want 202 and one change", a.status, a.err, srv.Counters())
	}
	if reqs := srv.Requests(); len(reqs) != 1 || reqs[0].Fault != "wedge" || reqs[0].Dropped {
		t.Fatalf("requests %+v", reqs)
	}
}

// RequestsTo counts a request as it arrives; Handled once snapd has acted
// on it. A held answer (a Fault's Hold without a Kind) is handled before
// it is held; a wedged request is not handled until its Hold is closed.
func TestRequestsToCountsArrivalsHandledCountsActions(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Active: true, Enabled: true}}}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wedge, held := make(chan struct{}), make(chan struct{})
	srv.InjectFault(fake.Fault{Kind: fake.FaultWedge, Method: "POST", Path: "/v2/apps", Times: 1, Hold: wedge})
	srv.InjectFault(fake.Fault{Method: "GET", Path: "/v2/changes", Times: 1, Hold: held})
	posted, listed := make(chan error, 1), make(chan error, 1)
	go func() {
		_, _, err := callErr(srv.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["k8s.kubelet"]}`)
		posted <- err
	}()
	go func() {
		_, _, err := callErr(srv.SocketPath(), "GET", "/v2/changes", "")
		listed <- err
	}()
	// The listing is acted on while its answer is held; the wedged request
	// has arrived and is not acted on.
	if err := srv.WaitFor(ctx, func(v fake.View) bool {
		return v.RequestsTo("POST /v2/apps") == 1 && v.Handled("GET /v2/changes") == 1
	}); err != nil {
		t.Fatal(err)
	}
	var handled, arrived int
	srv.WaitFor(ctx, func(v fake.View) bool {
		handled, arrived = v.Handled("POST /v2/apps"), v.RequestsTo("GET /v2/changes")
		return true
	})
	if handled != 0 || arrived != 1 || srv.Counters().ChangesCreated != 0 {
		t.Fatalf("wedged request handled %d times, listing arrived %d times, %d changes; want 0, 1, 0", handled, arrived, srv.Counters().ChangesCreated)
	}
	close(wedge)
	close(held)
	if err := errors.Join(<-posted, <-listed); err != nil {
		t.Fatal(err)
	}
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Handled("POST /v2/apps") == 1 }); err != nil {
		t.Fatal(err)
	}
	if n := srv.Counters().ChangesCreated; n != 1 {
		t.Fatalf("%d changes once the wedge ended; want 1", n)
	}
}
