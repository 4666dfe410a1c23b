package fake_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/conformance"
)

// goldenCheck compares a body with the repository's capture
// testdata/snapd-golden/<version>/<name>.json (status code included).
func goldenCheck(t *testing.T, version, name string, code int, body []byte) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join("..", "testdata", "snapd-golden", version, name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var env struct {
		StatusCode int `json:"status-code"`
	}
	json.Unmarshal(want, &env)
	if code != env.StatusCode {
		t.Errorf("%s/%s: HTTP %d, want %d (%s)", version, name, code, env.StatusCode, body)
	}
	if d := conformance.Compare(want, body); len(d) > 0 {
		t.Errorf("%s/%s differs from snapd:\n  %s\n  got: %s", version, name, strings.Join(d, "\n  "), body)
	}
}

func do(t *testing.T, sock, method, path, body string) (int, []byte) {
	t.Helper()
	code, b, err := conformance.Do(context.Background(), sock, method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return code, b
}

// svcdemoWithHook is the captures' svcdemo with its configure hook, which
// sleeps $(snapctl get hook-sleep) seconds.
func svcdemoWithHook() fake.Snap {
	sn := conformance.SvcdemoSnap()
	sn.Hooks = []string{"configure"}
	sn.ConfigureHookSleepKey = "hook-sleep"
	return sn
}

// TestGoldenConfigure replays the captures' configure-hook scenario (snapd
// 2.68.3 and 2.77.1, capture-new): `snap set` makes a configure-snap change
// whose hook runs 15 s; service commands and a second set conflict with
// it; the values are readable once it is done.
func TestGoldenConfigure(t *testing.T) {
	for _, v := range []fake.Version{fake.Version268, fake.Version277} {
		t.Run(string(v), func(t *testing.T) {
			clk := fake.NewManualClock(t0)
			s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(v), fake.WithClock(clk), fake.WithSnaps(svcdemoWithHook()))
			main, ver := s.SocketPath(), string(v)

			code, b := do(t, main, "PUT", "/v2/snaps/svcdemo/conf", `{"hook-sleep":15,"foo":"bar"}`)
			goldenCheck(t, ver, "put-conf-slow", code, b)
			id := changeID(t, b)
			code, b = do(t, main, "GET", "/v2/changes/"+id, "")
			goldenCheck(t, ver, "change-configure-doing", code, b)
			code, b = do(t, main, "GET", "/v2/changes?select=in-progress", "")
			goldenCheck(t, ver, "changes-in-progress-configure", code, b)
			code, b = do(t, main, "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
			goldenCheck(t, ver, "conflict-restart-during-configure", code, b)
			code, b = do(t, main, "POST", "/v2/apps", `{"action":"stop","names":["svcdemo"]}`)
			goldenCheck(t, ver, "conflict-stop-snap-during-configure", code, b)
			code, b = do(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(s.Cookie("svcdemo"), "restart", "svcdemo.alpha"))
			goldenCheck(t, ver, "snapctl-restart-during-configure", code, b)
			code, b = do(t, main, "PUT", "/v2/snaps/svcdemo/conf", `{"foo":"baz"}`)
			goldenCheck(t, ver, "put-conf-during-configure", code, b)
			// the values are committed only when the hook succeeds
			if _, ok := s.Config("svcdemo", "foo"); ok {
				t.Errorf("foo readable while the hook runs")
			}

			clk.Advance(15*time.Second - time.Millisecond)
			if info, _ := s.ChangeByID(id); info.Ready {
				t.Fatalf("configure change ready before the hook's 15 s: %+v", info)
			}
			clk.Advance(time.Millisecond)
			code, b = do(t, main, "GET", "/v2/changes/"+id, "")
			goldenCheck(t, ver, "change-configure-done", code, b)
			if info, _ := s.ChangeByID(id); !info.ReadyTime.Equal(t0.Add(15 * time.Second)) {
				t.Errorf("ready at %v, want t0+15s", info.ReadyTime)
			}
			code, b = do(t, main, "GET", "/v2/snaps/svcdemo/conf?keys=foo,hook-sleep", "")
			goldenCheck(t, ver, "conf-after", code, b)
			// snapctl get inside the snap reads the same storage
			_, e := call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(s.Cookie("svcdemo"), "get", "foo"))
			if !strings.Contains(string(e.Result), `"stdout":"bar\n"`) {
				t.Errorf("snapctl get foo: %s", e.Result)
			}

			// hook-sleep 0: the hook ends at once
			code, b = do(t, main, "PUT", "/v2/snaps/svcdemo/conf", `{"hook-sleep":0}`)
			goldenCheck(t, ver, "put-conf-reset", code, b)
			if info, _ := s.ChangeByID(changeID(t, b)); info.Status != "Done" {
				t.Errorf("hook-sleep 0: %s", info.Status)
			}
		})
	}
}

// TestGoldenConfConflictDuringInstall: PUT conf while an install-snap
// change holds the snap (2.77.1 capture-extra).
func TestGoldenConfConflictDuringInstall(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(fake.NewManualClock(t0)), fake.WithSnaps(svcdemoWithHook()))
	s.AddChange(fake.ChangeSpec{Kind: "install-snap", Snap: "svcdemo"})
	code, b := do(t, s.SocketPath(), "PUT", "/v2/snaps/svcdemo/conf", `{"foo":"qux"}`)
	goldenCheck(t, "2.77.1", "x-conflict-conf-during-install", code, b)
	code, b = do(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	goldenCheck(t, "2.77.1", "x-conflict-apps-during-install", code, b)
}

