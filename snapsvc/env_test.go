package snapsvc_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Issue 27, item 5: nothing pointed a client at a fake snapd without code.
// SNAPPY_GLOBAL_ROOT (as snap's own client honours it) and SNAPSVC_SOCKET /
// SNAPSVC_SNAP_SOCKET now do, for a client built with no option.
func TestEnvironmentPointsNewAtAFake(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithDir(filepath.Join(root, "run")), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple"},
	}}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, env := range []map[string]string{
		{"SNAPPY_GLOBAL_ROOT": root},
		{"SNAPSVC_SOCKET": srv.SocketPath()},
		// Inside a snap: snapctl on the snap socket with the snap's cookie.
		{"SNAPPY_GLOBAL_ROOT": root, "SNAP_COOKIE": srv.Cookie("k8s"), "SNAP_NAME": "k8s"},
		{"SNAPSVC_SNAP_SOCKET": srv.SnapSocketPath(), "SNAP_COOKIE": srv.Cookie("k8s"), "SNAP_NAME": "k8s"},
	} {
		for _, k := range []string{"SNAPPY_GLOBAL_ROOT", "SNAPSVC_SOCKET", "SNAPSVC_SNAP_SOCKET", "SNAP_COOKIE", "SNAP_NAME", "SNAPSVC_HOOK"} {
			t.Setenv(k, env[k])
		}
		c, err := snapsvc.New(snapsvc.WithLockDir(t.TempDir()))
		if err != nil {
			t.Fatalf("%v: %v", env, err)
		}
		before := len(srv.Requests())
		if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
			t.Fatalf("%v: %v", env, err)
		}
		c.Close()
		if len(srv.Requests()) == before {
			t.Fatalf("%v: the fake saw no request", env)
		}
	}
}

// A root whose socket is missing, with no snapd installed under it (no
// daemon, no socket unit), fails at once as on a machine without snapd,
// instead of re-dialling for the policy's 30 s.
func TestEnvironmentRootWithoutSnapd(t *testing.T) {
	t.Setenv("SNAPPY_GLOBAL_ROOT", t.TempDir())
	t.Setenv("SNAP_COOKIE", "")
	t.Setenv("SNAPSVC_SOCKET", "")
	c, err := snapsvc.New(snapsvc.WithLockDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = c.Services(ctx, "k8s")
	var ni *snapsvc.NotInstalledError
	if !errors.Is(err, snapsvc.ErrSnapdNotInstalled) || !errors.As(err, &ni) || filepath.Dir(filepath.Dir(ni.Socket)) != os.Getenv("SNAPPY_GLOBAL_ROOT") {
		t.Fatalf("%v: want ErrSnapdNotInstalled for the socket under the root", err)
	}
}

// Issue 36: a snapd restart seen through SNAPPY_GLOBAL_ROOT (its socket
// gone for a moment from ROOT/run, where nothing is installed) was
// reported "not installed". It is waited for, as on a real system: the
// call succeeds once the socket is back.
func TestEnvironmentRootRestartIsWaitedFor(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithDir(filepath.Join(root, "run")), fake.WithSnaps(k8sSnap(0)))
	for _, k := range []string{"SNAPSVC_SOCKET", "SNAPSVC_SNAP_SOCKET", "SNAP_COOKIE", "SNAP_CONTEXT", "SNAP_NAME", "SNAPSVC_HOOK"} {
		t.Setenv(k, "")
	}
	t.Setenv("SNAPPY_GLOBAL_ROOT", root)
	sock := srv.SocketPath()
	hidden := sock + ".away"
	if err := os.Rename(sock, hidden); err != nil {
		t.Fatal(err)
	}
	unreachable := make(chan struct{}, 1)
	c, err := snapsvc.New(snapsvc.WithLockDir(t.TempDir()), snapsvc.WithObserver(func(ev snapsvc.Event) {
		if ev.Kind == snapsvc.EventUnreachable {
			select {
			case unreachable <- struct{}{}:
			default:
			}
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
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

// SocketsFromEnv says what a Client built without socket options dials.
func TestSocketsFromEnv(t *testing.T) {
	for _, c := range []struct {
		env              map[string]string
		socket, snapSock string
	}{
		{nil, "/run/snapd.socket", "/run/snapd-snap.socket"},
		{map[string]string{"SNAPPY_GLOBAL_ROOT": "/r"}, "/r/run/snapd.socket", "/r/run/snapd-snap.socket"},
		{map[string]string{"SNAPPY_GLOBAL_ROOT": "/r", "SNAPSVC_SOCKET": "/s"}, "/s", "/r/run/snapd-snap.socket"},
		{map[string]string{"SNAPSVC_SNAP_SOCKET": "/t"}, "/run/snapd.socket", "/t"},
	} {
		sock, snapSock := snapsvc.SocketsFromEnv(func(k string) string { return c.env[k] })
		if sock != c.socket || snapSock != c.snapSock {
			t.Errorf("%v: %s, %s; want %s, %s", c.env, sock, snapSock, c.socket, c.snapSock)
		}
	}
}
