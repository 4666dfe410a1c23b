package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
)

// runWithSocket runs a command line in this process against the snapd at
// sock. terminal says whether stderr counts as a terminal.
func runWithSocket(ctx context.Context, sock string, terminal bool, args ...string) (int, string, string) {
	var stdout, stderr lockedBuffer
	code := run(ctx, args, env{stdout: &stdout, stderr: &stderr, terminal: terminal, getenv: socketEnv(sock)})
	return code, stdout.String(), stderr.String()
}

// socketEnv is an environment with only SNAPSVC_SOCKET set, to sock.
func socketEnv(sock string) func(string) string {
	return func(k string) string {
		if k == "SNAPSVC_SOCKET" {
			return sock
		}
		return ""
	}
}

// TestTimeoutAfterCommand checks that --timeout after the command bounds
// the command: with a foreign change holding the snap, wait and restart
// give up after 500ms with exit 3, not at the safety net. (The bound is
// long enough that a loaded machine does not reach it with the restart's
// request in flight, which would rightly be exit 5, outcome unknown.)
func TestTimeoutAfterCommand(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the fake's own cleanup
	for _, tc := range []struct {
		name string
		args func(held string) []string
		want string
	}{
		{"wait", func(held string) []string { return []string{"wait", held, "--timeout", "500ms"} }, "waiting for change 1"},
		{"restart", func(string) []string { return []string{"restart", "k8s.kubelet", "--timeout=500ms"} }, "restart k8s.kubelet"},
		{"wait-idle", func(string) []string { return []string{"wait-idle", "k8s", "--timeout", "500ms"} }, "k8s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
			defer held.Finish()
			// Safety net only: the CLI's own --timeout must end this.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			code, _, errOut := runWithSocket(ctx, srv.SocketPath(), false, tc.args(held.ID())...)
			took := time.Since(start)
			if code != exitTimeout || !strings.Contains(errOut, "timed out after 500ms (--timeout)") || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want exit 3 from --timeout naming %q", code, errOut, tc.want)
			}
			if ctx.Err() != nil || took > 10*time.Second {
				t.Errorf("took %v: --timeout 500ms was not applied", took)
			}
		})
	}
}

// TestVerboseAfterCommand checks that -v after the command, like before
// it, turns the terminal progress line into the library's slog lines.
func TestVerboseAfterCommand(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the fake's own cleanup
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const progressLine = "\r\033[K"

	code, _, errOut := runWithSocket(ctx, srv.SocketPath(), true, "restart", "k8s.kubelet")
	if code != exitOK || !strings.Contains(errOut, progressLine) {
		t.Fatalf("without -v on a terminal: exit %d, want a progress line on stderr, got %q", code, errOut)
	}
	for _, args := range [][]string{{"-v", "restart", "k8s.kubelet"}, {"restart", "k8s.kubelet", "-v"}} {
		code, _, errOut := runWithSocket(ctx, srv.SocketPath(), true, args...)
		if code != exitOK || strings.Contains(errOut, progressLine) || !strings.Contains(errOut, `level=INFO msg="change created"`) {
			t.Errorf("%q: exit %d, want slog text and no progress line on stderr, got %q", args, code, errOut)
		}
	}
}

// decodeOne decodes out as exactly one JSON document.
func decodeOne(t *testing.T, out string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(out))
	if err := dec.Decode(v); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, out)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON document:\n%s", out)
	}
}

// TestWaitJSONFailedChange checks that under --json a failed wait prints
// one document: the error, with the change embedded.
func TestWaitJSONFailedChange(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the fake's own cleanup
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
	held.Fail("configure hook exploded")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code, out, errOut := runWithSocket(ctx, srv.SocketPath(), false, "--json", "wait", held.ID())
	if code != exitFailed {
		t.Fatalf("exit %d, want 1: %s", code, errOut)
	}
	var doc struct {
		Error struct {
			Message  string `json:"message"`
			ExitCode int    `json:"exit-code"`
			Change   string `json:"change"`
			Status   string `json:"status"`
			Detail   struct {
				ID     string `json:"id"`
				Status string `json:"status"`
				Err    string `json:"err"`
			} `json:"detail"`
		} `json:"error"`
	}
	decodeOne(t, out, &doc)
	e := doc.Error
	if e.ExitCode != 1 || e.Change != held.ID() || e.Status != "Error" || e.Detail.ID != held.ID() ||
		e.Detail.Status != "Error" || !strings.Contains(e.Detail.Err, "configure hook exploded") ||
		!strings.Contains(e.Message, "configure hook exploded") {
		t.Errorf("error document: %+v\n%s", e, out)
	}
}

