package fake_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/conformance"
)

// refusedWithin calls the fake and fails the test if no answer comes
// within 10 s: a snapctl service command the fake let through would wait
// for its change on the manual clock for good.
func refusedWithin(t *testing.T, sock, method, path, body string) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	code, b, err := conformance.Do(ctx, sock, method, path, body)
	if err != nil {
		t.Fatalf("%s %s %s: %v (let through, and waiting?)", method, path, body, err)
	}
	return code, b
}

// unauthorizedBody is what snapd answers a caller who is not root on an
// authenticatedAccess route: daemon/access.go checkAccess returns
// Unauthorized("access denied") (with or without a polkit action: polkit
// failing or saying no ends the same), daemon/errors.go makeErrorResponder
// gives 401 the kind login-required, and daemon/response.go serialises
// type, status-code, status, result in this order. Byte for byte.
const unauthorizedBody = `{"type":"error","status-code":401,"status":"Unauthorized","result":{"message":"access denied","kind":"login-required"}}`

// guarded is one request snapd lets only root make, and what the fake
// answers root (the status once the access check passes).
type guarded struct {
	name, method, path, body string
	rootStatus               int
}

// guardedRoutes are the fake's authenticatedAccess routes on snapd.socket
// (daemon/api_apps.go appsCmd.WriteAccess and logsCmd, api_general.go
// stateChangeCmd.WriteAccess and warningsCmd.WriteAccess, api_snap_conf.go,
// api_snaps.go snapCmd/snapsCmd.WriteAccess).
func guardedRoutes(change string) []guarded {
	return []guarded{
		{"restart", "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`, 202},
		{"stop", "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.alpha"]}`, 202},
		{"start", "POST", "/v2/apps", `{"action":"start","names":["svcdemo.slowstart"]}`, 202},
		{"abort", "POST", "/v2/changes/" + change, `{"action":"abort"}`, 200},
		{"logs", "GET", "/v2/logs?names=svcdemo", "", 200},
		{"get-conf", "GET", "/v2/snaps/svcdemo/conf", "", 200},
		{"set-conf", "PUT", "/v2/snaps/svcdemo/conf", `{"hook-sleep":1}`, 202},
		{"okay-warnings", "POST", "/v2/warnings", `{"action":"okay","timestamp":"2026-12-02T14:00:00Z"}`, 200},
		{"snap-op", "POST", "/v2/snaps/svcdemo", `{"action":"refresh"}`, 400},
		{"snaps-op", "POST", "/v2/snaps", `{"action":"refresh"}`, 400},
	}
}

// accessServer is a fake with svcdemo, a held change to abort, and every
// caller taken for uid.
func accessServer(t *testing.T, v fake.Version, uid int, opts ...fake.Option) (*fake.Server, *fake.Change) {
	t.Helper()
	sn := svcdemoWithHook()
	sn.Config = map[string]any{"hook-sleep": 0}
	s := fake.NewServer(t, append([]fake.Option{fake.WithVersion(v), fake.WithClock(fake.NewManualClock(t0)),
		fake.WithSnaps(sn, fake.Snap{Name: "other", Apps: []fake.App{{Name: "d", Daemon: "simple"}}}), fake.WithPeerUID(uid)}, opts...)...)
	// another snap's change, so that the service commands do not conflict
	return s, s.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "other"})
}

// TestNonRootRefused checks every route snapd lets only root use, on each
// captured version: a caller who is not root gets snapd's 401 body byte
// for byte (no maintenance: the access check's answer is served before
// the handler), and nothing happens; root and AllowNonRoot get through.
func TestNonRootRefused(t *testing.T) {
	for _, v := range []fake.Version{fake.Version257, fake.Version268, fake.Version277} {
		for _, r := range guardedRoutes("1") {
			t.Run(string(v)+"/"+r.name, func(t *testing.T) {
				s, held := accessServer(t, v, 1000)
				s.BeginMaintenance("daemon-restart", "daemon is restarting")
				code, b := do(t, s.SocketPath(), r.method, r.path, r.body)
				if code != 401 || string(b) != unauthorizedBody {
					t.Errorf("uid 1000: %d %s\nwant 401 %s", code, b, unauthorizedBody)
				}
				if n := s.Counters().ChangesCreated; n != 1 {
					t.Errorf("a refused request made a change (%d changes)", n)
				}
				if st := held.Info().Status; st != "Doing" {
					t.Errorf("the held change is %s: the refused abort acted", st)
				}
				if st, _ := s.Service("svcdemo", "alpha"); !st.Active {
					t.Error("a refused stop stopped alpha")
				}
				reqs := s.Requests()
				if last := reqs[len(reqs)-1]; last.UID != 1000 || last.Status != 401 || last.Kind != "login-required" {
					t.Errorf("request log: %+v", last)
				}

				for _, tc := range []struct {
					name string
					uid  int
					opts []fake.Option
				}{{"root", 0, nil}, {"uid 1000 with AllowNonRoot", 1000, []fake.Option{fake.AllowNonRoot()}}} {
					s, _ := accessServer(t, v, tc.uid, tc.opts...)
					if code, b := do(t, s.SocketPath(), r.method, r.path, r.body); code != r.rootStatus {
						t.Errorf("%s: %d %s, want %d", tc.name, code, b, r.rootStatus)
					}
				}
			})
		}
	}
}

// TestNonRootReads checks the openAccess routes: a caller who is not root
// reads what root reads.
func TestNonRootReads(t *testing.T) {
	for _, v := range []fake.Version{fake.Version257, fake.Version277} {
		for _, path := range []string{"/v2/apps?names=svcdemo", "/v2/changes?select=all", "/v2/changes/1",
			"/v2/notices", "/v2/snaps", "/v2/snaps/svcdemo", "/v2/find?q=x", "/v2/warnings", "/v2/system-info"} {
			s, _ := accessServer(t, v, 1000)
			code, b := do(t, s.SocketPath(), "GET", path, "")
			rs, _ := accessServer(t, v, 0)
			rcode, _ := do(t, rs.SocketPath(), "GET", path, "")
			if code != rcode || code == 401 || code == 403 {
				t.Errorf("%s GET %s as uid 1000: %d %s; root: %d", v, path, code, b, rcode)
			}
		}
	}
}

// TestAccessCheckOrder checks what snapd checks before the caller's uid
// (daemon/daemon.go Command.ServeHTTP, daemon/access.go checkAccess): the
// method (405), then the socket (403 "access denied").
func TestAccessCheckOrder(t *testing.T) {
	s, _ := accessServer(t, fake.Version277, 1000)
	if code, b := do(t, s.SocketPath(), "DELETE", "/v2/apps", ""); code != 405 || !strings.Contains(string(b), `method \"DELETE\" not allowed`) {
		t.Errorf("DELETE /v2/apps as uid 1000: %d %s, want 405", code, b)
	}
	want := `{"type":"error","status-code":403,"status":"Forbidden","result":{"message":"access denied","kind":"login-required"}}`
	for _, r := range guardedRoutes("1") {
		if code, b := do(t, s.SnapSocketPath(), r.method, r.path, r.body); code != 403 || string(b) != want {
			t.Errorf("%s %s on the snap socket as uid 1000: %d %s, want 403 %s", r.method, r.path, code, b, want)
		}
	}
}

