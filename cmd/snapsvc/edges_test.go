package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
)

// errorDoc is the --json error object, as a test reads it.
type errorDoc struct {
	Error struct {
		Message   string `json:"message"`
		ExitCode  int    `json:"exit-code"`
		Change    string `json:"change"`
		Status    string `json:"status"`
		Kind      string `json:"kind"`
		Cause     string `json:"cause"`
		Retryable *bool  `json:"retryable"`
	} `json:"error"`
}

// decodeError decodes out as exactly one --json error object and checks
// that it agrees with the exit code.
func decodeError(t *testing.T, code int, out string) errorDoc {
	t.Helper()
	var doc errorDoc
	decodeOne(t, out, &doc)
	if doc.Error.ExitCode != code {
		t.Errorf("JSON exit-code %d, the process exited %d", doc.Error.ExitCode, code)
	}
	if doc.Error.Retryable == nil {
		t.Fatalf("JSON error has no retryable:\n%s", out)
	}
	return doc
}

// safetyNet bounds a test that drives the CLI in this process; never a
// synchronisation.
func safetyNet(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestTimedOutOperations runs each way a start/stop/restart can run out of
// time against the fake and checks exit code, stderr and --json (each run
// on a fake of its own): only a restart that did nothing is retryable,
// which stderr says in words on a second line, --json in its field.
func TestTimedOutOperations(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the fakes' own cleanup
	for _, tc := range []struct {
		name       string
		setup      func(t *testing.T) *fake.Server
		code       int
		retryable  bool
		change     bool
		stderrWant string
	}{
		{"blocked by a foreign change", func(t *testing.T) *fake.Server {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
			t.Cleanup(held.Finish)
			return srv
		}, exitTimeout, true, false, "which holds snap \"k8s\"; nothing was done\nTrying again once change 1 is done may help: 'snapsvc watch 1' waits for it.\n"},
		{"its change still running", func(t *testing.T) *fake.Server {
			// Nothing moves on a manual clock: the restart's change stays Doing.
			return fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(fake.NewManualClock(time.Now())), fake.WithSnaps(k8sSnap(1)))
		}, exitUnknown, false, true, "restart k8s.kubelet: timed out after 200ms (--timeout) before change 1 was done\nThe change may still be running: 'snapsvc watch 1' waits for it"},
		{"snapd acted, its answer pending", func(t *testing.T) *fake.Server {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			hold := make(chan struct{})
			t.Cleanup(func() { close(hold) })
			srv.InjectFault(fake.Fault{Method: "POST", Path: "/v2/apps", Hold: hold})
			return srv
		}, exitUnknown, false, true, "while snapd's answer was pending; change 1, made meanwhile, does what it asked\nThe change may still be running: 'snapsvc watch 1' waits for it; running restart again would act again"},
		{"snapd silent, outcome unknown", func(t *testing.T) *fake.Server {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			hold := make(chan struct{})
			t.Cleanup(func() { close(hold) })
			srv.InjectFault(fake.Fault{Kind: fake.FaultReject, Method: "POST", Path: "/v2/apps", Hold: hold})
			return srv
		}, exitUnknown, false, false, "timed out after 200ms (--timeout) while snapd's answer was pending\nsnapd may have acted on the request: check with 'snapsvc status'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runWithSocket(safetyNet(t), tc.setup(t).SocketPath(), false, "-v", "restart", "k8s.kubelet", "--timeout", "200ms")
			if code != tc.code || !strings.Contains(errOut, tc.stderrWant) {
				t.Fatalf("exit %d, want %d; stderr lacks %q:\n%s", code, tc.code, tc.stderrWant, errOut)
			}
			code, out, jsonErrOut := runWithSocket(safetyNet(t), tc.setup(t).SocketPath(), false, "--json", "restart", "k8s.kubelet", "--timeout", "200ms")
			doc := decodeError(t, code, out)
			if code != tc.code || *doc.Error.Retryable != tc.retryable || (doc.Error.Change != "") != tc.change || jsonErrOut != "" {
				t.Errorf("--json: exit %d, retryable %t, change %q, stderr %q; want exit %d, retryable %t, a change %t, nothing on stderr", code, *doc.Error.Retryable, doc.Error.Change, jsonErrOut, tc.code, tc.retryable, tc.change)
			}
			// No marker: stderr says it in words, once, or not at all;
			// --json's "retryable" field says it, never its text (issue
			// 36).
			if strings.Contains(errOut, "retryable") || strings.Contains(doc.Error.Message, "retryable") || strings.Contains(doc.Error.Cause, "retryable") {
				t.Errorf("a retryable marker: stderr %q, --json %+v", errOut, doc.Error)
			}
			if want := map[bool]int{true: 1, false: 0}[tc.retryable]; strings.Count(errOut, "may help") != want {
				t.Errorf("trying again not said to help exactly %d time(s) on stderr:\n%s", want, errOut)
			}
			if n := len(regexp.MustCompile(`(?m)^error: `).FindAllString(errOut, -1)); n != 1 || !strings.Contains(errOut, "\ndetail: snapsvc: restart k8s.kubelet") {
				t.Errorf("%d error: prefixes, want 1, and -v's detail line:\n%s", n, errOut)
			}
		})
	}
}

