package fake_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)

// Aborting a service-control change while its task is Doing: the task runs
// to the end, the runner moves it Abort -> Undo, and with no undo handler
// it goes back to Done, so the change ends Done (overlord/state/taskrunner.go).
func TestAbortServiceControlEndsDone(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
	code, e2 := call(t, s.SocketPath(), "POST", "/v2/changes/"+e.Change, `{"action":"abort"}`)
	var ch change
	decode(t, e2.Result, &ch)
	if code != 200 || ch.Status != "Abort" || ch.Ready {
		t.Fatalf("%d %s", code, e2.Result)
	}
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
	info, _ := s.ChangeByID(e.Change)
	if info.Status != "Done" || info.Tasks[0].Status != "Done" || info.Err != "" {
		t.Fatalf("%+v", info)
	}
	if st, _ := s.Service("svcdemo", "gamma"); st.Active {
		t.Fatalf("gamma still active: the stop ran to the end")
	}
}

// A failing task aborts its change first (the task passes through Abort),
// so a failed change has one more change-update occurrence (4) than a
// successful one (3), as golden 2.77.1 notices-all shows; Done tasks of a
// foreign change are undone, and pending ones are put on Hold.
func TestFailureAbortsChange(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","names":["svcdemo.broken"]}`)
	code, n := call(t, s.SocketPath(), "GET", "/v2/notices?keys="+e.Change, "")
	var ns []struct {
		Occurrences int `json:"occurrences"`
	}
	decode(t, n.Result, &ns)
	if code != 200 || len(ns) != 1 || ns[0].Occurrences != 4 {
		t.Fatalf("%s", n.Result)
	}

	chg := s.AddChange(fake.ChangeSpec{Kind: "install-snap", Snap: "svcdemo", Tasks: []fake.TaskSpec{
		{Kind: "mount-snap", Summary: "Mount"}, {Kind: "link-snap", Summary: "Link"}, {Kind: "start-snap-services", Summary: "Start"}}})
	chg.Next()
	chg.Fail("boom")
	info := chg.Info()
	got := []string{info.Status, info.Tasks[0].Status, info.Tasks[1].Status, info.Tasks[2].Status}
	if strings.Join(got, " ") != "Error Undone Error Hold" || !info.Ready {
		t.Fatalf("%v", got)
	}
}

// start --enable that fails disables every service of the batch again,
// also one that was enabled before (wrappers/services.go StartServices:
// "always disable if enable was requested").
func TestFailedStartEnableDisablesAll(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","enable":true,"names":["svcdemo.alpha","svcdemo.broken"]}`)
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"alpha", "broken"} {
		if st, _ := s.Service("svcdemo", app); st.Enabled || st.Active {
			t.Fatalf("%s: %+v", app, st)
		}
	}
}

// A stop goes through the services in name order, not reverse start order
// (overlord/servicestate/service_control.go sorts only for start/restart).
func TestStopInNameOrder(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(clk), fake.WithSnaps(fake.Snap{Name: "k", Apps: []fake.App{
		{Name: "a", Daemon: "simple", Enabled: true, Active: true, Before: []string{"b"}, StopDuration: time.Second},
		{Name: "b", Daemon: "simple", Enabled: true, Active: true, StopDuration: time.Second},
	}}))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["k"]}`)
	clk.Advance(time.Second)
	a, _ := s.Service("k", "a")
	b, _ := s.Service("k", "b")
	if a.Active || !b.Active {
		t.Fatalf("after 1s: a=%+v b=%+v (a stops first)", a, b)
	}
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
}

// restart --reload of an inactive enabled service that fails names
// "reload-or-restart" (one systemctl call), a plain restart names "start"
// (systemd.Restart is Stop then Start).
func TestReloadFailureVerb(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k", Apps: []fake.App{
		{Name: "a", Daemon: "simple", Enabled: true, FailStart: "boom\n"},
	}}))
	for action, verb := range map[string]string{`"restart","reload":true`: "reload-or-restart", `"restart"`: "start"} {
		_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":`+action+`,"names":["k.a"]}`)
		if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
			t.Fatal(err)
		}
		info, _ := s.ChangeByID(e.Change)
		if !strings.Contains(info.Err, "systemctl command ["+verb+" snap.k.a.service]") {
			t.Fatalf("%s: %q", action, info.Err)
		}
	}
}

