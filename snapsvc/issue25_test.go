package snapsvc_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Issue 25: one bounded call, one shared observation. One test per defect
// the issue names; each failed on the code before the call value.

// slotTimes records when a budget's slots were given back.
type slotTimes struct {
	mu       sync.Mutex
	released []time.Time
	ch       chan struct{}
}

func newSlotTimes() *slotTimes { return &slotTimes{ch: make(chan struct{}, 16)} }

func (s *slotTimes) progress(ev snapsvc.BudgetEvent) {
	if ev.Kind != snapsvc.BudgetReleased {
		return
	}
	s.mu.Lock()
	s.released = append(s.released, time.Now())
	s.mu.Unlock()
	s.ch <- struct{}{}
}

// Defect 1: a budgeted Restart whose deadline fired while its change ran
// gave its slot back at once (147 ms after the change spawned, 256 ms
// before it was Done): another machine could restart while this one was
// down. The slot is now held until the change is ready (and the services
// with it), in the background, as the async path does; so too when the
// outcome is unknown and snapd makes the change after the call ended.
func TestBudgetSlotHeldWhileChangeRuns(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	for _, tc := range []struct {
		name  string
		wedge bool // snapd holds the request until after the deadline, then acts
	}{{"deadline while the change runs", false}, {"outcome unknown, change made late", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(200*time.Millisecond)))
			b := newMemBudget(1)
			times := newSlotTimes()
			c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Progress: times.progress}))
			var unwedge chan struct{}
			if tc.wedge {
				unwedge = make(chan struct{})
				inj := srv.InjectFault(fake.Fault{Kind: fake.FaultWedge, Method: "POST", Path: "/v2/apps", Hold: unwedge, Times: 1})
				defer inj.Remove()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			returned := time.Now()
			if err == nil {
				t.Fatal("the restart finished within 150 ms; the test needs a longer change")
			}
			if tc.wedge {
				if !errors.Is(err, snapsvc.ErrOutcomeUnknown) {
					t.Fatalf("error %v, want an unknown outcome", err)
				}
				close(unwedge) // snapd gets to the request and makes the change
			}
			if n := b.holding("k8s.kubelet"); n != 1 {
				t.Fatalf("%d slots held right after the call returned (%v), want 1: the change may still run", n, err)
			}
			select {
			case <-times.ch:
			case <-time.After(10 * time.Second):
				t.Fatal("the slot was never given back")
			}
			chgs := srv.Changes()
			var ready time.Time
			for _, chg := range chgs {
				if chg.Kind == "service-control" && !chg.ReadyTime.IsZero() {
					ready = chg.ReadyTime
				}
			}
			if ready.IsZero() {
				t.Fatalf("no service-control change ready: %+v", chgs)
			}
			times.mu.Lock()
			released := times.released[0]
			times.mu.Unlock()
			if released.Before(ready) {
				t.Errorf("slot given back %v before the change was ready (the call returned at %v)", ready.Sub(released), returned)
			}
		})
	}
}

// Defect 4: reads ignored the policy's MaxElapsedTime on a wedged snapd:
// 300 ms asked, never returned without a context deadline.
func TestReadsBoundedByPolicyTime(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	reads := map[string]func(c *snapsvc.Client, id string) error{
		"Services": func(c *snapsvc.Client, _ string) error { _, err := c.Services(context.Background(), "k8s"); return err },
		"Changes": func(c *snapsvc.Client, _ string) error {
			_, err := c.Changes(context.Background(), snapsvc.ChangesOptions{})
			return err
		},
		"Change": func(c *snapsvc.Client, id string) error { _, err := c.Change(context.Background(), id); return err },
		"AbortChange": func(c *snapsvc.Client, id string) error {
			_, err := c.AbortChange(context.Background(), id)
			return err
		},
	}
	for name, read := range reads {
		t.Run(name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
			chg := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
			p := retry.DefaultPolicy()
			p.MaxElapsedTime = 300 * time.Millisecond
			c := newClient(t, srv, snapsvc.WithPolicy(p))
			wedge(t, srv, fake.Fault{})
			start := time.Now()
			err := read(c, chg.ID())
			checkBound(t, name, start, p.MaxElapsedTime)
			if !errors.Is(err, snapsvc.ErrGaveUp) {
				t.Errorf("%s: %v, want ErrGaveUp (the policy's time)", name, err)
			}
			// snapd read the abort: it may carry it out once it gets its
			// lock, so the outcome is unknown; a read's never is.
			if want := name == "AbortChange"; errors.Is(err, snapsvc.ErrOutcomeUnknown) != want {
				t.Errorf("%s: %v, matches ErrOutcomeUnknown: %v, want %v", name, err, !want, want)
			}
		})
	}
}

