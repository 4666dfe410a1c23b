package snapsvc_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// svcdemoStore is svcdemo at store revision 1 (version 1.0) with two
// services, and the store offering revision 2 (version 1.1) on
// latest/stable; its services take d to stop and to start.
func svcdemoStore(d time.Duration) (fake.Snap, fake.StoreRevision) {
	svc := func(name string) fake.App {
		return fake.App{Name: name, Daemon: "simple", Enabled: true, Active: true, StartDuration: d, StopDuration: d}
	}
	return fake.Snap{Name: "svcdemo", Version: "1.0", Revision: "1", Apps: []fake.App{svc("alpha"), svc("beta")}},
		fake.StoreRevision{Revision: "2", Version: "1.1"}
}

func newStoreServer(t *testing.T, d time.Duration, opts ...fake.Option) *fake.Server {
	t.Helper()
	sn, rev := svcdemoStore(d)
	return fake.NewServer(t, append([]fake.Option{fake.AllowNonRoot(), fake.WithSnaps(sn), fake.WithStoreRevision("svcdemo", rev)}, opts...)...)
}

// changesOf returns the fake's changes of kind.
func changesOf(srv *fake.Server, kind string) []fake.ChangeInfo {
	var out []fake.ChangeInfo
	for _, c := range srv.Changes() {
		if c.Kind == kind {
			out = append(out, c)
		}
	}
	return out
}

func TestRefreshToStoreRevision(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	c := newClient(t, srv)
	ctx := context.Background()
	res, err := c.Refresh(ctx, "svcdemo", snapsvc.RefreshOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refreshes := changesOf(srv, "refresh-snap")
	if len(refreshes) != 1 || refreshes[0].ID != res.ChangeID || refreshes[0].Status != "Done" || refreshes[0].Summary != `Refresh "svcdemo" snap` {
		t.Fatalf("result %+v; refresh changes %+v", res.Result, refreshes)
	}
	if res.NoUpdate || res.Status != "Done" || res.Attempts != 1 || res.Before == nil || res.Before.Revision != "1" ||
		res.After == nil || res.After.Revision != "2" || res.After.Version != "1.1" {
		t.Fatalf("result %+v before %+v after %+v", res.Result, res.Before, res.After)
	}
	// Nothing newer now: an outcome, no change, no error.
	again, err := c.Refresh(ctx, "svcdemo", snapsvc.RefreshOptions{})
	if err != nil || !again.NoUpdate || again.ChangeID != "" || again.After != nil {
		t.Fatalf("second refresh: %+v %v", again, err)
	}
	if n := len(changesOf(srv, "refresh-snap")); n != 1 {
		t.Fatalf("%d refresh changes after a refresh with no update, want 1", n)
	}
}

func TestRefreshAsyncNoUpdateIsDone(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "svcdemo", Revision: "3", Apps: []fake.App{{Name: "alpha", Daemon: "simple", Enabled: true, Active: true}}}))
	c := newClient(t, srv)
	op, err := c.RefreshAsync(context.Background(), "svcdemo", snapsvc.RefreshOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := op.Wait(doneCtx())
	if err != nil || !res.NoUpdate || res.ChangeID != "" {
		t.Fatalf("wait: %+v %v", res, err)
	}
}