// TestUnreachableToldAtOnce checks that, with stderr not a terminal and
// snapd's socket missing, restart says at once which socket it cannot
// reach, why and until when it keeps trying, then that snapd answers
// again once the socket appears, and succeeds.
func TestUnreachableToldAtOnce(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithoutListening(), fake.WithSnaps(k8sSnap(0)))
	ctx := safetyNet(t)
	stdout, stderr := newNotifyBuffer(), newNotifyBuffer()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"restart", "k8s.kubelet"}, env{stdout: stdout, stderr: stderr, getenv: socketEnv(srv.SocketPath())})
	}()
	want := "restart k8s.kubelet: cannot reach snapd at " + srv.SocketPath() + ": no socket there (is snapd running?)"
	if !stderr.waitFor(ctx, want) {
		t.Fatalf("nothing said while snapd is unreachable; stderr %q", stderr.String())
	}
	if !stderr.waitFor(ctx, "; retrying until ") || !stderr.waitFor(ctx, "see --wait-snapd") {
		t.Fatalf("not said until when it retries: %q", stderr.String())
	}
	if err := srv.StartListening(); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != exitOK {
		t.Fatalf("exit %d once snapd was back: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "restart k8s.kubelet: snapd answers again at "+srv.SocketPath()) {
		t.Errorf("snapd's return not told: %q", stderr.String())
	}
	if n := strings.Count(stderr.String(), "cannot reach snapd"); n != 1 {
		t.Errorf("%d outage lines, want 1: %q", n, stderr.String())
	}
	if stdout.String() != "Restarted.\n" {
		t.Errorf("stdout %q", stdout.String())
	}
}

// TestWaitSnapd checks that --wait-snapd bounds how long an absent snapd
// is waited for (30s by default, far below the 5 min conflict budget), and
// that 0 gives up at the first failed connection.
func TestWaitSnapd(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	a := &app{env: env{stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, getenv: func(string) string { return "" }}, waitSnapd: retry.DefaultPolicy().MaxUnreachable}
	if p := a.policy(); p.MaxUnreachable != 30*time.Second || p.MaxElapsedTime != 5*time.Minute {
		t.Errorf("default policy: unreachable %v, elapsed %v", p.MaxUnreachable, p.MaxElapsedTime)
	}
	for flagValue, want := range map[string]time.Duration{"2s": 2 * time.Second, "0": time.Nanosecond} {
		if err := a.newRoot().PersistentFlags().Parse([]string{"--wait-snapd", flagValue}); err != nil {
			t.Fatal(err)
		}
		if got := a.policy().MaxUnreachable; got != want {
			t.Errorf("--wait-snapd %s: MaxUnreachable %v, want %v", flagValue, got, want)
		}
	}

	sock := filepath.Join(t.TempDir(), "nosuch.socket")
	for _, wait := range []string{"100ms", "0"} {
		code, out, _ := runWithSocket(safetyNet(t), sock, false, "--json", "--wait-snapd", wait, "restart", "k8s.kubelet")
		doc := decodeError(t, code, out)
		if code != exitTimeout || !strings.HasPrefix(doc.Error.Message, "restart k8s.kubelet: cannot reach snapd at "+sock+": no socket there (is snapd running?); gave up after "+wait) {
			t.Errorf("--wait-snapd %s: exit %d, %s; want exit 3, giving up on the absent snapd", wait, code, out)
			continue
		}
		if !*doc.Error.Retryable {
			t.Errorf("--wait-snapd %s: not retryable: %s", wait, out)
		}
		// The cause, the library's whole error, names the socket and
		// the request once (net/http's and the dial's words named them
		// again: three sockets, two requests).
		if strings.Count(doc.Error.Cause, sock) != 1 || strings.Count(doc.Error.Cause, "/v2/apps") != 1 || !strings.HasSuffix(doc.Error.Cause, "POST /v2/apps, cannot connect): the socket does not exist (is snapd running?): connect: no such file or directory") {
			t.Errorf("--wait-snapd %s: cause %q", wait, doc.Error.Cause)
		}
	}
}

