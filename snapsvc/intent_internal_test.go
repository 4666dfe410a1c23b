package snapsvc

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/internal/flock"
	"github.com/snapsvc/snapsvc/internal/snapd"
)

// A forward step of the wall clock against the boot clock since the send
// (an NTP jump forward on a board without an RTC) must not widen the
// look-up window earlier: an identical restart made before the intent's
// send would pass for its change, and the intent's restart be lost.
func TestIntentReplayAfterAForwardStepAdoptsNoEarlierChange(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true}}}))
	dir := filepath.Join(srv.Dir(), "locks")
	mk := func(opts ...Option) *Client {
		c, err := New(append([]Option{WithSocket(srv.SocketPath()), WithMode(ModeREST), WithLockDir(dir)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Someone's restart, done before the intent.
	c0 := mk()
	res, err := c0.Restart(ctx, []string{"k8s.kubelet"}, RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Made by another process: not claimed in this one.
	o, _ := c0.prepare("restart", []string{"k8s.kubelet"}, func(*request) {})
	c0.snaps.unclaim(o, res.ChangeID)
	// A process records a restart, sends it (its first request to this
	// snapd: seen 0) and dies before snapd reads it; then the machine
	// suspends for an hour (the wall clock runs on, the monotonic one
	// does not): as written here, its send's monotonic reading is an hour
	// ahead of the wall's.
	chg, ok := srv.ChangeByID(res.ChangeID)
	if !ok {
		t.Fatal("no change", res.ChangeID)
	}
	now := chg.SpawnTime.Add(100 * time.Millisecond) // the send, after it
	body := intentBody{Action: "restart", Names: []string{"k8s.kubelet"}, At: bootNow(), Wall: now.UnixNano(),
		Sent: &intentSent{Wall: now.UnixNano(), Mono: bootNow() + int64(time.Hour)}}
	r, err := createIntent(filepath.Join(dir, "k8s.1.intent"), body)
	if err != nil {
		t.Fatal(err)
	}
	r.keep()
	rs, err := mk().Replay(ctx, "k8s")
	if err != nil || len(rs) != 1 {
		t.Fatalf("%+v %v", rs, err)
	}
	n := 0
	for _, c := range srv.Changes() {
		if c.Kind == "service-control" {
			n++
		}
	}
	if rs[0].Decision != ReplayActed || n != 2 {
		t.Fatalf("replay %s (change %v): an identical restart made before the send was adopted; %d restarts done, want 2", rs[0].Decision, rs[0].Result, n)
	}
}

// A host Client (system snapd, no snap of its own, no WithLockDir)
// records intents in each snap's lock directory: its start-up replay
// looks in every one.
func TestIntentHostClientScansEverySnapsLockDirectory(t *testing.T) {
	dir := t.TempDir()
	oldData, oldEuid := snapDataDir, lockDirEuid
	snapDataDir, lockDirEuid = dir, func() int { return 0 }
	t.Cleanup(func() { snapDataDir, lockDirEuid = oldData, oldEuid })
	if err := os.MkdirAll(filepath.Join(dir, "k8s", "common"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := &Client{lockDirs: defaultLockDirs(snapd.DefaultSocket, func(string) string { return "" })}
	o := request{action: "restart", t: target{snaps: []string{"k8s"}, names: []string{"k8s.kubelet"}}}
	r, err := c.recordIntent(o)
	if err != nil || r == nil {
		t.Fatal(r, err)
	}
	r.keep()
	found, err := c.intentPaths(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Errorf("an intent in %s is not among those the start-up replay looks at", c.lockDirs.of("k8s"))
	}
}

// Clearing an intent takes no lock another process could hold up: a
// process stopped (SIGSTOP) while it holds the snap's peers lock must not
// hang every Restart's return.
func TestIntentClearWaitsForNoPeer(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true}}}))
	dir := filepath.Join(srv.Dir(), "locks")
	c, err := New(WithSocket(srv.SocketPath()), WithMode(ModeREST), WithLockDir(dir), WithIntents())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Startup(context.Background()); err != nil {
		t.Fatal(err)
	}
	stopped, err := flock.Acquire(context.Background(), filepath.Join(dir, "k8s"+peersSuffix))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, RestartOptions{})
		done <- err
	}()
	// A stopped peer holding the snap's peers lock holds up no intent's
	// end: the restart returns with its outcome.
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	stopped.Unlock()
}