// TestUsageErrorsJSON checks the one rule for usage errors: exit 2; under
// --json (wherever it is on the line) one error document on stdout and
// nothing on stderr; without --json the problem on stderr and nothing on
// stdout.
func TestUsageErrorsJSON(t *testing.T) {
	ctx := context.Background()
	sock := t.TempDir() + "/unused.socket" // no request may be made
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--json", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"--json", "--bogus", "status"}, "unknown flag: --bogus"},
		{[]string{"restart", "--bogus", "k8s.kubelet", "--json"}, "unknown flag: --bogus"},
		{[]string{"restart", "--json=true", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"--json", "start"}, "start needs at least one snap or service name"},
		{[]string{"--json", "restart", "K8S.kubelet"}, `invalid service name "K8S.kubelet"`},
		{[]string{"change", "abc", "--json"}, `change id "abc" is not a number`},
	} {
		code, out, errOut := runWithSocket(ctx, sock, false, tc.args...)
		if code != exitUsage || errOut != "" {
			t.Errorf("%q: exit %d, stderr %q; want exit 2, nothing on stderr", tc.args, code, errOut)
			continue
		}
		var doc struct {
			Error struct {
				Message  string `json:"message"`
				ExitCode int    `json:"exit-code"`
			} `json:"error"`
		}
		decodeOne(t, out, &doc)
		if doc.Error.ExitCode != exitUsage || !strings.Contains(doc.Error.Message, tc.msg) {
			t.Errorf("%q: error document %s", tc.args, out)
		}
	}
	for args, msg := range map[string]string{
		"frobnicate":                   `unknown command "frobnicate"`,
		"restart --bogus":              "unknown flag: --bogus",
		"restart --json=false --bogus": "unknown flag: --bogus",
		"restart -- --json":            `invalid service name "--json"`,
	} {
		if code, out, errOut := runWithSocket(ctx, sock, false, strings.Fields(args)...); code != exitUsage || out != "" || !strings.Contains(errOut, "error: "+msg) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, nothing on stdout, stderr saying %q", args, code, out, errOut, msg)
		}
	}
}

// TestUnreachableSnapd checks that read commands exit 3, as documented for
// an unreachable snapd, and say where they looked for it.
func TestUnreachableSnapd(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the fake's own cleanup
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sock := t.TempDir() + "/nosuch.socket"
	for _, args := range [][]string{{"status", "k8s"}, {"changes"}, {"change", "1"}, {"--json", "status"}, {"services"}, {"watch", "1"}, {"wait-idle", "k8s"}, {"abort", "1"}, {"follow"}} {
		args = append(args, "--wait-snapd", "100ms")
		code, out, errOut := runWithSocket(ctx, sock, false, args...)
		said := `cannot reach snapd at ` + regexp.QuoteMeta(sock) + `: no socket there \(is snapd running\?\)(; gave up after 100ms \(--wait-snapd\))?`
		if args[0] == "--json" {
			// The error on stdout alone; stderr has only what was said
			// while it tried.
			var doc struct {
				Error struct {
					Message   string `json:"message"`
					ExitCode  int    `json:"exit-code"`
					Retryable bool   `json:"retryable"`
				} `json:"error"`
			}
			decodeOne(t, out, &doc)
			if code != exitTimeout || doc.Error.ExitCode != exitTimeout || !doc.Error.Retryable || !regexp.MustCompile(`^`+said+`$`).MatchString(doc.Error.Message) || strings.Contains(errOut, "error") {
				t.Errorf("%q: exit %d, %s; stderr %q", args, code, out, errOut)
			}
			continue
		}
		if code != exitTimeout || !regexp.MustCompile(`(?m)^error: `+said+`\nTrying again later may help.\n\z`).MatchString(errOut) {
			t.Errorf("%q against a missing socket: exit %d, stderr %q; want exit 3 naming the socket, then that trying again may help", args, code, errOut)
		}
	}
}
