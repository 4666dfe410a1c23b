//go:build realsnapd

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)

// TestSnapClientMatchesRealSnapd drives Debian's own snap client through
// the same steps twice at once: the container's snap against the real
// snapd, and the same snapd package's snap (fetched on the host by run.sh
// with apt-get download and dpkg-deb -x, never installed) against the fake
// serving <root>/run/snapd.socket, run as SNAPPY_GLOBAL_ROOT=<root>
// SNAP_REEXEC=0 snap .... Every step's exit code, stdout and stderr must be
// the same after normalising what must differ between two daemons: change
// ids, times, the changes the scenario did not make, and column widths.
// The steps named *-user run snap as nobody (setpriv): snapd refuses such
// a user what it lets only root do, and so must the fake (no
// AllowNonRoot). Both transcripts are written to
// $SNAPSVC_REALSNAPD_TRANSCRIPTS/{real,fake}.
func TestSnapClientMatchesRealSnapd(t *testing.T) {
	e := loadEnv(t)
	hostSnap := os.Getenv("SNAPSVC_REALSNAPD_SNAP_CLIENT")
	if hostSnap == "" {
		t.Fatal("SNAPSVC_REALSNAPD_SNAP_CLIENT is not set (run.sh fetches Debian's snap client)")
	}
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() {
		w.ensureBaseline(t)
		w.waitChange(t, w.setConf(t, map[string]any{"hook-sleep": 0}), time.Minute)
	})

	// A root, and a copy of the host's snap, that nobody may reach (the
	// client cache's directories are root's alone), as /run and
	// /usr/bin/snap are in the container.
	root, err := os.MkdirTemp("", "snapclient-root")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.MkdirAll(filepath.Join(root, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	userSnap := filepath.Join(root, "snap")
	if b, err := os.ReadFile(hostSnap); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(userSnap, b, 0o755); err != nil {
		t.Fatal(err)
	}
	fv := fakeVersion(e.Version)
	fs := fake.NewServer(t, fake.WithVersion(fv), fake.WithSnaps(svcdemoForFake(e.Slow)), fake.WithDir(filepath.Join(root, "run")))
	if want := filepath.Join(root, "run", "snapd.socket"); fs.SocketPath() != want {
		t.Fatalf("fake socket at %s, want %s", fs.SocketPath(), want)
	}
	home := t.TempDir()
	clientEnv := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "TZ=UTC", "SNAP_REEXEC=0"}

	real := &clientSide{
		name: "real snapd " + e.Version, wire: w,
		command: func(ctx context.Context, user bool, args []string) *exec.Cmd {
			// Namespaces by path: nsenter -t PID resolves PID in the
			// caller's PID namespace, and this test runs in snapd's,
			// where the container's init (a host pid in e.Leader) is 1.
			var a []string
			for _, ns := range []string{"mount", "uts", "ipc", "net", "pid", "cgroup"} {
				file := map[string]string{"mount": "mnt"}[ns]
				if file == "" {
					file = ns
				}
				a = append(a, fmt.Sprintf("--%s=/proc/%s/ns/%s", ns, e.Leader, file))
			}
			a = append(a, "--")
			if user {
				a = append(a, asNobody...)
			}
			a = append(append(a, "env", "-i"), clientEnv...)
			if user {
				a = append(a, "HOME=/nonexistent", "snap")
			} else {
				a = append(a, "HOME=/root", "snap")
			}
			return exec.CommandContext(ctx, "nsenter", append(a, args...)...)
		},
		// A configure hook that sleeps: snapd's own configure-snap change.
		hold: func() (string, error) {
			r, err := w.doErr("PUT", "/v2/snaps/svcdemo/conf", map[string]any{"hook-sleep": 90})
			if err != nil || r.StatusCode != 202 {
				return "", fmt.Errorf("PUT conf: %v %s", err, r.Raw)
			}
			return r.Change, nil
		},
		// snapd kills the hook: the task fails "run hook "configure": <aborted>".
		aborted: func(string) error { return nil },
	}
	fw := newWire(t, fs.SocketPath())
	var held *fake.Change
	var fk *clientSide
	fk = &clientSide{
		name: "fake " + string(fv), wire: fw,
		command: func(ctx context.Context, user bool, args []string) *exec.Cmd {
			if user {
				c := exec.CommandContext(ctx, asNobody[0], append(append(asNobody[1:], userSnap), args...)...)
				c.Env = append(clientEnv, "HOME=/nonexistent", "SNAPPY_GLOBAL_ROOT="+root)
				return c
			}
			c := exec.CommandContext(ctx, hostSnap, args...)
			c.Env = append(clientEnv, "HOME="+home, "SNAPPY_GLOBAL_ROOT="+root)
			return c
		},
		hold: func() (string, error) {
			held = fs.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "svcdemo"})
			return held.ID(), nil
		},
		// A held change's tasks are the test's to end. snapd's hook runner
		// answers an abort by killing the hook, and its task fails with
		// `run hook "configure": <aborted>` (overlord/hookstate/hookmgr.go
		// wraps the killed hook's error as `run hook %q: %v`): end the
		// held task the same way once the fake has seen the abort.
		aborted: func(id string) error {
			if err := fk.until(id, func(c change) bool { return c.Status == "Abort" }); err != nil {
				return err
			}
			held.Fail(`run hook "configure": <aborted>`)
			return nil
		},
	}

	// The same snap client version on both sides.
	ctx := ctxFor(t, 5*time.Minute)
	rv, err := real.clientVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fkv, err := fk.clientVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rv != fkv {
		t.Fatalf("snap client versions differ: the container's is %q, the host's (%s) %q", rv, hostSnap, fkv)
	}
	t.Logf("snap client %s: container against real snapd %s; host (%s) against the fake as %s", rv, e.Version, hostSnap, fv)

	r := w.do(t, "GET", "/v2/changes?select=all", nil)
	var before []change
	decode(t, r, &before)
	for _, c := range before {
		if n, _ := strconv.Atoi(c.ID); n > real.baseline {
			real.baseline = n
		}
	}

	var wg sync.WaitGroup
	for _, sd := range []*clientSide{real, fk} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sd.err = clientScenario(ctx, sd)
		}()
	}
	wg.Wait()
	for _, sd := range []*clientSide{real, fk} {
		if sd.err != nil {
			t.Errorf("%s: scenario stopped: %v", sd.name, sd.err)
		}
	}
	if dir := os.Getenv("SNAPSVC_REALSNAPD_TRANSCRIPTS"); dir != "" {
		for sub, sd := range map[string]*clientSide{"real": real, "fake": fk} {
			if err := sd.writeTranscript(filepath.Join(dir, sub)); err != nil {
				t.Error(err)
			}
		}
	}

	// The scenario did what it says on the real snapd, so that identical
	// output means something: these steps fail there, with these messages.
	for _, rr := range real.runs {
		want, fails := realFailures[rr.name]
		switch {
		case fails && (rr.exit != 1 || !strings.Contains(rr.stderr, want)):
			t.Errorf("real snapd: step %s (snap %s): exit %d, stderr %q; want exit 1 and %q", rr.name, strings.Join(rr.args, " "), rr.exit, rr.stderr, want)
		case !fails && rr.exit != 0:
			t.Errorf("real snapd: step %s (snap %s): exit %d, stderr %q; want success", rr.name, strings.Join(rr.args, " "), rr.exit, rr.stderr)
		}
	}
	if len(real.ids) != len(fk.ids) {
		t.Errorf("the scenario made %d changes on real snapd (%v), %d on the fake (%v)", len(real.ids), real.ids, len(fk.ids), fk.ids)
	}

	known := knownClientDifferences(e.Version)
	same := 0
	for i, rr := range real.runs {
		if i >= len(fk.runs) {
			t.Errorf("step %s: the fake's scenario ended early", rr.name)
			break
		}
		fr := fk.runs[i]
		if rr.name != fr.name {
			t.Fatalf("scenarios diverged: real step %s, fake step %s", rr.name, fr.name)
		}
		rn, fn := real.normalised(rr), fk.normalised(fr)
		why, isKnown := known[rr.name]
		switch {
		case rn == fn && isKnown:
			t.Errorf("step %s (snap %s) is listed as a known difference (%s) but now matches: remove it", rr.name, strings.Join(rr.args, " "), why)
		case rn == fn:
			same++
		case isKnown:
			t.Logf("step %s (snap %s): KNOWN DIFFERENCE (%s)\n--- real:\n%s\n--- fake:\n%s", rr.name, strings.Join(rr.args, " "), why, rn, fn)
		default:
			t.Errorf("step %s: snap %s prints differently against the fake than against real snapd %s\n--- real:\n%s\n--- fake:\n%s",
				rr.name, strings.Join(rr.args, " "), e.Version, rn, fn)
		}
	}
	t.Logf("%d of %d snap client steps identical after normalisation", same, len(real.runs))
}