// "maintenance" decorates what a handler returns, errors included, but not
// the router's 404, 405, or access-check 403 (daemon/daemon.go ServeHTTP).
func TestMaintenanceOnlyOnHandlerResponses(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()))
	s.BeginMaintenance("daemon-restart", "daemon is restarting")
	for _, tc := range []struct {
		sock, method, path string
		code               int
		maint              bool
	}{
		{s.SocketPath(), "GET", "/v2/apps?names=svcdemo", 200, true},
		{s.SocketPath(), "GET", "/v2/apps?names=nosuch", 404, true},
		{s.SocketPath(), "GET", "/v2/changes/999", 404, true},
		{s.SocketPath(), "GET", "/v2/bogus", 404, false},
		{s.SocketPath(), "PUT", "/v2/apps", 405, false},
		{s.SnapSocketPath(), "PUT", "/v2/apps", 405, false}, // method before access
		{s.SnapSocketPath(), "GET", "/v2/apps", 403, false},
		{s.SocketPath(), "POST", "/v2/snapctl", 403, false},
	} {
		code, e := call(t, tc.sock, tc.method, tc.path, "")
		if code != tc.code || (len(e.Maintenance) > 0) != tc.maint {
			t.Errorf("%s %s: %d maintenance=%s", tc.method, tc.path, code, e.Maintenance)
		}
	}
}

// appInfosFor (daemon/api_apps.go): "snap.app" of an unknown snap is
// app-not-found; a snap without apps of the wanted kind "has no apps";
// only the first "names" value counts; "global" must be a bool (2.63+).
func TestAppsNotFoundRules(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo(), fake.Snap{Name: "empty"}))
	for _, tc := range []struct {
		path, kind, msg string
		code            int
	}{
		{"/v2/apps?names=nosuch.app", "app-not-found", `snap "nosuch" has no app "app"`, 404},
		{"/v2/apps?names=nosuch.app&select=service", "app-not-found", `snap "nosuch" has no service "app"`, 404},
		{"/v2/apps?names=nosuch", "snap-not-found", `snap "nosuch" not found`, 404},
		{"/v2/apps?names=empty", "app-not-found", `snap "empty" has no apps`, 404},
		{"/v2/apps?names=nosuch,empty", "app-not-found", `snap "empty" has no apps`, 404},
		{"/v2/apps?global=maybe", "", `invalid global parameter: "maybe"`, 400},
	} {
		code, e := call(t, s.SocketPath(), "GET", tc.path, "")
		if r := errOf(t, e); code != tc.code || r.Kind != tc.kind || r.Message != tc.msg {
			t.Errorf("%s: %d %+v", tc.path, code, r)
		}
	}
	code, e := call(t, s.SocketPath(), "GET", "/v2/apps?names=svcdemo.alpha&names=nosuch", "")
	var apps []map[string]any
	decode(t, e.Result, &apps)
	if code != 200 || len(apps) != 1 {
		t.Fatalf("%d %s", code, e.Result)
	}
	code, e = call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","names":["svcdemo.alpha"],"scope":["bogus"]}`)
	if r := errOf(t, e); code != 400 || r.Message != `cannot decode request body into service operation: cannot unmarshal, expected one of: "system", "user"` {
		t.Fatalf("%d %+v", code, r)
	}
	code, e = call(t, s.SocketPath(), "POST", "/v2/changes/999", `{`)
	if r := errOf(t, e); code != 404 || r.Message != `cannot find change with id "999"` {
		t.Fatalf("abort of unknown change with a bad body: %d %+v", code, r)
	}
}