// doneCtx is a context already ended: waiting with it succeeds only for
// an operation already final.
func doneCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func TestRefreshBadInputSendsNothing(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	c := newClient(t, srv)
	file := filepath.Join(t.TempDir(), "svcdemo_1.1_amd64.snap")
	if err := os.WriteFile(file, []byte("name: svcdemo\nversion: 1.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		snap string
		opts snapsvc.RefreshOptions
		want error
	}{
		{"service", "svcdemo.alpha", snapsvc.RefreshOptions{}, snapsvc.ErrInvalidName},
		{"bad name", "Svc", snapsvc.RefreshOptions{}, snapsvc.ErrInvalidName},
		{"bad risk", "svcdemo", snapsvc.RefreshOptions{Channel: "latest/unstable/fix"}, snapsvc.ErrInvalidRefresh},
		{"no risk", "svcdemo", snapsvc.RefreshOptions{Channel: "1.31/fix"}, snapsvc.ErrInvalidRefresh},
		{"empty part", "svcdemo", snapsvc.RefreshOptions{Channel: "latest//stable"}, snapsvc.ErrInvalidRefresh},
		{"bad revision", "svcdemo", snapsvc.RefreshOptions{Revision: "r7"}, snapsvc.ErrInvalidRefresh},
		{"no file", "svcdemo", snapsvc.RefreshOptions{File: file + ".gone"}, snapsvc.ErrInvalidRefresh},
		{"file and channel", "svcdemo", snapsvc.RefreshOptions{File: file, Channel: "edge"}, snapsvc.ErrInvalidRefresh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := srv.Counters().Requests
			_, err := c.Refresh(context.Background(), tc.snap, tc.opts)
			var oe *snapsvc.OpError
			if !errors.Is(err, tc.want) || !errors.As(err, &oe) || oe.Op != "refresh" || oe.Retryable() {
				t.Fatalf("err = %v, want %v, not retryable", err, tc.want)
			}
			if after := srv.Counters().Requests; !mapsEqual(before, after) {
				t.Fatalf("requests sent: %v -> %v", before, after)
			}
		})
	}
	for _, ok := range []string{"edge", "latest/edge", "1.31/stable", "1.31/stable/hotfix-1", "beta/hotfix"} {
		if _, err := c.Refresh(context.Background(), "svcdemo", snapsvc.RefreshOptions{Channel: ok}); errors.Is(err, snapsvc.ErrInvalidRefresh) {
			t.Errorf("channel %q refused: %v", ok, err)
		}
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestRefreshNotInstalled(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	c := newClient(t, srv)
	_, err := c.Refresh(context.Background(), "absent", snapsvc.RefreshOptions{})
	if !errors.Is(err, snapsvc.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	if n := len(changesOf(srv, "refresh-snap")); n != 0 {
		t.Fatalf("%d refresh changes", n)
	}
}

func TestRefreshInSnapctlModeIsRefused(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithSnapSocket(srv.SnapSocketPath()),
		snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithCookie(srv.Cookie("svcdemo")), snapsvc.WithSnap("svcdemo"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Refresh(context.Background(), "svcdemo", snapsvc.RefreshOptions{})
	if !errors.Is(err, snapsvc.ErrRefreshInSnapctl) || !strings.Contains(err.Error(), "gate-auto-refresh") {
		t.Fatalf("err = %v", err)
	}
	if _, err := c.HoldRefresh(context.Background(), "svcdemo", snapsvc.HoldOptions{}); !errors.Is(err, snapsvc.ErrRefreshInSnapctl) {
		t.Fatalf("hold: %v", err)
	}
	if n := srv.Counters().Requests["POST /v2/snaps/svcdemo"]; n != 0 {
		t.Fatalf("%d refresh requests", n)
	}
}

// TestRefreshWaitsOutForeignChange: a configure-snap change holds the
// snap; the refresh is refused, waits for it, and is made once after it.
func TestRefreshWaitsOutForeignChange(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	c := newClient(t, srv)
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "svcdemo", WithSnapNames: true})
	type out struct {
		res *snapsvc.RefreshResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := c.Refresh(context.Background(), "svcdemo", snapsvc.RefreshOptions{})
		done <- out{res, err}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Conflicts() >= 1 }); err != nil {
		t.Fatal(err)
	}
	foreign.Finish()
	o := <-done
	if o.err != nil {
		t.Fatal(o.err)
	}
	fid := foreign.ID()
	fchg, _ := srv.ChangeByID(fid)
	refreshes := changesOf(srv, "refresh-snap")
	if len(refreshes) != 1 || refreshes[0].ID != o.res.ChangeID || refreshes[0].SpawnTime.Before(fchg.ReadyTime) {
		t.Fatalf("refreshes %+v, foreign ready %v", refreshes, fchg.ReadyTime)
	}
	if o.res.Conflicts < 1 || !slices.Contains(o.res.WaitedFor, fid) && len(o.res.WaitedFor) > 0 {
		t.Fatalf("result %+v", o.res.Result)
	}
}

// TestRefreshLostAnswerRefreshesOnce: snapd makes the refresh's change and
// the answer is lost; the change is found and waited for, never asked for
// again.
func TestRefreshLostAnswerRefreshesOnce(t *testing.T) {
	for _, kind := range []fake.FaultKind{fake.FaultDrop, fake.FaultLate} {
		t.Run(kind.String(), func(t *testing.T) {
			srv := newStoreServer(t, time.Millisecond)
			c := newClient(t, srv)
			srv.InjectFault(fake.Fault{Kind: kind, Method: "POST", Path: "/v2/snaps/svcdemo", Times: 1})
			res, err := c.Refresh(context.Background(), "svcdemo", snapsvc.RefreshOptions{})
			if err != nil {
				t.Fatal(err)
			}
			refreshes := changesOf(srv, "refresh-snap")
			if len(refreshes) != 1 || res.ChangeID != refreshes[0].ID || res.NoUpdate || res.Attempts != 1 {
				t.Fatalf("result %+v; refreshes %+v", res.Result, refreshes)
			}
		})
	}
}

// TestRefreshFileLostAnswerInstallsOnce: a local file installs a new
// revision each time it is sent; with the answer lost, the install's
// change is found and adopted, and the file is never sent again.
func TestRefreshFileLostAnswerInstallsOnce(t *testing.T) {
	file := filepath.Join(t.TempDir(), "svcdemo_1.1_amd64.snap")
	if err := os.WriteFile(file, []byte("name: svcdemo\nversion: 1.1\napps:\n  alpha:\n    daemon: simple\n  beta:\n    daemon: simple\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []fake.FaultKind{fake.FaultDrop, fake.FaultLate} {
		t.Run(kind.String(), func(t *testing.T) {
			srv := newStoreServer(t, time.Millisecond)
			c := newClient(t, srv)
			srv.InjectFault(fake.Fault{Kind: kind, Method: "POST", Path: "/v2/snaps", Times: 1})
			res, err := c.Refresh(context.Background(), "svcdemo", snapsvc.RefreshOptions{File: file})
			if err != nil {
				t.Fatal(err)
			}
			installs := changesOf(srv, "install-snap")
			if len(installs) != 1 || res.ChangeID != installs[0].ID || res.Attempts != 1 {
				t.Fatalf("result %+v; installs %+v", res.Result, installs)
			}
			if want := `Install "svcdemo" snap from file "` + file + `"`; installs[0].Summary != want {
				t.Fatalf("summary %q, want %q", installs[0].Summary, want)
			}
			if res.After == nil || res.After.Revision != "x1" || res.After.Version != "1.1" {
				t.Fatalf("after %+v", res.After)
			}
		})
	}
}

// TestRefreshFailedChange: the new revision's service cannot start;
// snapd undoes the refresh and the change ends in Error.
func TestRefreshFailedChange(t *testing.T) {
	sn, rev := svcdemoStore(time.Millisecond)
	rev.Apps = []fake.App{{Name: "alpha", Daemon: "simple", FailStart: fake.SystemctlJobFailed("svcdemo", "alpha")}, {Name: "beta", Daemon: "simple"}}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(sn), fake.WithStoreRevision("svcdemo", rev))
	c := newClient(t, srv)
	_, err := c.Refresh(context.Background(), "svcdemo", snapsvc.RefreshOptions{})
	var ce *snapsvc.ChangeError
	var oe *snapsvc.OpError
	if !errors.As(err, &ce) || !ce.ChangeFailed() || !errors.As(err, &oe) || oe.ChangeID == "" || oe.Retryable() {
		t.Fatalf("err = %v", err)
	}
	if in, err := c.Snap(context.Background(), "svcdemo"); err != nil || in.Revision != "1" {
		t.Fatalf("after the failed refresh: %+v %v (want revision 1 again)", in, err)
	}
}
