package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
)

// notifyBuffer is a buffer safe for concurrent use whose readers can wait
// for some text to be written.
type notifyBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed and replaced at every write
}

func newNotifyBuffer() *notifyBuffer { return &notifyBuffer{written: make(chan struct{})} }

func (b *notifyBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.written)
	b.written = make(chan struct{})
	return b.b.Write(p)
}

func (b *notifyBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitFor waits until the buffer holds text, or ctx ends.
func (b *notifyBuffer) waitFor(ctx context.Context, text string) bool {
	for {
		b.mu.Lock()
		has, written := strings.Contains(b.b.String(), text), b.written
		b.mu.Unlock()
		if has {
			return true
		}
		select {
		case <-written:
		case <-ctx.Done():
			return false
		}
	}
}

// TestWatchRidesOutSnapdRestart checks that follow keeps going while snapd
// is away (within --wait-snapd): one line saying so on stderr, however
// many reads fail, then it picks up the change it was following once
// snapd is back.
func TestWatchRidesOutSnapdRestart(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the fake's own cleanup
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
	// Safety net only; every step below waits for an outcome.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	stdout, stderr := newNotifyBuffer(), newNotifyBuffer()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"follow", "--interval", "5ms", "--until-idle", "k8s"}, env{
			stdout: stdout, stderr: stderr,
			getenv: socketEnv(srv.SocketPath()),
		})
	}()
	if !stdout.waitFor(ctx, "change 1 configure-snap Doing") {
		t.Fatalf("watch did not show the held change: %q / %q", stdout.String(), stderr.String())
	}
	srv.StopListening()
	want := "snapsvc follow: cannot reach snapd at " + srv.SocketPath()
	if !stderr.waitFor(ctx, want) {
		t.Fatalf("no %q on stderr: %q", want, stderr.String())
	}
	if err := srv.StartListening(); err != nil {
		t.Fatal(err)
	}
	if !stderr.waitFor(ctx, "snapsvc follow: snapd answers again at "+srv.SocketPath()) {
		t.Fatalf("watch did not see snapd come back: %q", stderr.String())
	}
	held.Finish()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("watch exited %d: %s", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("watch did not end once the change was done")
	}
	if !strings.Contains(stdout.String(), "change 1 configure-snap Done") {
		t.Errorf("watch did not report the change done:\n%s", stdout.String())
	}
	if n := strings.Count(stderr.String(), "cannot reach snapd"); n != 1 {
		t.Errorf("%d outage lines, want 1:\n%s", n, stderr.String())
	}
}

// TestWatchWakesOnNotices checks that, where snapd has notices, watch
// shows a change's end as it happens rather than at its next read: with
// an hour between reads it still sees the change finish and ends.
func TestWatchWakesOnNotices(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // safety net
	defer cancel()
	stdout, stderr := newNotifyBuffer(), newNotifyBuffer()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"follow", "--interval", "1h", "--until-idle", "k8s"}, env{
			stdout: stdout, stderr: stderr,
			getenv: socketEnv(srv.SocketPath()),
		})
	}()
	if !stdout.waitFor(ctx, "change 1 configure-snap Doing") {
		t.Fatalf("watch did not show the held change: %q / %q", stdout.String(), stderr.String())
	}
	// Finish once watch is parked on the notices long-poll.
	srv.WaitFor(ctx, func(v fake.View) bool { return v.InFlight() > 0 })
	held.Finish()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("watch exited %d: %s", code, stderr.String())
		}
	case <-ctx.Done():
		t.Fatal("watch did not wake on the change's notice")
	}
	if !strings.Contains(stdout.String(), "change 1 configure-snap Done") {
		t.Errorf("watch did not report the change done:\n%s", stdout.String())
	}
}

// TestFollowInterrupted checks that follow, like every command, exits 130
// when interrupted (v0.1's watch exited 0), and that the deprecated
// "watch SNAP" does too.
func TestFollowInterrupted(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	for _, args := range [][]string{{"follow"}, {"watch", "k8s"}} {
		ctx, cancel := context.WithCancel(context.Background())
		stdout, stderr := newNotifyBuffer(), newNotifyBuffer()
		done := make(chan int, 1)
		go func() {
			done <- run(ctx, args, env{stdout: stdout, stderr: stderr, getenv: socketEnv(srv.SocketPath())})
		}()
		safety, stop := context.WithTimeout(context.Background(), 30*time.Second)
		if !stdout.waitFor(safety, "No change in progress; watching for new ones.") {
			t.Fatalf("%q did not start: %q", args, stderr.String())
		}
		stop()
		cancel() // what SIGINT does to realMain's context
		if code := <-done; code != exitInterrupted || !strings.Contains(stderr.String(), "error: interrupted") {
			t.Errorf("%q interrupted: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}