// snapctl service commands: exec-command summaries as servicestate.Control
// builds them; "<snap>" selects every service; go-flags argument errors
// come before the context check.
func TestSnapctlServiceCommandDetails(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	ck := s.Cookie("svcdemo")
	run := func(args ...string) (int, env) {
		return call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(ck, args...))
	}
	summaries := func() []string {
		ch := s.Changes()
		var out []string
		for _, tk := range ch[len(ch)-1].Tasks {
			if tk.Kind == "exec-command" {
				out = append(out, tk.Summary)
			}
		}
		return out
	}
	if code, e := run("stop", "--disable", "svcdemo.beta", "svcdemo.alpha"); code != 200 {
		t.Fatalf("%d %s", code, e.Result)
	}
	if got := strings.Join(summaries(), "|"); got != "disable of [svcdemo.beta svcdemo.alpha]|stop of [svcdemo.beta svcdemo.alpha]" {
		t.Fatal(got)
	}
	if code, e := run("restart", "--reload", "svcdemo.alpha"); code != 200 {
		t.Fatalf("%d %s", code, e.Result)
	}
	if got := strings.Join(summaries(), "|"); got != "reload-or-restart of [svcdemo.alpha]" {
		t.Fatal(got)
	}
	// "svcdemo" ends the name list: every service, what follows is ignored
	if code, e := run("start", "svcdemo.beta", "svcdemo", "svcdemo.nosuch"); code != 400 || !strings.Contains(errOf(t, e).Message, "broken") {
		// the whole-snap start includes "broken", whose start fails
		t.Fatalf("%d %s", code, e.Result)
	}
	code, e := call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody("bogus", "start"))
	if r := errOf(t, e); code != 400 || r.Message != "snapctl: the required argument `<service> (at least 1 argument)` was not provided" {
		t.Fatalf("%d %+v", code, r)
	}
}

// Service commands queued by a configure hook wait for every task already
// in the hook's change, so two queued commands run one after the other
// (ctlcmd/helpers.go queueCommand).
func TestConfigureHookQueuesInOrder(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	h := s.StartHook("svcdemo", "configure")
	for _, args := range [][]string{{"stop", "svcdemo.gamma"}, {"restart", "svcdemo.alpha"}} {
		if code, e := call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(h.Cookie(), args...)); code != 200 {
			t.Fatalf("%d %s", code, e.Result)
		}
	}
	h.Finish()
	info, _ := s.ChangeByID(h.ChangeID())
	var got []string
	for _, tk := range info.Tasks {
		got = append(got, tk.Kind+":"+tk.Status)
	}
	// gamma's stop takes 20s; alpha's restart has not started
	if strings.Join(got, " ") != "run-hook:Done exec-command:Done service-control:Doing exec-command:Do service-control:Do" {
		t.Fatal(got)
	}
	if err := s.AdvanceUntilReady(context.Background(), h.ChangeID()); err != nil {
		t.Fatal(err)
	}
}

// Notices: user-id / users validation, and notices expire 7 days after
// their last occurrence (overlord/state/notices.go).
func TestNoticesFiltersAndExpiry(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	if err := s.AdvanceUntilReady(context.Background(), e.Change); err != nil {
		t.Fatal(err)
	}
	for q, msg := range map[string]string{
		"user-id=abc":         `invalid "user-id" filter: strconv.ParseInt: parsing "abc": invalid syntax`,
		"user-id=1,2":         `invalid "user-id" filter: must only include one "user-id"`,
		"users=some":          `invalid "users" filter: must be "all"`,
		"users=all&user-id=0": `cannot use both "users" and "user-id" parameters`,
	} {
		code, e := call(t, s.SocketPath(), "GET", "/v2/notices?"+q, "")
		if r := errOf(t, e); code != 400 || r.Message != msg {
			t.Errorf("%s: %d %+v", q, code, r)
		}
	}
	count := func() int {
		_, e := call(t, s.SocketPath(), "GET", "/v2/notices?user-id=1000", "")
		var ns []any
		decode(t, e.Result, &ns)
		return len(ns)
	}
	if n := count(); n != 1 {
		t.Fatalf("public notice not matched by user-id filter: %d", n)
	}
	clk.Advance(7*24*time.Hour + time.Second)
	if n := count(); n != 0 {
		t.Fatalf("expired notice still served: %d", n)
	}
}