// TestSocketNotASocket checks that a --socket that is a directory or a
// regular file is said to be one, not "connection refused", at once and
// not retryable (exit 1: issue 36; it was retried for --wait-snapd), and
// that the message names the services it acted on.
func TestSocketNotASocket(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{dir: dir + ": it is a directory, not a socket", file: file + ": it is not a socket (a regular file)"} {
		start := time.Now()
		code, _, errOut := runWithSocket(safetyNet(t), path, false, "status")
		if code != exitFailed || errOut != "error: cannot reach snapd at "+want+"\n" {
			t.Errorf("status --socket %s: exit %d, stderr %q; want exit 1 saying %q", path, code, errOut, want)
		}
		code, out, errOut := runWithSocket(safetyNet(t), path, false, "--json", "restart", "k8s.kubelet")
		doc := decodeError(t, code, out)
		if code != exitFailed || *doc.Error.Retryable || doc.Error.Message != "restart k8s.kubelet: cannot reach snapd at "+want || errOut != "" {
			t.Errorf("restart --socket %s: exit %d, %s, stderr %q; want exit 1, not retryable, saying %q", path, code, out, errOut, want)
		}
		if strings.Count(doc.Error.Cause, path) != 1 {
			t.Errorf("restart --socket %s: the cause names it %d times: %q", path, strings.Count(doc.Error.Cause, path), doc.Error.Cause)
		}
		// At once: the default --wait-snapd is 30 s.
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("--socket %s: took %v, want no wait", path, d)
		}
	}
}

// TestWaitIdleUnknownSnap checks that wait-idle, like every other command,
// exits 4 for a snap snapd does not know, but waits for a snap that is
// being installed and accepts a snap without services.
func TestWaitIdleUnknownSnap(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0), fake.Snap{Name: "hello", Apps: []fake.App{{Name: "hello"}}}))
	ctx := safetyNet(t)

	// Said once ("is not installed ...: reading services nosuch: snap
	// "nosuch" not found" said it twice).
	code, _, errOut := runWithSocket(ctx, srv.SocketPath(), false, "wait-idle", "nosuch")
	if want := "error: snap \"nosuch\" is not installed and no change in progress touches it\n"; code != exitNotFound || errOut != want {
		t.Errorf("wait-idle nosuch: exit %d, stderr %q; want exit 4, %q", code, errOut, want)
	}
	code, out, _ := runWithSocket(ctx, srv.SocketPath(), false, "--json", "wait-idle", "nosuch")
	if doc := decodeError(t, code, out); code != exitNotFound || *doc.Error.Retryable || doc.Error.Kind != "snap-not-found" || strings.Count(doc.Error.Cause, "not") != 1 {
		t.Errorf("--json wait-idle nosuch: exit %d: %s", code, out)
	}
	// Done, it prints nothing on stdout, as snap watch; on a terminal (or
	// with -v) stderr says so; --json prints its document.
	if code, out, errOut := runWithSocket(ctx, srv.SocketPath(), false, "wait-idle", "hello"); code != exitOK || out != "" || errOut != "" {
		t.Errorf("wait-idle of a snap without services: exit %d %q %q; want 0 and nothing", code, out, errOut)
	}
	if code, out, errOut := runWithSocket(ctx, srv.SocketPath(), true, "wait-idle", "hello"); code != exitOK || out != "" || !strings.Contains(errOut, `snap "hello" is idle`) {
		t.Errorf("wait-idle on a terminal: exit %d %q %q; want the sentence on stderr", code, out, errOut)
	}
	if code, out, _ := runWithSocket(ctx, srv.SocketPath(), false, "--json", "wait-idle", "hello"); code != exitOK || out != "{\n  \"snap\": \"hello\",\n  \"idle\": true\n}\n" {
		t.Errorf("--json wait-idle: exit %d %q", code, out)
	}

	// A snap being installed is not listed yet, but its install change
	// touches it: wait-idle waits for that change.
	install := srv.AddChange(fake.ChangeSpec{Kind: "install-snap", Snap: "newsnap", WithSnapNames: true})
	listed := srv.Counters().Requests["GET /v2/changes"]
	stdout, stderr := newNotifyBuffer(), newNotifyBuffer()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"wait-idle", "newsnap"}, env{stdout: stdout, stderr: stderr, getenv: socketEnv(srv.SocketPath())})
	}()
	// Finish the install only once wait-idle has listed the changes twice
	// (its check that the snap is known, then the wait's own listing) and
	// is waiting: finished any earlier, the install would leave a snap
	// that is neither listed nor touched by a change, which is unknown.
	if err := srv.WaitFor(ctx, func(v fake.View) bool {
		return v.RequestsTo("GET /v2/changes") >= listed+2 && v.InFlight() > 0
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		t.Fatalf("wait-idle ended (exit %d) while the install was in progress: %s", code, stderr.String())
	default:
	}
	install.Finish()
	if code := <-done; code != exitOK || stdout.String() != "" {
		t.Errorf("wait-idle newsnap after its install: exit %d %q %q", code, stdout.String(), stderr.String())
	}
}

