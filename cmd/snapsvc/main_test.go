package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/snapsvc/snapsvc/cmd/clistyle/clistyletest"
	"github.com/snapsvc/snapsvc/fake"
)

// TestMain lets the test binary act as the snapsvc command inside scripts.
func TestMain(m *testing.M) {
	testscript.Main(m, map[string]func(){
		"snapsvc": func() { os.Exit(realMain()) },
	})
}

// harness is the per-script fake snapd and the proxy in front of it.
type harness struct {
	srv   *fake.Server
	proxy *proxy
}

type harnessKey struct{}

// awaitTimeout bounds every wait of a script on the CLI; it is a safety
// net against hangs, never a synchronisation.
const awaitTimeout = 30 * time.Second

// TestScripts runs testdata/script/*.txtar, each against its own fake
// snapd with the k8s snap (instant starts and stops). SNAPSVC_SOCKET
// points at a recording proxy in front of the fake; FAKE_SOCKET is the
// fake's own socket.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Setup: func(e *testscript.Env) error {
			// The scripts' snapsvc runs as the test does, in place of
			// root: the fake lets it through when the test is not root.
			// A command a script runs as nobody (as-nobody, as root)
			// meets snapd's refusal.
			opts := []fake.Option{fake.WithSnaps(k8sSnap(0))}
			if os.Geteuid() != 0 {
				opts = append(opts, fake.AllowNonRoot())
			}
			srv, err := fake.New(opts...)
			if err != nil {
				return err
			}
			px, err := startProxy(srv.SocketPath())
			if err != nil {
				srv.Close()
				return err
			}
			e.Defer(func() {
				px.Close()
				srv.Close()
			})
			e.Setenv("SNAPSVC_SOCKET", px.path)
			e.Setenv("FAKE_SOCKET", srv.SocketPath())
			e.Setenv("FAKE_DIR", srv.Dir())
			e.Values[harnessKey{}] = &harness{srv: srv, proxy: px}
			return nil
		},
		Condition: func(cond string) (bool, error) {
			switch cond {
			case "root":
				// Root, with setpriv to run a command as another user.
				_, err := exec.LookPath("setpriv")
				return os.Geteuid() == 0 && err == nil, nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"fake-hold":       cmdFakeHold,
			"fake-finish":     cmdFakeFinish,
			"fake-fail":       cmdFakeFail,
			"fake-fail-start": cmdFakeFailStart,
			"fake-set":        cmdFakeSet,
			"fake-service":    cmdFakeService,
			"fake-count":      cmdFakeCount,
			"await":           cmdAwait,
			"proxy-reset":     cmdProxyReset,
			"fake-listening":  cmdFakeListening,
			"fake-log":        cmdFakeLog,
			"as-nobody":       cmdAsNobody,
			"exits":           clistyletest.Exits,
		},
	})
}

func h(ts *testscript.TestScript) *harness { return ts.Value(harnessKey{}).(*harness) }

// fake-hold SNAP KIND: add a foreign change of KIND on SNAP that stays in
// progress until fake-finish; its id goes to $HELD.
func cmdFakeHold(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: fake-hold SNAP KIND")
	}
	chg := h(ts).srv.AddChange(fake.ChangeSpec{Kind: args[1], Snap: args[0], WithSnapNames: true})
	ts.Setenv("HELD", chg.ID())
}

func heldChange(ts *testscript.TestScript, args []string) *fake.Change {
	id := ts.Getenv("HELD")
	if len(args) > 0 {
		id = args[0]
	}
	chg := h(ts).srv.Change(id)
	if chg == nil {
		ts.Fatalf("no change %q in the fake", id)
	}
	return chg
}

// fake-finish [ID]: finish a held change (default $HELD).
func cmdFakeFinish(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) > 1 {
		ts.Fatalf("usage: fake-finish [ID]")
	}
	heldChange(ts, args).Finish()
}

// fake-fail ID MESSAGE: fail a held change.
func cmdFakeFail(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: fake-fail ID MESSAGE")
	}
	heldChange(ts, args[:1]).Fail(args[1])
}

func splitService(ts *testscript.TestScript, name string) (string, string) {
	snap, app, ok := strings.Cut(name, ".")
	if !ok {
		ts.Fatalf("want snap.app, got %q", name)
	}
	return snap, app
}

// fake-fail-start SNAP.APP: make starting the service fail like systemctl.
func cmdFakeFailStart(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: fake-fail-start SNAP.APP")
	}
	snap, app := splitService(ts, args[0])
	h(ts).srv.SetFailStart(snap, app, fake.SystemctlJobFailed(snap, app))
}

func parseState(ts *testscript.TestScript, words []string) (fake.AppState, map[string]bool) {
	var st fake.AppState
	given := map[string]bool{}
	for _, w := range words {
		switch w {
		case "enabled", "disabled":
			st.Enabled = w == "enabled"
			given["enabled"] = true
		case "active", "inactive":
			st.Active = w == "active"
			given["active"] = true
		default:
			ts.Fatalf("unknown state %q (want enabled, disabled, active or inactive)", w)
		}
	}
	return st, given
}

