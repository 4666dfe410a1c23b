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
	srv := fake.NewServer(t, fake.WithDir(filepath.Join(root, "run")), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
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