// TestCommandHelp checks every command's help, from --help and from
// "help COMMAND": the same text on stdout, nothing on stderr, the global
// flags once with their real defaults, never the values given on the
// command line.
func TestCommandHelp(t *testing.T) {
	const sock = "/given/by/the/env.socket"
	a := &app{}
	for _, c := range a.newRoot().Commands() {
		if c.Hidden {
			continue
		}
		name := c.Name()
		t.Run(name, func(t *testing.T) {
			code, viaFlag, errOut := runWithSocket(context.Background(), sock, false, "--timeout", "7s", "--wait-snapd", "9s", name, "--help")
			if code != exitOK || errOut != "" {
				t.Fatalf("%s --help: exit %d, stderr %q", name, code, errOut)
			}
			code, viaHelp, errOut := runWithSocket(context.Background(), sock, false, "help", name)
			if code != exitOK || errOut != "" {
				t.Fatalf("help %s: exit %d, stderr %q", name, code, errOut)
			}
			if viaFlag != viaHelp {
				t.Errorf("--help and help differ:\n%s\n---\n%s", viaFlag, viaHelp)
			}
			if !strings.Contains(viaHelp, "snapsvc "+name) {
				t.Errorf("not %s's usage:\n%s", name, viaHelp)
			}
			for _, g := range []string{"--socket", "--json", "--timeout", "--wait-snapd", "--verbose"} {
				if n := len(regexp.MustCompile(`(?m)^ +(-v, )?`+g+`\b`).FindAllString(viaHelp, -1)); n != 1 {
					t.Errorf("global flag %s listed %d times:\n%s", g, n, viaHelp)
				}
			}
			for _, given := range []string{"7s", "9s", sock} {
				if strings.Contains(viaHelp, given) {
					t.Errorf("the value given, %s, shown as a default:\n%s", given, viaHelp)
				}
			}
		})
	}
	_, follow, _ := runWithSocket(context.Background(), sock, false, "follow", "--interval", "3s", "--help")
	if !strings.Contains(follow, "--interval D") || !strings.Contains(follow, "(default 500ms)") || strings.Contains(follow, "3s") {
		t.Errorf("follow --help does not show --interval's own default:\n%s", follow)
	}
}