// fake-set SNAP.APP enabled|disabled active|inactive: set a service's state.
func cmdFakeSet(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 3 {
		ts.Fatalf("usage: fake-set SNAP.APP enabled|disabled active|inactive")
	}
	snap, app := splitService(ts, args[0])
	st, _ := parseState(ts, args[1:])
	h(ts).srv.SetService(snap, app, st)
}

// fake-service SNAP.APP STATE...: assert a service's state in the fake.
func cmdFakeService(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 {
		ts.Fatalf("usage: fake-service SNAP.APP [enabled|disabled] [active|inactive]")
	}
	snap, app := splitService(ts, args[0])
	want, given := parseState(ts, args[1:])
	got, ok := h(ts).srv.Service(snap, app)
	if !ok {
		ts.Fatalf("no service %s in the fake", args[0])
	}
	if (given["enabled"] && got.Enabled != want.Enabled) || (given["active"] && got.Active != want.Active) {
		ts.Fatalf("service %s is %+v, want %v", args[0], got, args[1:])
	}
}

// fake-count WHAT N: assert one of the fake's counters: "conflicts",
// "changes", or a request key such as "POST /v2/apps".
func cmdFakeCount(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: fake-count conflicts|changes|'METHOD /path' N")
	}
	want, err := strconv.Atoi(args[1])
	ts.Check(err)
	c := h(ts).srv.Counters()
	var got int
	switch args[0] {
	case "conflicts":
		got = c.Conflicts
	case "changes":
		got = c.ChangesCreated
	default:
		got = c.Requests[args[0]]
	}
	if got != want {
		ts.Fatalf("fake counted %d %s, want %d", got, args[0], want)
	}
}

// await [-response] [-n N] METHOD PATH [QUERY-SUBSTRING]: wait until the
// proxy has seen N (default 1) matching requests arrive (or, with
// -response, be answered).
func cmdAwait(ts *testscript.TestScript, neg bool, args []string) {
	phase, n := "request", 1
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "-response":
			phase = "response"
			args = args[1:]
		case "-n":
			if len(args) < 2 {
				ts.Fatalf("-n needs a count")
			}
			var err error
			n, err = strconv.Atoi(args[1])
			ts.Check(err)
			args = args[2:]
		default:
			ts.Fatalf("unknown flag %q", args[0])
		}
	}
	if neg || len(args) < 2 || len(args) > 3 {
		ts.Fatalf("usage: await [-response] [-n N] METHOD PATH [QUERY-SUBSTRING]")
	}
	query := ""
	if len(args) == 3 {
		query = args[2]
	}
	ctx, cancel := context.WithTimeout(context.Background(), awaitTimeout)
	defer cancel()
	px := h(ts).proxy
	err := px.await(ctx, n, func(ev proxyEvent) bool {
		return ev.Phase == phase && ev.Method == args[0] && ev.Path == args[1] && strings.Contains(ev.Query, query)
	})
	if err != nil {
		ts.Fatalf("no %s %s %s?%s seen: %v\nseen:\n%s", phase, args[0], args[1], query, err, px.summary())
	}
}

// proxy-reset: forget the requests seen so far, so the next await only
// counts later ones.
func cmdProxyReset(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 0 {
		ts.Fatalf("usage: proxy-reset")
	}
	px := h(ts).proxy
	px.mu.Lock()
	px.events = nil
	px.mu.Unlock()
}

// fake-listening on|off: the fake's sockets come back, or go away as
// while snapd restarts (the fake keeps its state).
func cmdFakeListening(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 || (args[0] != "on" && args[0] != "off") {
		ts.Fatalf("usage: fake-listening on|off")
	}
	if args[0] == "off" {
		h(ts).srv.StopListening()
		return
	}
	ts.Check(h(ts).srv.StartListening())
}

// as-nobody CODE snapsvc ARGS...: run the snapsvc command as user nobody
// (uid and gid 65534, through setpriv; the script needs [root]) and check
// its exit code, as exits does. The test binary is copied where nobody
// may run it; the fake's directory is left as it is (a user's
// permissions on it are what a script tests).
func cmdAsNobody(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) < 2 || args[1] != "snapsvc" {
		ts.Fatalf("usage: as-nobody CODE snapsvc [ARGS...]")
	}
	bin := ts.Getenv("NOBODY_BIN")
	if bin == "" {
		dir, err := os.MkdirTemp("", "snapsvc-nobody")
		ts.Check(err)
		ts.Defer(func() { os.RemoveAll(dir) })
		ts.Check(os.Chmod(dir, 0o755))
		self, err := os.Executable()
		ts.Check(err)
		in, err := os.Open(self)
		ts.Check(err)
		defer in.Close()
		bin = filepath.Join(dir, "snapsvc")
		out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
		ts.Check(err)
		_, err = io.Copy(out, in)
		ts.Check(err)
		ts.Check(out.Close())
		ts.Setenv("NOBODY_BIN", bin)
	}
	clistyletest.Exits(ts, false, append([]string{args[0], "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", bin}, args[2:]...))
}

// fake-log SNAP.APP MESSAGE: add a line to the service's journal, as the
// service's own output (snap logs shows it).
func cmdFakeLog(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 {
		ts.Fatalf("usage: fake-log SNAP.APP MESSAGE")
	}
	snap, app := splitService(ts, args[0])
	ts.Check(h(ts).srv.AppendLog(snap, app, args[1]))
}
