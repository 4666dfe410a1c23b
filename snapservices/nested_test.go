package snapservices_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Issue 27, item 7, against the fake: k8sd's loop shape (5 attempts, a
// delay; 200 ms here for 5 s) with the nested policy derived from it. A
// foreign change that never ends is waited for the loop's whole bound in
// the first attempt, and the loop then stops: one attempt, not five of the
// nested policy's time plus four pauses.
func TestNestedStuckBlockerEndsTheLoopAtItsBound(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
	loop := retry.Loop{Attempts: 5, Delay: 200 * time.Millisecond}
	s := newREST(t, srv, snapservices.WithClientOptions(snapsvc.WithPolicy(loop.NestedPolicy())))
	srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"}) // never finished
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	attempts := 0
	err := loop.Do(ctx, func() error {
		attempts++
		return s.StartServices(ctx, []string{"kubelet"})
	})
	var stopped *retry.StoppedError
	if attempts != 1 || !errors.As(err, &stopped) || stopped.Bound != time.Second || !stopped.Retryable() ||
		!errors.Is(err, snapsvc.ErrGaveUp) || !retry.IsConflict(err) {
		t.Fatalf("%d attempts, %v: want one attempt that gave up on the conflict, and the loop stopped at its 1s bound", attempts, err)
	}
}

// An installed snapd whose socket is missing: each attempt waits one delay
// for it (it cost the nested policy's 30 s per call), and the loop goes on
// at once with the next, so the attempts fit the loop's bound.
func TestNestedMissingSocketCostsOneDelayPerAttempt(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{"usr/lib/snapd", "run/systemd/system"} {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/lib/snapd/snapd"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	loop := retry.Loop{Attempts: 5, Delay: 200 * time.Millisecond}
	s, err := snapservices.New(snapservices.WithInstance("k8s"), snapservices.WithClientOptions(
		snapsvc.WithSocket(filepath.Join(root, "run/snapd.socket")), snapsvc.WithSnapdRoot(root),
		snapsvc.WithLockDir(t.TempDir()), snapsvc.WithPolicy(loop.NestedPolicy())))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	attempts := 0
	err = loop.Do(ctx, func() error {
		attempts++
		return s.RestartServices(ctx, []string{"kubelet"})
	})
	var stopped *retry.StoppedError
	var connErr *snapsvc.ConnectionError
	if attempts < 2 || !errors.As(err, &stopped) || !stopped.Retryable() || !errors.As(err, &connErr) || errors.Is(err, snapsvc.ErrSnapdNotInstalled) {
		t.Fatalf("%d attempts, %v: want several attempts, each giving up on the missing socket after one delay", attempts, err)
	}
}