// TestVersion checks version and --version: the module's version and Go's,
// snapd's version when it answers, and exit 0 when it does not.
func TestVersion(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(fake.Version268), fake.WithSnaps(k8sSnap(0)))
	ctx := safetyNet(t)
	code, out, _ := runWithSocket(ctx, srv.SocketPath(), false, "--version")
	if code != exitOK || !regexp.MustCompile(`^snapsvc \S+ \(github.com/snapsvc/snapsvc/cmd, go[^)]*\)\n$`).MatchString(out) {
		t.Errorf("--version: exit %d %q", code, out)
	}
	for _, args := range [][]string{{"--json", "version"}, {"version", "--json"}} {
		code, out, errOut := runWithSocket(ctx, srv.SocketPath(), false, args...)
		var v versionOutput
		decodeOne(t, out, &v)
		if code != exitOK || v.Snapsvc.Module != "github.com/snapsvc/snapsvc/cmd" || v.Snapsvc.Version == "" || v.Snapsvc.Go != runtime.Version() ||
			!strings.HasPrefix(v.Snapd.Version, string(fake.Version268)) || v.Snapd.Socket != srv.SocketPath() || v.Snapd.Error != "" {
			t.Errorf("%q: exit %d %+v %s", args, code, v, errOut)
		}
	}
	sock := filepath.Join(t.TempDir(), "nosuch.socket")
	code, out, _ = runWithSocket(ctx, sock, false, "version")
	if code != exitOK || !strings.Contains(out, "snapsvc ") || !strings.HasSuffix(out, "\nsnapd: unknown (cannot reach snapd at "+sock+": no socket there (is snapd running?))\n") {
		t.Errorf("version without snapd: exit %d %q", code, out)
	}
}

// TestJSONDocuments checks what the documentation says of --json: every
// command but watch prints exactly one JSON document, watch prints JSON
// Lines (every line one object, a failure as the last line), and both the
// README and the package documentation say so.
func TestJSONDocuments(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	ctx := safetyNet(t)
	for _, args := range [][]string{
		{"status"}, {"start", "k8s.kubelet"}, {"restart", "k8s"}, {"stop", "--no-wait", "k8s.kubelet"}, {"changes", "--all"},
		{"change", "1"}, {"wait", "1"}, {"wait-idle", "k8s"}, {"version"}, {"change", "99"}, {"restart", "k8s.nosuch"},
	} {
		code, out, errOut := runWithSocket(ctx, srv.SocketPath(), false, append([]string{"--json"}, args...)...)
		var doc any
		decodeOne(t, out, &doc)
		if code != exitOK {
			decodeError(t, code, out)
		}
		if code != exitOK && code != exitNotFound {
			t.Errorf("%q: exit %d: %s", args, code, errOut)
		}
	}

	// watch: a change comes and goes while it watches until idle; then a
	// watch that --timeout ends, its error the last line.
	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
	stdout, stderr := newNotifyBuffer(), newNotifyBuffer()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--json", "follow", "--until-idle", "--interval", "5ms"}, env{stdout: stdout, stderr: stderr, getenv: socketEnv(srv.SocketPath())})
	}()
	if !stdout.waitFor(ctx, `"status":"Doing"`) {
		t.Fatalf("watch did not show the change: %q %q", stdout.String(), stderr.String())
	}
	held.Finish()
	if code := <-done; code != exitOK {
		t.Fatalf("watch exited %d: %s", code, stderr.String())
	}
	checkJSONLines(t, stdout.String(), false)
	if n := strings.Count(stdout.String(), "\n"); n < 2 {
		t.Errorf("watch printed %d lines, want the change's and its task's", n)
	}
	srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
	code, out, errOut := runWithSocket(ctx, srv.SocketPath(), false, "--json", "follow", "--interval", "5ms", "--timeout", "300ms", "k8s")
	if code != exitTimeout {
		t.Fatalf("watch --timeout: exit %d: %s", code, errOut)
	}
	checkJSONLines(t, out, true)

	clidoc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	pkgdoc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	cli := string(clidoc)
	for name, text := range map[string]string{"docs/cli.md": strings.Join(strings.Fields(cli), " "), "doc.go": strings.Join(strings.Fields(strings.ReplaceAll(string(pkgdoc), "//", "")), " ")} {
		if !strings.Contains(text, "JSON Lines") || !strings.Contains(text, "except `follow --json`") && !strings.Contains(text, "every command but follow") {
			t.Errorf("%s does not say that follow --json prints JSON Lines and every other command one document", name)
		}
	}
}

// checkJSONLines checks that out is JSON Lines: every line one JSON
// object, and an error object only as the last line when lastErr.
func checkJSONLines(t *testing.T, out string, lastErr bool) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		var obj map[string]any
		if err := json.Unmarshal([]byte(l), &obj); err != nil {
			t.Fatalf("line %d is not one JSON object: %v\n%s", i+1, err, out)
		}
		if _, isErr := obj["error"]; isErr != (lastErr && i == len(lines)-1) {
			t.Errorf("line %d: an error object where none belongs, or none where one does:\n%s", i+1, out)
		}
	}
}