// realFailures are the steps that fail against real snapd, with a part of
// what snap prints on stderr; every other step succeeds.
var realFailures = map[string]string{
	"services-unknown":         `error: snap "svcdemo" has no service "nosuch"`,
	"start-broken":             "error: cannot perform the following tasks:\n- Run service command \"start\" for services [\"broken\"]",
	"conflict-service-control": `error: snap "svcdemo" has "service-control" change in progress`,
	"abort-ready":              "with nothing pending",
	"conflict-configure":       `error: snap "svcdemo" has "configure-snap" change in progress`,
	"watch-held-aborted":       `(run hook "configure": <aborted>)`,
	// snapd lets only root act (daemon/access.go: 401 access denied,
	// kind login-required); snap tells a user to try sudo
	"restart-user": "error: access denied (try with sudo)\n",
	"stop-user":    "error: access denied (try with sudo)\n",
	"start-user":   "error: access denied (try with sudo)\n",
	"logs-user":    "error: access denied (try with sudo)\n",
	"get-user":     "error: access denied (try with sudo)\n",
	"set-user":     "error: access denied (try with sudo)\n",
	"abort-user":   "error: access denied (try with sudo)\n",
}

// asNobody runs what follows as user nobody.
var asNobody = []string{"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}

// knownClientDifferences lists steps whose output is known to differ
// between real snapd and the fake, with the reason; such a step must still
// differ (the test fails once it matches, so the list cannot go stale).
func knownClientDifferences(version string) map[string]string {
	_ = version
	return map[string]string{}
}

// clientSide is one snapd (real or fake) and the snap client pointed at it.
type clientSide struct {
	name    string
	wire    *wire
	command func(ctx context.Context, user bool, args []string) *exec.Cmd // user: as nobody
	hold    func() (string, error)                                        // starts a foreign configure-snap change that stays Doing
	aborted func(id string) error                                         // ends the held change the way snapd does once it is aborted

	baseline int      // the highest change id before the scenario
	ids      []string // changes the scenario made, in the order they were made
	runs     []clientRun
	err      error
}

// clientRun is one invocation of the snap client.
type clientRun struct {
	name           string
	args           []string
	stdout, stderr string
	exit           int
}

// clientVersion is the snap client's own version, from `snap version`.
func (sd *clientSide) clientVersion(ctx context.Context) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := sd.command(ctx, false, []string{"version"})
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: snap version: %v: %s%s", sd.name, err, stdout.String(), stderr.String())
	}
	f := strings.Fields(strings.SplitN(stdout.String(), "\n", 2)[0])
	if len(f) != 2 || f[0] != "snap" {
		return "", fmt.Errorf("%s: snap version printed %q", sd.name, stdout.String())
	}
	return f[1], nil
}

