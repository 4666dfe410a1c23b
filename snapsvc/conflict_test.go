package snapsvc_test

// Tests of conflicts with someone else's change (conflict.go): waited out,
// named, bounded.

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// A foreign change (a configure hook run by "snap set") holds the snap.
// Restart waits it out and its retry reaches snapd within 20ms of the
// change becoming ready, by the fake's own clock.
func TestRestartWaitsOutForeignChange(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	logs := newLogWatch()
	c := newClient(t, srv, snapsvc.WithLogger(logs.logger()))
	ctx := ctxT(t)

	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	lat := testclock.StartLateness()
	res, err := whenBlocked(t, logs, func() (*snapsvc.Result, error) {
		return c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	}, foreign.Finish)
	late := lat.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if res.Conflicts != 1 || res.Attempts != 2 || len(res.WaitedFor) != 1 || res.WaitedFor[0] != foreign.ID() {
		t.Errorf("result %+v, want 1 conflict, 2 attempts, waited for %s", res, foreign.ID())
	}
	readyAt := foreign.ReadyTime()
	var retryAt time.Time
	for _, r := range srv.Requests() {
		if r.Method == "POST" && r.Path == "/v2/apps" && r.Status == 202 {
			retryAt = r.Time
		}
	}
	lag := retryAt.Sub(readyAt)
	t.Logf("retry reached snapd %v after the foreign change was ready", lag)
	if retryAt.IsZero() || lag < 0 || lag > 20*time.Millisecond+latenessSteps*late {
		t.Errorf("retry at %v, foreign change ready at %v (lag %v), want within 20ms (and 3 times the %v the machine's timers fired late)", retryAt, readyAt, lag, late)
	}
	if srv.Counters().Conflicts != 1 {
		t.Errorf("conflicts %d, want 1", srv.Counters().Conflicts)
	}
}

// Inside a configure hook the hook's own change is left out of the
// blockers: only the other change is waited for.
func TestHookDoesNotWaitForItsOwnChange(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	hook := srv.StartHook("k8s", "install")
	defer hook.Finish()
	other := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: "k8s"})
	logs := newLogWatch()
	hc := newSnapctlClient(t, srv, hook.Cookie(), snapsvc.WithHook("install"), snapsvc.WithLogger(logs.logger()))
	res, err := whenBlocked(t, logs, func() (*snapsvc.Result, error) {
		return hc.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	}, other.Finish)
	if err != nil {
		t.Fatalf("hook restart: %v (%q)", err, logs.all())
	}
	if len(res.WaitedFor) != 1 || res.WaitedFor[0] != other.ID() {
		t.Errorf("waited for %v, want only %s (the hook's own change is %s)", res.WaitedFor, other.ID(), hook.ChangeID())
	}
}

// A daemon waiting out a configure change does not stop that change's
// configure hook from queueing its own service commands.
func TestDaemonWaitingDoesNotBlockConfigureHook(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	hook := srv.StartHook("k8s", "configure")
	logs := newLogWatch()
	daemon := newSnapctlClient(t, srv, srv.Cookie("k8s"), snapsvc.WithLogger(logs.logger()))
	waiting := logs.seen("conflict; waiting for blocking changes")
	ctx := ctxT(t)
	ddone := make(chan error, 1)
	go func() {
		_, err := daemon.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		ddone <- err
	}()
	recvT(t, waiting)
	hc := newSnapctlClient(t, srv, hook.Cookie(), snapsvc.WithHook("configure"))
	res, err := hc.Start(ctx, []string{"k8s.kube-proxy"}, snapsvc.StartOptions{})
	if err != nil || !res.Queued {
		t.Fatalf("configure hook's start: %+v %v", res, err)
	}
	hook.Finish()
	if err := recvT(t, ddone); err != nil {
		t.Fatalf("daemon's restart: %v", err)
	}
}

