package snapsvc_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// A lost answer is never matched to an earlier change of another service:
// when the lost request made no change, it is sent again.
func TestLostAnswerNotMatchedToOtherChange(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	ctx := ctxT(t)
	c := newClient(t, srv)
	first, err := c.Restart(ctx, []string{"k8s.containerd"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The conflict that answers the next request is lost on the way.
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	srv.DropNextResponse("POST", "/v2/apps")
	logs := newLogWatch()
	c2 := newClient(t, srv, snapsvc.WithLogger(logs.logger()))
	res, err := whenBlocked(t, logs, func() (*snapsvc.Result, error) {
		return c2.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	}, foreign.Finish)
	if err != nil {
		t.Fatal(err)
	}
	if res.ChangeID == first.ChangeID {
		t.Fatalf("kubelet's restart reported containerd's change %s", first.ChangeID)
	}
	chg, _ := srv.ChangeByID(res.ChangeID)
	if len(chg.Tasks) == 0 || chg.Tasks[0].Summary != `Run service command "restart" for services ["kubelet"] of snap "k8s"` {
		t.Errorf("change %s does %+v", res.ChangeID, chg.Tasks)
	}
}

// Inside a configure hook the hook's own change is left out of the
// blockers: only the other change is waited for.
func TestHookDoesNotWaitForItsOwnChange(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
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
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
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
	<-waiting
	hc := newSnapctlClient(t, srv, hook.Cookie(), snapsvc.WithHook("configure"))
	res, err := hc.Start(ctx, []string{"k8s.kube-proxy"}, snapsvc.StartOptions{})
	if err != nil || !res.Queued {
		t.Fatalf("configure hook's start: %+v %v", res, err)
	}
	hook.Finish()
	if err := <-ddone; err != nil {
		t.Fatalf("daemon's restart: %v", err)
	}
}

// Giving up on a conflict keeps the typed conflict, naming the blocker.
func TestGiveUpKeepsConflictError(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	logs := newLogWatch()
	pol := retry.DefaultPolicy()
	pol.MaxAttempts = 1
	c := newClient(t, srv, snapsvc.WithPolicy(pol), snapsvc.WithLogger(logs.logger()))
	waiting := logs.seen("conflict; waiting for blocking changes")
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- err
	}()
	<-waiting
	cancel() // the caller gives up while the blocker runs
	err := <-done
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
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
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

func TestServicesInSnapctlMode(t *testing.T) {
	snap := k8sSnap(0)
	snap.Apps[2].Enabled, snap.Apps[2].Active = false, false // kubelet
	srv := fake.NewServer(t, fake.WithSnaps(snap))
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	ctx := ctxT(t)
	svcs, err := c.Services(ctx, "k8s.kubelet", "k8s.containerd")
	if err != nil || len(svcs) != 2 {
		t.Fatalf("services: %+v %v", svcs, err)
	}
	for _, s := range svcs {
		if want := s.Name == "containerd"; s.Active != want || s.Enabled != want {
			t.Errorf("%+v", s)
		}
	}
	res, err := c.EnsureRunning(ctx, []string{"k8s.kubelet", "k8s.containerd"})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active || !st.Enabled || len(res.Changed) != 1 {
		t.Errorf("kubelet %+v after EnsureRunning %+v", st, res)
	}
}

// A restart whose snapctl answer timed out, when snapd does not let the
// snap list changes, is not sent again: running it twice is worse than
// saying the outcome is unknown.
func TestRestartNotResentWhenOutcomeUnknowable(t *testing.T) {
	clock := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(time.Minute)), fake.WithClock(clock), fake.WithSnapctlTimeout(30*time.Second), fake.WithSnapSocketObserveDenied())
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	done := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- err
	}()
	var err error
	for loop := true; loop; {
		added := clock.TimerAdded()
		if clock.Pending() > 0 {
			clock.AdvanceToNext()
			continue
		}
		select {
		case err = <-done:
			loop = false
		case <-added:
		}
	}
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrOutcomeUnknown) || !errors.As(err, &opErr) || opErr.Retryable() {
		t.Errorf("error %v, want a non-retryable ErrOutcomeUnknown", err)
	}
	if n := srv.Counters().Requests["POST /v2/snapctl"]; n != 1 {
		t.Errorf("restart sent %d times, want 1", n)
	}
}