// snap runs the client once (as root), records the run and learns the
// changes it made.
func (sd *clientSide) snap(ctx context.Context, name string, args ...string) (clientRun, error) {
	return sd.run(ctx, false, name, args...)
}

// run runs the client once, as nobody when user is set.
func (sd *clientSide) run(ctx context.Context, user bool, name string, args ...string) (clientRun, error) {
	var stdout, stderr bytes.Buffer
	cmd := sd.command(ctx, user, args)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	run := clientRun{name: name, args: args}
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			return run, fmt.Errorf("step %s: snap %s: %w", name, strings.Join(args, " "), err)
		}
		run.exit = ee.ExitCode()
	}
	run.stdout, run.stderr = stdout.String(), stderr.String()
	sd.runs = append(sd.runs, run)
	return run, sd.learn()
}

// learn records, in id order, the changes on svcdemo made since the last
// call (snapd's own background changes, such as "Initialize device", and
// earlier tests' changes are not the scenario's).
func (sd *clientSide) learn() error {
	r, err := sd.wire.doErr("GET", "/v2/changes?select=all", nil)
	if err != nil {
		return err
	}
	var cs []change
	if err := decodeResult(r, &cs); err != nil {
		return err
	}
	var fresh []int
	for _, c := range cs {
		n, err := strconv.Atoi(c.ID)
		if err != nil {
			return fmt.Errorf("change id %q: %v", c.ID, err)
		}
		if n > sd.baseline && touchesSvcdemo(c) && !sd.knows(c.ID) {
			fresh = append(fresh, n)
		}
	}
	sort.Ints(fresh)
	for _, n := range fresh {
		sd.ids = append(sd.ids, strconv.Itoa(n))
	}
	return nil
}