// A read whose answer was lost is asked again, whatever its method (a
// snapctl listing is a POST): asking twice changes nothing. An abort whose
// answer was lost is not sent again: snapd carried it out.
func TestLostAnswersOfReadsAreAskedAgain(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	srv.InjectFault(fake.Fault{Kind: fake.FaultDrop, Method: "POST", Path: "/v2/snapctl", Times: 1})
	svcs, err := c.Services(ctxT(t), "k8s.kubelet")
	if err != nil || len(svcs) != 1 || !svcs[0].Active {
		t.Fatalf("snapctl services with its first answer lost: %+v %v", svcs, err)
	}
	if n := countRequests(srv, "POST", "/v2/snapctl"); n != 2 {
		t.Errorf("%d snapctl requests, want 2 (the lost one asked again)", n)
	}

	chg := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	rc := newClient(t, srv)
	srv.InjectFault(fake.Fault{Kind: fake.FaultDrop, Method: "POST", Path: "/v2/changes/", Times: 1})
	_, err = rc.AbortChange(ctxT(t), chg.ID())
	if !errors.Is(err, snapsvc.ErrOutcomeUnknown) {
		t.Errorf("abort with its answer lost: %v, want ErrOutcomeUnknown", err)
	}
	if n := countRequests(srv, "POST", "/v2/changes/"+chg.ID()); n != 1 {
		t.Errorf("%d abort requests, want 1 (never sent twice)", n)
	}
}

// Defect 5: in snapctl mode Services failed 1-3 ms into a 500 ms snapd
// restart (one request, no retry), where REST rode it out.
func TestSnapctlServicesRideOutRestart(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	if _, err := c.Services(context.Background(), "k8s.kubelet"); err != nil {
		t.Fatal(err) // a kept-alive connection, as a daemon has
	}
	back := srv.RestartDaemon(500 * time.Millisecond)
	svcs, err := c.Services(ctxT(t), "k8s.kubelet")
	select {
	case <-back:
	default:
		t.Errorf("Services returned before snapd was back: %+v %v", svcs, err)
	}
	if err != nil || len(svcs) != 1 || !svcs[0].Active {
		t.Fatalf("Services across a snapd restart: %+v %v", svcs, err)
	}
}

// Defect 7: a wait gave up up to one poll interval after the give-up time
// it announced (752 ms late with a 1 s poll): its idle was not cut at the
// call's give-up instant.
func TestWaitGivesUpWhenItSaid(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	for _, v := range []fake.Version{fake.Version257, fake.Version277} {
		t.Run(string(v), func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithVersion(v), fake.WithSnaps(k8sSnap(0)))
			chg := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
			p := retry.DefaultPolicy()
			p.MaxUnreachable = 250 * time.Millisecond
			var mu sync.Mutex
			var giveUpAt time.Time
			c := newClient(t, srv, snapsvc.WithPolicy(p), snapsvc.WithPollInterval(time.Second),
				snapsvc.WithObserver(func(ev snapsvc.Event) {
					if ev.Kind == snapsvc.EventUnreachable {
						mu.Lock()
						giveUpAt = ev.GiveUpAt
						mu.Unlock()
					}
				}))
			done := make(chan error, 1)
			go func() { _, err := c.WaitChange(ctxT(t), chg.ID()); done <- err }()
			// Let the wait settle into its idle, then take snapd away.
			if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.RequestsTo("GET /v2/changes/{id}") > 0 }); err != nil {
				t.Fatal(err)
			}
			srv.StopListening()
			err := <-done
			returned := time.Now()
			mu.Lock()
			at := giveUpAt
			mu.Unlock()
			if !errors.Is(err, snapsvc.ErrGaveUp) {
				t.Fatalf("WaitChange: %v, want ErrGaveUp", err)
			}
			if at.IsZero() {
				t.Fatal("no EventUnreachable announced a give-up time")
			}
			if late := returned.Sub(at); late > boundEpsilon {
				t.Errorf("gave up %v after the give-up time it announced (epsilon %v)", late, boundEpsilon)
			}
		})
	}
}