// Giving up on a conflict keeps the typed conflict, naming the blocker.
func TestGiveUpKeepsConflictError(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	logs := newLogWatch()
	pol := retry.DefaultPolicy()
	pol.MaxAttempts = 2 // one attempt left after the conflict: the blocker is waited out
	c := newClient(t, srv, snapsvc.WithPolicy(pol), snapsvc.WithLogger(logs.logger()))
	waiting := logs.seen("conflict; waiting for blocking changes")
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- err
	}()
	recvT(t, waiting)
	cancel() // the caller gives up while the blocker runs
	err := recvT(t, done)
	var ce *retry.ConflictError
	var opErr *snapsvc.OpError
	if !errors.As(err, &ce) || ce.ChangeID != foreign.ID() || ce.ChangeKind != "configure-snap" || !errors.As(err, &opErr) || !opErr.Retryable() {
		t.Fatalf("error %v: want a retryable conflict naming change %s", err, foreign.ID())
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("error %v does not say the caller gave up", err)
	}
	foreign.Finish()
}

// A blocker waiting for a reboot cannot be waited out: the operation ends
// with an error naming it.
func TestBlockerInWaitEndsOperation(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	refresh := srv.AddChange(fake.ChangeSpec{Kind: "auto-refresh", Snap: "k8s", Tasks: []fake.TaskSpec{{Kind: "link-snap", Summary: `Make snap "k8s" available to the system`}}})
	refresh.Wait()
	if st := refresh.Info().Status; st != fake.StatusWait {
		t.Fatalf("foreign change is %s, want Wait", st)
	}
	c := newClient(t, srv)
	_, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var ce *retry.ConflictError
	if !errors.Is(err, snapsvc.ErrGaveUp) || !errors.As(err, &ce) || ce.ChangeID != refresh.ID() {
		t.Fatalf("error %v: want a give-up naming change %s", err, refresh.ID())
	}
}