func (sd *clientSide) knows(id string) bool {
	for _, k := range sd.ids {
		if k == id {
			return true
		}
	}
	return false
}

// changeID is what a --no-wait command printed: the id of the change it made.
func (sd *clientSide) changeID(run clientRun) (string, error) {
	id := strings.TrimSpace(run.stdout)
	if !sd.knows(id) {
		return "", fmt.Errorf("step %s: snap %s printed %q, not the id of a change it made (%v)", run.name, strings.Join(run.args, " "), run.stdout, sd.ids)
	}
	return id, nil
}

// last is the newest change the scenario made.
func (sd *clientSide) last() (string, error) {
	if len(sd.ids) == 0 {
		return "", errors.New("no change made yet")
	}
	return sd.ids[len(sd.ids)-1], nil
}

// until polls change id (unrecorded) until cond holds.
func (sd *clientSide) until(id string, cond func(change) bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(20 * time.Millisecond) // polling an external daemon
	defer tick.Stop()
	for {
		r, err := sd.wire.doErr("GET", "/v2/changes/"+id, nil)
		if err != nil {
			return err
		}
		var c change
		if err := decodeResult(r, &c); err != nil {
			return err
		}
		if cond(c) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("change %s: condition not met after 2m: %s", id, r.Raw)
		}
		<-tick.C
	}
}

func decodeResult(r response, v any) error {
	if r.Type == "error" {
		return fmt.Errorf("snapd answered an error: %s", r.Raw)
	}
	return json.Unmarshal(r.Result, v)
}

func doing(c change) bool { return c.Status == "Doing" }

