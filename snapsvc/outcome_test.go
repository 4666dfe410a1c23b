package snapsvc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// MaxAttempts must bound conflicts whose blocker is visible too
// (retry.Policy doc: "only MaxAttempts and MaxElapsedTime bound them").
// A chain of foreign changes keeps the snap busy: with MaxAttempts 2 and no
// elapsed bound the restart must give up after 2 attempts.
func TestMaxAttemptsBoundsVisibleConflicts(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
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
	o := <-done
	cur.Finish()
	t.Fatalf("still retrying after %d rounds with MaxAttempts 2: %d POST /v2/apps sent; err %v", rounds, srv.Counters().Requests["POST /v2/apps"], o.err)
}

// After "taking too long", when snapd will not list changes, a start is
// settled by watching the service reach the state asked for, not sent
// again into its own running change.
func TestTakingTooLongStartSettledByState(t *testing.T) {
	clock := fake.NewManualClock(time.Now())
	snap := k8sSnap(time.Minute)
	snap.Apps[2].Enabled, snap.Apps[2].Active = false, false // kubelet
	srv := fake.NewServer(t, fake.WithSnaps(snap), fake.WithClock(clock), fake.WithSnapctlTimeout(30*time.Second), fake.WithSnapSocketObserveDenied())
	logs := newLogWatch()
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"), snapsvc.WithClock(testclock.Of(clock)), snapsvc.WithLogger(logs.logger()))
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range logs.all() {
				t.Log(l)
			}
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{})
		done <- err
	}()
	t0 := clock.Now()
	testclock.WaitTimerAt(ctxT(t), t, clock, t0.Add(30*time.Second)) // snapctl's "taking too long"
	clock.AdvanceToNext()
	// Fire only short timers (the client's pauses); the start itself ends
	// at t0+1m as time moves on.
	err := testclock.Drive(t, clock, 2*time.Second, done)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	starts := 0
	for _, r := range srv.Requests() {
		if r.Path == "/v2/snapctl" && strings.Contains(r.Body, `"start"`) {
			starts++
		}
	}
	if starts != 1 || srv.Counters().Conflicts != 0 {
		t.Errorf("the start was sent %d times (%d conflicts), want once", starts, srv.Counters().Conflicts)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active {
		t.Error("start reported done while kubelet is inactive")
	}
}

// A daemon's snapctl restart that snapd carried out is not reported as
// Queued (nor given another change's id) when a configure hook that queued
// the same command starts between snapctl's answer and the listing.
func TestDoneRestartNotReportedQueuedIntoLaterHook(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithClock(mc))
	srv.SetLatency(7 * time.Second)
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	type outcome struct {
		res *snapsvc.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- outcome{res, err}
	}()
	ctx := ctxT(t)
	testclock.WaitTimerAt(ctx, t, mc, mc.Now().Add(7*time.Second)) // POST /v2/snapctl held
	mc.AdvanceToNext()
	for { // the listing that follows, held by its latency timer
		added := mc.TimerAdded()
		dl, ok := mc.NextDeadline()
		held := mc.Now().Add(7 * time.Second)
		if srv.Counters().Requests["GET /v2/changes"] > 0 && ok && dl.Equal(held) {
			break // counted on arrival: its timer is what shows it is held
		}
		if ok && dl.Before(held) {
			mc.AdvanceToNext()
			continue
		}
		<-added
	}
	hook := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", Tasks: []fake.TaskSpec{
		{Kind: "run-hook", Summary: `Run configure hook of "k8s" snap`},
		{Kind: "service-control", Summary: `Run service command "restart" for services ["kubelet"] of snap "k8s"`},
	}})
	mc.AdvanceToNext()
	o := <-done
	hook.Finish()
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.res.Queued || o.res.ChangeID == hook.ID() {
		t.Errorf("restart done by snapd (change %q) reported %+v: queued into hook change %s", "1", *o.res, hook.ID())
	}
}
