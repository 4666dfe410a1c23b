package main

import (
	"encoding/json"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
)

// TestQuietOutput runs a restart that waits out a foreign change, in each
// combination of terminal, -v, --log-format and --no-wait, and checks what
// stderr gets: nothing off a terminal without -v and nothing at all under
// --no-wait (as snap), the self-erasing line on a terminal, progress lines
// with -v's text log, JSON Lines alone with --log-format json.
func TestQuietOutput(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	for _, tc := range []struct {
		name     string
		terminal bool
		args     []string
		check    func(t *testing.T, stderr string)
	}{
		{"off a terminal", false, nil, func(t *testing.T, stderr string) {
			if stderr != "" {
				t.Errorf("stderr %q, want nothing", stderr)
			}
		}},
		{"off a terminal, --no-wait", false, []string{"--no-wait"}, func(t *testing.T, stderr string) {
			if stderr != "" {
				t.Errorf("stderr %q, want nothing", stderr)
			}
		}},
		{"on a terminal, --no-wait", true, []string{"--no-wait"}, func(t *testing.T, stderr string) {
			if stderr != "" {
				t.Errorf("stderr %q, want nothing", stderr)
			}
		}},
		{"on a terminal", true, nil, func(t *testing.T, stderr string) {
			if !strings.Contains(stderr, "change 1 (configure-snap) holds the snap") || !strings.Contains(stderr, "\r\033[K") ||
				!strings.HasSuffix(stderr, "waited for change 1 holding the snap (1 conflict(s) absorbed)\n") {
				t.Errorf("stderr %q, want the erased line and what was waited out", stderr)
			}
		}},
		{"off a terminal, -v", false, []string{"-v"}, func(t *testing.T, stderr string) {
			for _, want := range []string{"restart k8s.kubelet: waiting for change 1 (configure-snap) that holds the snap\n", "level=INFO", "waited for change 1 holding the snap"} {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr)
				}
			}
		}},
		{"off a terminal, -v --log-format json", false, []string{"-v", "--log-format=json"}, func(t *testing.T, stderr string) {
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			for _, l := range lines {
				var rec struct{ Level, Msg string }
				if err := json.Unmarshal([]byte(l), &rec); err != nil || rec.Level == "" || rec.Msg == "" {
					t.Errorf("stderr line is not a slog JSON record: %q", l)
				}
			}
			if len(lines) < 2 {
				t.Errorf("stderr %q, want the log", stderr)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
			ctx := safetyNet(t)
			finished := make(chan struct{})
			go func() {
				defer close(finished)
				// The snap set ends once the restart has run into it and
				// waits for it (long-polling snapd's notices).
				if srv.WaitFor(ctx, func(v fake.View) bool { return v.Conflicts() >= 1 && v.RequestsTo("GET /v2/notices") > 0 }) == nil {
					held.Finish()
				}
			}()
			var stdout, stderr lockedBuffer
			args := append([]string{"restart", "k8s.kubelet"}, tc.args...)
			code := run(ctx, args, env{stdout: &stdout, stderr: &stderr, terminal: tc.terminal, width: func() int { return 120 }, getenv: socketEnv(srv.SocketPath())})
			<-finished
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			tc.check(t, stderr.String())
		})
	}
}