// clientScenario is the sequence both sides run; every snap invocation is
// recorded, waits through the wire are not.
func clientScenario(ctx context.Context, sd *clientSide) error {
	steps := [][]string{
		{"services", "services", "svcdemo"},
		{"services-one", "services", "svcdemo.alpha"},
		{"services-unknown", "services", "svcdemo.nosuch"},
		{"stop", "stop", "svcdemo.alpha"},
		{"services-after-stop", "services", "svcdemo.alpha"},
		{"start", "start", "svcdemo.alpha"},
		{"restart", "restart", "svcdemo.alpha"},
		{"stop-disable", "stop", "--disable", "svcdemo.beta"},
		{"services-after-disable", "services", "svcdemo.beta"},
		{"start-enable", "start", "--enable", "svcdemo.beta"},
		{"restart-reload", "restart", "--reload", "svcdemo.alpha", "svcdemo.beta"},
		{"start-broken", "start", "svcdemo.broken"},
	}
	for _, s := range steps {
		if _, err := sd.snap(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	// A user who is not root: reads work, actions are refused.
	for _, s := range [][]string{
		{"services-user", "services", "svcdemo.alpha"},
		{"restart-user", "restart", "svcdemo.alpha"},
		{"stop-user", "stop", "svcdemo.alpha"},
		{"start-user", "start", "svcdemo.slowstart"},
		{"logs-user", "logs", "svcdemo.alpha"},
		{"get-user", "get", "svcdemo"},
		{"set-user", "set", "svcdemo", "hook-sleep=0"},
	} {
		if _, err := sd.run(ctx, true, s[0], s[1:]...); err != nil {
			return err
		}
	}
	broken, err := sd.last()
	if err != nil {
		return err
	}
	for _, s := range [][]string{{"change-broken", "change", broken}, {"tasks-broken", "tasks", broken}} {
		if _, err := sd.snap(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}

	// A slow stop (gamma's stop-command sleeps): a service-control conflict,
	// then watch it to its end.
	run, err := sd.snap(ctx, "stop-no-wait", "stop", "--no-wait", "svcdemo.gamma")
	if err != nil {
		return err
	}
	gamma, err := sd.changeID(run)
	if err != nil {
		return err
	}
	for _, s := range [][]string{
		{"conflict-service-control", "restart", "svcdemo.alpha"},
		{"watch-stop", "watch", gamma},
		{"change-stop", "change", gamma},
		{"tasks-stop", "tasks", gamma},
		{"abort-ready", "abort", gamma},
		{"changes-svcdemo", "changes", "svcdemo"},
	} {
		if _, err := sd.snap(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}

	// Abort a service-control change while its task runs (slowstart's
	// start is slow): snapd lets the task run to its end.
	if run, err = sd.snap(ctx, "start-no-wait", "start", "--no-wait", "svcdemo.slowstart"); err != nil {
		return err
	}
	slow, err := sd.changeID(run)
	if err != nil {
		return err
	}
	if err := sd.until(slow, doing); err != nil {
		return err
	}
	for _, s := range [][]string{
		{"abort-doing", "abort", slow},
		{"watch-aborted", "watch", slow},
		{"change-aborted", "change", slow},
		{"services-after-abort", "services", "svcdemo.slowstart"},
		{"stop-slowstart", "stop", "svcdemo.slowstart"},
	} {
		if _, err := sd.snap(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}

	// A held foreign change (configure-snap): the conflict, how the client
	// shows it, and its abort.
	held, err := sd.hold()
	if err != nil {
		return err
	}
	if err := sd.until(held, doing); err != nil {
		return err
	}
	if err := sd.learn(); err != nil {
		return err
	}
	if _, err := sd.run(ctx, true, "abort-user", "abort", held); err != nil {
		return err
	}
	for _, s := range [][]string{
		{"conflict-configure", "restart", "svcdemo.alpha"},
		// snap set's change is listed for its snap
		{"changes-held-svcdemo", "changes", "svcdemo"},
		{"changes-held", "changes"},
		{"change-held", "change", held},
		{"tasks-held", "tasks", held},
		{"abort-held", "abort", held},
	} {
		if _, err := sd.snap(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	if err := sd.aborted(held); err != nil {
		return err
	}
	for _, s := range [][]string{
		{"watch-held-aborted", "watch", held},
		{"change-held-aborted", "change", held},
		{"changes-final", "changes"},
	} {
		if _, err := sd.snap(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	return nil
}

var (
	humanTime  = regexp.MustCompile(`\b(today|yesterday|tomorrow) at \d\d:\d\d [A-Z]+\b`)
	stampTime  = regexp.MustCompile(`\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	idLine     = regexp.MustCompile(`^\d+$`)
	tableRow   = regexp.MustCompile(`^(\d+)( +)`)
	changeWord = regexp.MustCompile(`\bchange (\d+)\b`)
	spaceRun   = regexp.MustCompile(`  +`)
)

// normalised renders a run for comparison: change ids become <cN> (N in
// the order the scenario made them), rows of `snap changes` for changes the
// scenario did not make are dropped, times become <time>, and runs of
// spaces (table padding, which follows the ids' widths) become two spaces.
func (sd *clientSide) normalised(run clientRun) string {
	alias := map[string]string{}
	for i, id := range sd.ids {
		alias[id] = fmt.Sprintf("<c%d>", i+1)
	}
	norm := func(s string) string {
		var out []string
		for _, line := range strings.Split(s, "\n") {
			line = humanTime.ReplaceAllString(line, "<time>")
			line = stampTime.ReplaceAllString(line, "<time>")
			if idLine.MatchString(line) {
				if a, ok := alias[line]; ok {
					line = a
				}
			} else if m := tableRow.FindStringSubmatch(line); m != nil {
				a, ok := alias[m[1]]
				if !ok {
					continue // a change this scenario did not make
				}
				line = a + line[len(m[1]):]
			}
			line = changeWord.ReplaceAllStringFunc(line, func(w string) string {
				if a, ok := alias[strings.TrimPrefix(w, "change ")]; ok {
					return "change " + a
				}
				return w
			})
			out = append(out, strings.TrimRight(spaceRun.ReplaceAllString(line, "  "), " "))
		}
		return strings.Join(out, "\n")
	}
	args := make([]string, len(run.args))
	for i, a := range run.args {
		args[i] = a
		if al, ok := alias[a]; ok {
			args[i] = al
		}
	}
	return fmt.Sprintf("$ snap %s\nexit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), run.exit, norm(run.stdout), norm(run.stderr))
}

// writeTranscript writes every run, raw, to dir/NN-NAME.txt.
func (sd *clientSide) writeTranscript(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i, r := range sd.runs {
		body := fmt.Sprintf("# %s\n$ snap %s\nexit %d\n--- stdout\n%s--- stderr\n%s", sd.name, strings.Join(r.args, " "), r.exit, r.stdout, r.stderr)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%02d-%s.txt", i+1, r.name)), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}
