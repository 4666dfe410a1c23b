package main

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/creack/pty"

	"github.com/snapsvc/snapsvc/fake"
)

// TestProgressAndInterruptPTY drives the snapsvc binary through a pseudo-
// terminal, as a user at a 60-column terminal would: while a "snap set"
// holds the snap, restart draws one self-erasing line naming the blocking
// change, its kind and the time waited, never wider than the terminal;
// Ctrl-C (the terminal's own interrupt character, not a signal sent by
// the test) ends it with exit 130. watch ID on the held change, then
// Ctrl-C: exit 130, naming the change and the command that waits again.
func TestProgressAndInterruptPTY(t *testing.T) {
	bin, err := exec.LookPath("snapsvc") // TestMain puts the test binary on PATH as snapsvc
	if err != nil {
		t.Skip("no snapsvc command on PATH:", err)
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
	ctx := safetyNet(t)

	run := func(args ...string) (*notifyBuffer, func() int, io.Writer) {
		cmd := exec.Command(bin, append([]string{"--socket", srv.SocketPath()}, args...)...)
		cmd.Env = append(os.Environ(), "TERM=xterm")
		tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 60})
		if err != nil {
			t.Fatal(err)
		}
		out := newNotifyBuffer()
		copied := make(chan struct{})
		go func() { io.Copy(out, tty); close(copied) }()
		return out, func() int {
			err := cmd.Wait()
			<-copied
			tty.Close()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return ee.ExitCode()
			}
			if err != nil {
				t.Fatal(err)
			}
			return 0
		}, tty
	}

	out, wait, tty := run("restart", "k8s.kubelet")
	if !out.waitFor(ctx, "change 1 (configure-snap) holds the snap, 1s · restart k…") {
		t.Fatalf("no progress line naming the blocking change: %q", out.String())
	}
	if !out.waitFor(ctx, "\r\033[K") {
		t.Fatalf("progress line not self-erasing: %q", out.String())
	}
	tty.Write([]byte{3}) // Ctrl-C
	if code := wait(); code != exitInterrupted {
		t.Errorf("restart after Ctrl-C: exit %d, want 130: %q", code, out.String())
	}
	for _, line := range regexp.MustCompile(`\r\x1b\[K`).Split(out.String(), -1) {
		for _, l := range strings.Split(line, "\n") {
			if strings.Contains(l, "holds the snap") && !strings.HasPrefix(l, "error") && utf8.RuneCountInString(strings.TrimSuffix(strings.TrimRight(l, "\r"), "^C")) > 59 { // the terminal echoes ^C
				t.Errorf("progress line wider than the 60-column terminal: %q", l)
			}
		}
	}
	if srv.Change("2") != nil {
		t.Errorf("a change was made although the restart was interrupted while waiting")
	}

	out, wait, tty = run("watch", held.ID())
	if !out.waitFor(ctx, "change 1 (configure-snap) running, 0s · watch 1") {
		t.Fatalf("no progress line for watch: %q", out.String())
	}
	tty.Write([]byte{3})
	if code := wait(); code != exitInterrupted {
		t.Errorf("watch after Ctrl-C: exit %d, want 130: %q", code, out.String())
	}
	if !strings.Contains(out.String(), "Change 1 goes on in snapd: 'snapsvc watch 1' waits for it again") {
		t.Errorf("no hint to wait again: %q", out.String())
	}
	held.Finish()
}
