package snapsvc_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// root makes a file-system root holding the given files and directories
// (a trailing slash makes a directory).
func root(t *testing.T, paths ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range paths {
		full := filepath.Join(dir, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// With no snapd, every call fails at once with a non-retryable error
// saying so, instead of waiting out the policy for a socket that will
// never appear. The clock never moves: a client that waited would hang
// until the test's deadline.
func TestMissingSnapdFailsAtOnce(t *testing.T) {
	for _, c := range []struct {
		name, why string
		root      string
	}{
		{"not installed", "neither snapd nor its snapd.socket unit is installed", root(t, "run/systemd/system/")},
		{"installed, no systemd", "systemd is not running", root(t, "usr/lib/snapd/snapd", "lib/systemd/system/snapd.socket")},
	} {
		t.Run(c.name, func(t *testing.T) {
			mc := fake.NewManualClock(time.Unix(1000, 0))
			socket := filepath.Join(t.TempDir(), "snapd.socket")
			cl, err := snapsvc.New(snapsvc.WithSocket(socket), snapsvc.WithMode(snapsvc.ModeREST),
				snapsvc.WithSnapdRoot(c.root), snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithoutFileLock())
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err = cl.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			var opErr *snapsvc.OpError
			var nie *snapsvc.NotInstalledError
			if !errors.Is(err, snapsvc.ErrSnapdNotInstalled) || !errors.As(err, &opErr) || opErr.Retryable() ||
				!errors.As(err, &nie) || nie.Socket != socket || !strings.Contains(err.Error(), c.why) || ctx.Err() != nil {
				t.Fatalf("%v: want a non-retryable *OpError wrapping ErrSnapdNotInstalled (%s), at once", err, c.why)
			}
			if _, err := cl.Services(ctx, "k8s"); !errors.Is(err, snapsvc.ErrSnapdNotInstalled) || ctx.Err() != nil {
				t.Fatalf("Services: %v", err)
			}
		})
	}
}

// A socket that vanishes while an installed snapd restarts under systemd
// is waited for: the call succeeds once the socket is back.
func TestVanishedSocketOfInstalledSnapdIsWaitedFor(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	sock := srv.SocketPath()
	hidden := sock + ".away"
	if err := os.Rename(sock, hidden); err != nil {
		t.Fatal(err)
	}
	unreachable := make(chan struct{}, 1)
	cl := newClient(t, srv, snapsvc.WithSnapdRoot(root(t, "usr/lib/snapd/snapd", "run/systemd/system/")),
		snapsvc.WithObserver(func(ev snapsvc.Event) {
			if ev.Kind == snapsvc.EventUnreachable {
				select {
				case unreachable <- struct{}{}:
				default:
				}
			}
		}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := cl.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		errc <- err
	}()
	select {
	case <-unreachable:
	case err := <-errc:
		t.Fatalf("returned while the socket was away: %v", err)
	}
	if err := os.Rename(hidden, sock); err != nil { // snapd is back
		t.Fatal(err)
	}
	if err := recvT(t, errc); err != nil {
		t.Fatalf("after the socket came back: %v", err)
	}
}