// With snapd's state file watched, a first conflict is retried at the
// next rewrite, without listing changes or reading the blocker: most
// blockers are service changes that end within milliseconds, and on snapd
// < 2.62 naming the blocker costs requests (a listing, reads) that a short
// wait cannot afford within issue 12's 20 requests/s.
func TestConflictRetriedAtStateRewrite(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(fake.Version257), fake.WithStateFile(), fake.WithSnaps(k8sSnap(0)))
	var events []snapsvc.Event
	var mu sync.Mutex
	c := newClient(t, srv, snapsvc.WithStateFile(srv.StateFile()), snapsvc.WithPollInterval(time.Hour),
		snapsvc.WithObserver(func(e snapsvc.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctxT(t), out, "k8s.kubelet")
	if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.Conflicts() > 0 }); err != nil {
		t.Fatal(err)
	}
	foreign.Finish()
	o := recvT(t, out)
	if o.err != nil {
		t.Fatal(o.err)
	}
	res := o.res
	cnt := srv.Counters()
	if res.Conflicts != 1 || res.Attempts != 2 || cnt.Requests["GET /v2/changes"] != 0 || cnt.Requests["GET /v2/changes/{id}"] > 2 {
		t.Fatalf("result %+v, requests %v: want one conflict, retried without listing", res, cnt.Requests)
	}
	for _, r := range srv.Requests() {
		if r.Path == "/v2/changes/"+foreign.ID() {
			t.Errorf("the blocker was read")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.ContainsFunc(events, func(e snapsvc.Event) bool { return e.Kind == snapsvc.EventConflict && e.Err != nil }) {
		t.Errorf("no conflict event: %+v", events)
	}
}

// MaxAttempts must bound conflicts whose blocker is visible too
// (retry.Policy doc: "only MaxAttempts and MaxElapsedTime bound them").
// A chain of foreign changes keeps the snap busy: with MaxAttempts 2 and no
// elapsed bound the restart must give up after 2 attempts.
func TestMaxAttemptsBoundsVisibleConflicts(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	logs := newLogWatch()
	pol := retry.DefaultPolicy()
	pol.MaxAttempts = 2
	pol.MaxElapsedTime = -1
	c := newClient(t, srv, snapsvc.WithPolicy(pol), snapsvc.WithLogger(logs.logger()))
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	cur := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	type outcome struct {
		res *snapsvc.Result
		err error
	}
	done := make(chan outcome, 1)
	waiting := logs.seen("conflict; waiting for blocking changes")
	go func() {
		res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- outcome{res, err}
	}()
	const rounds = 5
	for i := 0; i < rounds; i++ {
		select {
		case o := <-done:
			if !errors.Is(o.err, snapsvc.ErrGaveUp) {
				t.Fatalf("round %d: %+v %v, want a give-up", i, o.res, o.err)
			}
			if n := srv.Counters().Requests["POST /v2/apps"]; n > 2 {
				t.Fatalf("%d requests with MaxAttempts 2", n)
			}
			cur.Finish()
			return
		case <-waiting:
		}
		waiting = logs.seen("conflict; waiting for blocking changes")
		next := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
		cur.Finish()
		cur = next
	}
	cancel()
	o := recvT(t, done)
	cur.Finish()
	t.Fatalf("still retrying after %d rounds with MaxAttempts 2: %d POST /v2/apps sent; err %v", rounds, srv.Counters().Requests["POST /v2/apps"], o.err)
}

// With MaxAttempts 1 a conflict ends the call at once, the blocker not
// waited out: no attempt could follow it (found with issue 36: the call
// waited out the blocker for its whole MaxElapsedTime, then gave up).
func TestOneAttemptDoesNotWaitOutTheBlocker(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	pol := retry.DefaultPolicy()
	pol.MaxAttempts = 1
	c := newClient(t, srv, snapsvc.WithPolicy(pol))
	blocker := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	defer blocker.Finish()
	res, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var oe *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrGaveUp) || !retry.IsConflict(err) || !errors.As(err, &oe) || !oe.Retryable() {
		t.Fatalf("one attempt into a blocker: %+v, %v; want a retryable give-up keeping the conflict", res, err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 {
		t.Errorf("%d requests to act, want 1", n)
	}
	if n := srv.Counters().Requests["GET /v2/changes"]; n != 0 {
		t.Errorf("%d listings of the blockers, want none: nothing would follow them", n)
	}
}

// Issue 44, item 3: a blocker refused the first attempt, a state file
// rewrite of someone else's woke the retry while it still ran, and snapd
// refused again; the result said 2 conflicts for one blocking change.
// It says one conflict, two refusals.
func TestConflictCountedOncePerBlocker(t *testing.T) {
	srv := fake.NewServer(t, fake.WithVersion(fake.Version257), fake.WithStateFile(),
		fake.WithSnaps(k8sSnap(0), fake.Snap{Name: "other", Apps: []fake.App{{Name: "d", Daemon: "simple"}}}))
	c := newClient(t, srv, snapsvc.WithStateFile(srv.StateFile()), snapsvc.WithPollInterval(time.Hour))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctxT(t), out, "k8s.kubelet")
	if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.Conflicts() > 0 }); err != nil {
		t.Fatal(err)
	}
	// A change of another snap rewrites the state file: the retry it
	// wakes is refused by the same blocker, which is then listed.
	other := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "other"})
	if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.Conflicts() > 1 && v.Handled("GET /v2/changes") > 0 }); err != nil {
		t.Fatal(err)
	}
	other.Finish()
	foreign.Finish()
	o := recvT(t, out)
	if o.err != nil {
		t.Fatal(o.err)
	}
	if res := o.res; res.Conflicts != 1 || res.Refused != 2 || res.Attempts != 3 || !slices.Equal(res.WaitedFor, []string{foreign.ID()}) {
		t.Fatalf("result %+v: want one conflict (change %s) behind two refusals", res, foreign.ID())
	}
}