func TestSnapConf(t *testing.T) {
	clk := fake.NewManualClock(t0)
	held := svcdemoWithHook()
	held.Name, held.ConfigureHookSleepKey, held.ConfigureHookDuration = "held", "", -1
	nohook := fake.Snap{Name: "nohook", Apps: []fake.App{{Name: "d", Daemon: "simple"}},
		Config: map[string]any{"a": map[string]any{"b": 1}}}
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(clk), fake.WithSnaps(svcdemoWithHook(), held, nohook))
	main := s.SocketPath()

	// whole document, dotted keys, missing keys, unknown snap
	code, e := call(t, main, "GET", "/v2/snaps/nohook/conf", "")
	if code != 200 || string(e.Result) != `{"a":{"b":1}}` {
		t.Errorf("root document: %d %s", code, e.Result)
	}
	code, e = call(t, main, "GET", "/v2/snaps/nohook/conf?keys=a.b", "")
	if code != 200 || string(e.Result) != `{"a.b":1}` {
		t.Errorf("a.b: %d %s", code, e.Result)
	}
	code, e = call(t, main, "GET", "/v2/snaps/nohook/conf?keys=nosuch", "")
	if r := errOf(t, e); code != 400 || r.Kind != "option-not-found" || r.Message != `snap "nohook" has no "nosuch" configuration option` ||
		string(r.Value) != `{"SnapName":"nohook","Key":"nosuch"}` {
		t.Errorf("missing key: %d %+v %s", code, r, r.Value)
	}
	code, e = call(t, main, "GET", "/v2/snaps/nosuch/conf", "")
	if code != 200 || string(e.Result) != `{}` {
		t.Errorf("unknown snap's root document (snapd does not check the snap): %d %s", code, e.Result)
	}
	code, e = call(t, main, "PUT", "/v2/snaps/nosuch/conf", `{"a":1}`)
	if r := errOf(t, e); code != 404 || r.Kind != "snap-not-found" || r.Message != `snap "nosuch" is not installed` || string(r.Value) != `"nosuch"` {
		t.Errorf("PUT unknown snap: %d %+v", code, r)
	}
	code, e = call(t, main, "PUT", "/v2/snaps/nohook/conf", `[1]`)
	if r := errOf(t, e); code != 400 || !strings.HasPrefix(r.Message, "cannot decode request body into patch values: ") {
		t.Errorf("bad body: %d %+v", code, r)
	}
	code, _ = call(t, s.SnapSocketPath(), "GET", "/v2/snaps/nohook/conf", "")
	if code != 403 {
		t.Errorf("conf on the snap socket: %d", code)
	}

	// a snap without a configure hook: the change fails as snapd's does
	_, e = call(t, main, "PUT", "/v2/snaps/nohook/conf", `{"x":1}`)
	info, _ := s.ChangeByID(e.Change)
	if info.Status != "Error" || info.Err != "cannot perform the following tasks:\n- Run configure hook of \"nohook\" snap (snap \"nohook\" has no \"configure\" hook)" {
		t.Errorf("no hook: %+v", info)
	}
	if _, ok := s.Config("nohook", "x"); ok {
		t.Error("a failed configure committed its patch")
	}
	// an empty patch runs the hook only "if present"
	_, e = call(t, main, "PUT", "/v2/snaps/nohook/conf", `{}`)
	if info, _ := s.ChangeByID(e.Change); info.Status != "Done" || info.Tasks[0].Summary != `Run configure hook of "nohook" snap if present` {
		t.Errorf("empty patch: %+v", info)
	}
	// invalid key: the task fails when the hook context applies the patch
	_, e = call(t, main, "PUT", "/v2/snaps/svcdemo/conf", `{"Bad_Key":1}`)
	if info, _ := s.ChangeByID(e.Change); info.Status != "Error" || !strings.Contains(info.Err, `invalid option name: "Bad_Key"`) {
		t.Errorf("invalid key: %+v", info)
	}
	// null unsets
	_, e = call(t, main, "PUT", "/v2/snaps/svcdemo/conf", `{"a.b":"x","c":2}`)
	_, e = call(t, main, "PUT", "/v2/snaps/svcdemo/conf", `{"a.b":null}`)
	_, e = call(t, main, "GET", "/v2/snaps/svcdemo/conf", "")
	if string(e.Result) != `{"a":{},"c":2}` {
		t.Errorf("after unset: %s", e.Result)
	}

	// a held configure hook: test-controlled, committed on Finish
	_, e = call(t, main, "PUT", "/v2/snaps/held/conf", `{"k":"v"}`)
	id := e.Change
	if err := s.AdvanceUntilReady(context.Background(), id); err == nil {
		t.Fatal("a held hook became ready by advancing the clock")
	}
	code, e = call(t, main, "POST", "/v2/apps", `{"action":"restart","names":["held.alpha"]}`)
	if r := errOf(t, e); code != 400 || r.Kind != "" || r.Message != `snap "held" has "configure-snap" change in progress` {
		t.Errorf("apps during held hook: %d %+v", code, r)
	}
	s.Change(id).Finish()
	if v, ok := s.Config("held", "k"); !ok || v != "v" {
		t.Errorf("after Finish: %v %v", v, ok)
	}
	_, e = call(t, main, "GET", "/v2/changes?for=held&select=all", "")
	if !strings.Contains(string(e.Result), `"kind":"configure-snap"`) {
		t.Errorf("configure-snap change not listed for=held (it has snap-names): %s", e.Result)
	}
}