// skewedClock is the real clock off by a fixed offset: a snapd whose
// clock is not the client's.
type skewedClock struct{ off time.Duration }

func (c skewedClock) Now() time.Time { return time.Now().Add(c.off) }
func (c skewedClock) AfterFunc(d time.Duration, f func()) fake.Timer {
	return time.AfterFunc(d, f)
}

// Defect 8: the own-change cursor took the client's clock for snapd's up
// to 10 s apart: with snapd's clock 1 s behind, a restart done in 402 ms,
// after a quicker one, returned a false failure at its 5 s deadline (the
// long-poll after the first read waited for a notice "after" a time snapd
// had not reached). Clock skew never turns a success into a failure, nor
// makes a change wait long.
func TestClockSkewNeverFailsARestart(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	for _, off := range []time.Duration{-time.Second, -300 * time.Millisecond, time.Second} {
		t.Run(off.String(), func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithVersion(fake.Version277), fake.WithClock(skewedClock{off}), fake.WithSnaps(k8sSnap(0)))
			c := newClient(t, srv)
			// A quick restart first: the client learns its pace.
			if _, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
				t.Fatal(err)
			}
			srv.SetDurations("k8s", "kubelet", 200*time.Millisecond, 200*time.Millisecond)
			for i := 0; i < 3; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				start := time.Now()
				res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
				cancel()
				if err != nil {
					t.Fatalf("restart %d with snapd's clock %v off: %v", i, off, err)
				}
				if took := time.Since(start); took > 2*time.Second {
					t.Errorf("restart %d took %v for a 400 ms change (snapd's clock %v off)", i, took, off)
				}
				if res.Status != "Done" {
					t.Errorf("result %+v", res)
				}
			}
		})
	}
}

// With snapd's clock behind the client's, a request whose answer was lost
// is never sent again when snapd acted on it (found by the schedule test
// when it gained clock skew: snapd's change looked older than the
// request, the look-up found none, and the restart ran twice). The client
// learns from its own changes how snapd's clock reads against its own, and
// finds the change in snapd's time. (Before its first own change it takes
// the two to agree, as they do on one machine: a snapd with a clock of its
// own is not what it runs against.)
func TestLostAnswerUnderClockSkewNeverActsTwice(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	for _, off := range []time.Duration{-time.Second, -20 * time.Millisecond, time.Second} {
		t.Run(off.String(), func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithVersion(fake.Version277), fake.WithClock(skewedClock{off}), fake.WithSnaps(k8sSnap(0)))
			c := newClient(t, srv)
			if _, err := c.Restart(ctxT(t), []string{"k8s.containerd"}, snapsvc.RestartOptions{}); err != nil {
				t.Fatal(err)
			}
			before := srv.Counters().Requests["POST /v2/apps"]
			srv.InjectFault(fake.Fault{Kind: fake.FaultGarble, Method: "POST", Path: "/v2/apps", Times: 1})
			res, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			if n := srv.Counters().Requests["POST /v2/apps"] - before; n != 1 {
				t.Fatalf("%d requests to act for one restart (result %+v, error %v): it ran twice", n, res, err)
			}
			if err != nil || res.Status != "Done" {
				t.Errorf("the change should be found and adopted: %+v %v", res, err)
			}
		})
	}
}

// countRequests is how many requests the fake got for method and path.
func countRequests(srv *fake.Server, method, path string) int {
	n := 0
	for _, r := range srv.Requests() {
		if r.Method == method && r.Path == path {
			n++
		}
	}
	return n
}