// TestSnapctlNonRoot checks snapctl's own rule (overlord/hookstate/ctlcmd
// isAllowedToRun, answered by daemon/api_snapctl.go as Forbidden): a
// caller who is not root may run only nonRootAllowed commands (services,
// get, ...) or ask for help; the refusal comes before the command is
// parsed or its context looked at, and is a handler's answer (it carries
// "maintenance").
func TestSnapctlNonRoot(t *testing.T) {
	for _, v := range []fake.Version{fake.Version257, fake.Version268, fake.Version277} {
		t.Run(string(v), func(t *testing.T) {
			s, _ := accessServer(t, v, 1000)
			cookie := s.Cookie("svcdemo")
			for _, args := range [][]string{
				{"restart", "svcdemo.alpha"}, {"stop", "svcdemo.alpha"}, {"start", "svcdemo.slowstart"},
				{"set", "a=1"}, {"unset", "a"}, {"frob"}, {"restart", "--", "-h"},
			} {
				if v == fake.Version257 && args[len(args)-1] == "-h" {
					continue // before 2.64 a -h after "--" still counted
				}
				want := `{"type":"error","status-code":403,"status":"Forbidden","result":{"message":"cannot use \"` + args[0] +
					`\" with uid 1000, try with sudo","kind":"login-required"}}`
				if code, b := refusedWithin(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(cookie, args...)); code != 403 || string(b) != want {
					t.Errorf("snapctl %v as uid 1000: %d %s\nwant 403 %s", args, code, b, want)
				}
				// before the context: a bad cookie is refused the same
				if code, _ := refusedWithin(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody("bogus", args...)); code != 403 {
					t.Errorf("snapctl %v with a bad cookie as uid 1000: %d, want 403", args, code)
				}
			}
			if st, _ := s.Service("svcdemo", "alpha"); !st.Active || s.Counters().ChangesCreated != 1 {
				t.Errorf("a refused snapctl command acted: alpha %+v, %d changes", st, s.Counters().ChangesCreated)
			}
			for _, args := range [][]string{{"services", "svcdemo.alpha"}, {"get", "hook-sleep"}} {
				if code, b := do(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(cookie, args...)); code != 200 {
					t.Errorf("snapctl %v as uid 1000: %d %s, want 200", args, code, b)
				}
			}
			if v == fake.Version257 {
				// -h anywhere, even after "--": allowed, then parsed
				if code, b := do(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(cookie, "restart", "--", "-h")); code == 403 {
					t.Errorf("2.57 snapctl restart -- -h as uid 1000: %d %s", code, b)
				}
			}
			s.BeginMaintenance("daemon-restart", "daemon is restarting")
			_, b := refusedWithin(t, s.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(cookie, "restart", "svcdemo.alpha"))
			if !strings.Contains(string(b), `"maintenance":{"message":"daemon is restarting","kind":"daemon-restart"}`) {
				t.Error("snapctl's refusal lacks maintenance: it is a handler's answer")
			}

			root, _ := accessServer(t, v, 0)
			if code, b := do(t, root.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(root.Cookie("svcdemo"), "restart", "svcdemo.alpha")); code != 200 {
				t.Errorf("snapctl restart as root: %d %s", code, b)
			}
			allowed, _ := accessServer(t, v, 1000, fake.AllowNonRoot())
			if code, b := do(t, allowed.SnapSocketPath(), "POST", "/v2/snapctl", cookieBody(allowed.Cookie("svcdemo"), "restart", "svcdemo.alpha")); code != 200 {
				t.Errorf("snapctl restart as uid 1000 with AllowNonRoot: %d %s", code, b)
			}
		})
	}
}

// TestPeerCredentials checks that the fake judges the real caller, read
// from the socket: this test process (root in CI, a developer otherwise)
// is let through only as root, and the request log names its uid.
func TestPeerCredentials(t *testing.T) {
	s := fake.NewServer(t, fake.WithSnaps(demo()))
	code, b := do(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	uid := os.Geteuid()
	switch {
	case uid == 0 && code != 202:
		t.Errorf("as root: %d %s, want 202", code, b)
	case uid != 0 && (code != 401 || string(b) != unauthorizedBody):
		t.Errorf("as uid %d: %d %s, want 401 %s", uid, code, b, unauthorizedBody)
	}
	if got := s.Requests()[0].UID; got != uid {
		t.Errorf("request log: uid %d, want %d", got, uid)
	}
	allowed := fake.NewServer(t, fake.WithSnaps(demo()), fake.AllowNonRoot())
	if code, b := do(t, allowed.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`); code != 202 {
		t.Errorf("with AllowNonRoot as uid %d: %d %s, want 202", uid, code, b)
	}
}
