package snapsvc_test

// Tests of the lock phase (lock.go): WithMinRestartInterval.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// Issue 18, defect 7: WithMinRestartInterval ignored restarts made by
// another Client of the process without the option. A paced restart
// right after one now waits (here: past its deadline).
func TestRestartPacingCountsEveryClient(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	plain := newClient(t, srv)
	paced := newClient(t, srv, snapsvc.WithMinRestartInterval(time.Hour))
	if _, err := plain.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	res, err := paced.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("paced restart right after another client's: %+v, %v; want it held by the interval", res, err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 {
		t.Fatalf("%d restarts sent, want 1", n)
	}
}

// WithMinRestartInterval spaces restarts of one service by the interval,
// on the client's clock; other services and later restarts are not held.
func TestRestartPacing(t *testing.T) {
	checkLeaks(t)
	mc := fake.NewManualClock(stepT0)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	srv.SetDurations("k8s", "kubelet", 0, 0)
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithMinRestartInterval(10*time.Second))
	ctx := ctxT(t)
	posts := func() []fake.Request {
		var out []fake.Request
		for _, r := range srv.Requests() {
			if r.Method == "POST" && r.Path == "/v2/apps" {
				out = append(out, r)
			}
		}
		return out
	}

	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	mc.Advance(4 * time.Second)
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctx, out, "k8s.kubelet")
	testclock.WaitTimerAt(ctx, t, mc, stepT0.Add(10*time.Second)) // held 6s more
	if n := len(posts()); n != 1 {
		t.Fatalf("%d restarts sent before the interval passed, want 1", n)
	}
	mc.Advance(6 * time.Second)
	if o := recvT(t, out); o.err != nil {
		t.Fatalf("paced restart: %v", o.err)
	}
	ps := posts()
	if len(ps) != 2 {
		t.Fatalf("%d kubelet restarts, want 2", len(ps))
	}
	if gap := ps[1].Time.Sub(ps[0].Time); gap != 10*time.Second {
		t.Errorf("restarts %v apart, want 10s", gap)
	}

	// Another service is not held by kubelet's interval, and ten seconds
	// later kubelet is not held either.
	notPaced(ctx, t, c, mc, "k8s.kube-proxy")
	mc.Advance(10 * time.Second)
	notPaced(ctx, t, c, mc, "k8s.kubelet")

	// A paced restart gives up with its context, without sending anything.
	n := len(posts())
	pctx, pcancel := context.WithCancel(ctx)
	restartAsync(c, pctx, out, "k8s.kubelet")
	testclock.WaitTimerAt(ctx, t, mc, mc.Now().Add(10*time.Second))
	pcancel()
	o := recvT(t, out)
	if !errors.Is(o.err, context.Canceled) || !strings.Contains(o.err.Error(), "minimum restart interval") {
		t.Errorf("cancelled paced restart: %v", o.err)
	}
	if len(posts()) != n {
		t.Error("a cancelled paced restart was sent")
	}

	// A whole-snap restart counts for each of the snap's services.
	mc.Advance(10 * time.Second)
	notPaced(ctx, t, c, mc, "k8s")
	n = len(posts())
	restartAsync(c, ctx, out, "k8s.kubelet")
	testclock.WaitTimerAt(ctx, t, mc, mc.Now().Add(10*time.Second))
	if len(posts()) != n {
		t.Fatal("kubelet restarted right after its snap was restarted")
	}
	mc.Advance(10 * time.Second)
	if o := recvT(t, out); o.err != nil {
		t.Fatalf("paced kubelet restart: %v", o.err)
	}
}

// notPaced restarts name and fails if the restart waits on the clock.
func notPaced(ctx context.Context, t *testing.T, c *snapsvc.Client, mc *fake.ManualClock, name string) {
	t.Helper()
	added := mc.TimerAdded()
	out := make(chan restartOutcome, 1)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	restartAsync(c, pctx, out, name)
	select {
	case o := <-out:
		if o.err != nil {
			t.Fatalf("restart %s: %v", name, o.err)
		}
	case <-added:
		cancel()
		<-out
		t.Fatalf("restart %s waited on the clock", name)
	}
}