// TestNotesAboveProgress checks that a note printed while the terminal
// progress line is drawn erases it first.
func TestNotesAboveProgress(t *testing.T) {
	defer goleak.VerifyNone(t)
	var buf lockedBuffer
	p := newProgress(&buf, true, func() int { return 100 }, 0, false)
	p.begin("restart k8s.kubelet")
	p.mu.Lock()
	p.chg, p.kind, p.own, p.since = "4", "service-control", true, time.Now()
	p.tickLocked()
	p.mu.Unlock()
	p.println("restart k8s.kubelet: cannot reach snapd")
	p.close()
	got := buf.String()
	if !strings.Contains(got, "change 4 (service-control) running, 0s · restart k8s.kubelet\r\033[Krestart k8s.kubelet: cannot reach snapd\n") {
		t.Errorf("note not printed over an erased progress line: %q", got)
	}
}

// TestAccessDeniedSuggestsSudo checks that snapd's own refusal of a user
// who is not root (401/403, kind login-required) is told as snap tells it,
// "access denied (try with sudo)", not retryable; root is not told to use
// sudo.
func TestAccessDeniedSuggestsSudo(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	srv.InjectFault(fake.Fault{Kind: fake.FaultReply, Method: "POST", Path: "/v2/apps", Status: 401,
		Body: fake.ErrorBody(401, "login-required", "access denied")})
	for uid, want := range map[int]string{1000: "error: restart k8s.kubelet: access denied (try with sudo)\n", 0: "error: restart k8s.kubelet: access denied\n"} {
		var stdout, stderr lockedBuffer
		code := run(safetyNet(t), []string{"restart", "k8s.kubelet"}, env{stdout: &stdout, stderr: &stderr,
			getenv: socketEnv(srv.SocketPath()), geteuid: func() int { return uid }})
		if code != exitFailed || stderr.String() != want {
			t.Errorf("uid %d: exit %d, stderr %q; want exit 1, %q", uid, code, stderr.String(), want)
		}
		stdout, stderr = lockedBuffer{}, lockedBuffer{}
		code = run(safetyNet(t), []string{"--json", "restart", "k8s.kubelet"}, env{stdout: &stdout, stderr: &stderr,
			getenv: socketEnv(srv.SocketPath()), geteuid: func() int { return uid }})
		if doc := decodeError(t, code, stdout.String()); code != exitFailed || *doc.Error.Retryable || "error: "+doc.Error.Message+"\n" != want {
			t.Errorf("uid %d, --json: exit %d, %s; want exit 1, not retryable, %q", uid, code, stdout.String(), want)
		}
	}
}

// TestOverviewNamesEveryCommand checks that the help's opening paragraph,
// which sorts the commands into snap's and snapsvc's own, names every
// command of each group, from the command tree: it left out logs.
func TestOverviewNamesEveryCommand(t *testing.T) {
	code, out, _ := runWithSocket(context.Background(), "/unused.socket", false, "--help")
	text := strings.Join(strings.Fields(out), " ")
	m := regexp.MustCompile(`where they overlap \(([a-z, -]+)\); ([a-z, -]+) are its own\.`).FindStringSubmatch(text)
	if code != exitOK || m == nil {
		t.Fatalf("--help: exit %d, no overview of the commands:\n%s", code, out)
	}
	lists := map[string]map[string]bool{groupSnap: {}, groupExtras: {}}
	for group, list := range map[string]string{groupSnap: m[1], groupExtras: strings.ReplaceAll(m[2], " and ", ", ")} {
		for _, name := range strings.Split(list, ", ") {
			lists[group][name] = true
		}
	}
	a := &app{}
	for _, c := range a.newRoot().Commands() {
		if c.Hidden || c.GroupID == "" || c.Name() == "help" || c.Name() == "completion" || c.Name() == "man" {
			continue
		}
		if !lists[c.GroupID][c.Name()] {
			t.Errorf("the overview's list of group %s lacks %s: %q", c.GroupID, c.Name(), m[0])
		}
		delete(lists[c.GroupID], c.Name())
	}
	for group, left := range lists {
		for name := range left {
			t.Errorf("the overview names %s in group %s, which has no such command", name, group)
		}
	}
}