// A configure hook snapsvc did not identify: the command is found queued
// in the hook's change and reported as such, not as done.
func TestUnidentifiedHookQueueReported(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	srv.SetService("k8s", "kubelet", fake.AppState{Enabled: true})
	hook := srv.StartHook("k8s", "configure")
	defer hook.Finish()
	hc := newSnapctlClient(t, srv, hook.Cookie())
	if hc.Hook() != "" {
		t.Fatalf("hook %q detected", hc.Hook())
	}
	res, err := hc.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{})
	if err != nil || !res.Queued || res.Status == "Done" || res.ChangeID != hook.ChangeID() {
		t.Errorf("result %+v %v, want queued in change %s", res, err, hook.ChangeID())
	}
}

func TestOperationWaitFromSeveralGoroutines(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	c := newClient(t, srv)
	op, err := c.RestartAsync(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := op.Wait(ctxT(t)); err != nil || res.Status != "Done" || res.ChangeID != op.ChangeID() {
				t.Errorf("wait: %+v %v", res, err)
			}
		}()
	}
	wg.Wait()
}

func TestWaitChangeUpdate(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	ctx := ctxT(t)
	base, err := c.WaitChangeUpdate(ctx, time.Time{}, time.Hour)
	if err != nil || !base.IsZero() {
		t.Fatalf("no change yet: %v %v", base, err)
	}
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	base, err = c.WaitChangeUpdate(ctx, time.Time{}, time.Hour)
	if err != nil || base.IsZero() {
		t.Fatalf("baseline: %v %v", base, err)
	}
	woke := make(chan time.Time, 1)
	go func() {
		next, err := c.WaitChangeUpdate(ctx, base, time.Hour) // would hold an hour without a notice
		if err != nil {
			t.Error(err)
		}
		woke <- next
	}()
	srv.WaitFor(ctx, func(v fake.View) bool { return v.InFlight() > 0 }) // the long-poll is held
	foreign.Finish()
	if next := <-woke; !next.After(base) {
		t.Errorf("woke with %v, not after %v", next, base)
	}

	old := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithVersion(fake.Version257))
	if _, err := newClient(t, old).WaitChangeUpdate(ctx, time.Time{}, time.Hour); !errors.Is(err, snapsvc.ErrNoNotices) {
		t.Errorf("snapd 2.57: %v, want ErrNoNotices", err)
	}
}

// A Wait given a context that is already done (the CLI's --no-wait asks
// this way whether an operation is final) fails with the context's error
// and reports no outage: the request it could not make says nothing about
// snapd. Before, it emitted EventUnreachable and the CLI printed "cannot
// reach snapd ... context canceled; retrying until ...".
func TestWaitWithDoneContextReportsNoOutage(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.WithClock(mc), fake.WithSnaps(k8sSnap(time.Minute)))
	var mu sync.Mutex
	var events []snapsvc.Event
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)),
		snapsvc.WithObserver(func(e snapsvc.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }))
	op, err := c.RestartAsync(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if res, err := op.Wait(done); !errors.Is(err, context.Canceled) || res != nil {
		t.Fatalf("Wait(done context) = %+v, %v; want context.Canceled", res, err)
	}
	mu.Lock()
	for _, e := range events {
		if e.Kind == snapsvc.EventUnreachable {
			t.Errorf("outage reported for a request the caller's context ended: %+v", e)
		}
	}
	mu.Unlock()
	// The change still runs; a Wait with a live context gets its outcome.
	if err := srv.AdvanceUntilIdle(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if res, err := op.Wait(ctxT(t)); err != nil || res.Status != "Done" {
		t.Fatalf("Wait = %+v, %v; want Done", res, err)
	}
}
