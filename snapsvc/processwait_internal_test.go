package snapsvc

// Tests of shared waits (processwait.go): callers share facts, never bounds.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// Issue 25, defect 3: a shared wait ran on its first caller's policy: a
// waiter with a 30 s MaxUnreachable got ErrGaveUp 410 ms into a 1 s snapd
// restart, and a waiter with a 200 ms MaxUnreachable was held 2.14 s. The
// callers of a shared wait share its observations, and each gives up on
// its own bounds: the impatient one when its own give-up time comes, the
// patient one never, whoever came first.
func TestSharedWaitCallersKeepTheirOwnBounds(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	for _, impatientFirst := range []bool{false, true} {
		name := map[bool]string{false: "patient first", true: "impatient first"}[impatientFirst]
		t.Run(name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(fake.Version277), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Active: true, Enabled: true}}}))
			blk := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: "k8s"})
			var mu sync.Mutex
			var giveUpAt time.Time
			client := func(maxUnreachable time.Duration, observe bool) *Client {
				p := retry.DefaultPolicy()
				p.MaxUnreachable = maxUnreachable
				opts := []Option{WithSocket(srv.SocketPath()), WithMode(ModeREST), WithPolicy(p), WithoutFileLock()}
				if observe {
					opts = append(opts, WithObserver(func(ev Event) {
						if ev.Kind == EventUnreachable {
							mu.Lock()
							giveUpAt = ev.GiveUpAt
							mu.Unlock()
						}
					}))
				}
				c, err := New(opts...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			patient, impatient := client(30*time.Second, false), client(200*time.Millisecond, true)
			key := patient.waitKey("change " + blk.ID())
			if key != impatient.waitKey("change "+blk.ID()) {
				t.Fatal("the two clients would not share the wait")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			type outcome struct {
				chg *Change
				err error
				at  time.Time
			}
			patientDone, impatientDone := make(chan outcome, 1), make(chan outcome, 1)
			wait := func(c *Client, done chan outcome) {
				chg, err := c.WaitChange(ctx, blk.ID())
				done <- outcome{chg, err, time.Now()}
			}
			first, second := func() { go wait(patient, patientDone) }, func() { go wait(impatient, impatientDone) }
			if impatientFirst {
				first, second = second, first
			}
			first()
			if err := processWaits.awaitSubscribers(ctx, key, 1); err != nil {
				t.Fatal(err)
			}
			second()
			if err := processWaits.awaitSubscribers(ctx, key, 2); err != nil {
				t.Fatal(err)
			}
			lat := testclock.StartLateness()
			down := time.Now()
			back := srv.RestartDaemon(time.Second)
			o := <-impatientDone
			mu.Lock()
			at := giveUpAt
			mu.Unlock()
			if !errors.Is(o.err, ErrGaveUp) {
				t.Fatalf("the impatient waiter: %v, want ErrGaveUp", o.err)
			}
			// Its own 200 ms, counted from the first request that could not
			// reach snapd: the long-poll under way when snapd went is cut
			// within the fake's 200 ms shutdown grace.
			late := lat.Stop()
			if at.IsZero() || at.Sub(down) > 450*time.Millisecond+late {
				t.Errorf("the impatient waiter announced its give-up for %v after snapd went (want its own 200 ms after the first failed request)", at.Sub(down))
			}
			if off := o.at.Sub(at); off > 50*time.Millisecond+late || off < -50*time.Millisecond {
				t.Errorf("the impatient waiter gave up %v after the time it announced (timers fired up to %v late)", off, late)
			}
			select {
			case p := <-patientDone:
				t.Fatalf("the patient waiter returned while snapd was away: %+v %v", p.chg, p.err)
			default:
			}
			<-back
			blk.Finish()
			p := <-patientDone
			if p.err != nil || p.chg == nil || p.chg.Status != "Done" {
				t.Fatalf("the patient waiter: %+v %v, want the change Done", p.chg, p.err)
			}
		})
	}
}

// Issue 25, defect 6: a caller joining a shared WaitIdle got nil 2 ms
// after calling while a change spawned before its call was still Doing: it
// took an answer read before it joined. A caller accepts only what was
// read after it joined.
func TestSharedWaitIdleJoinerTakesOnlyFreshFacts(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(fake.Version277), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
	c, err := New(WithSocket(srv.SocketPath()), WithMode(ModeREST), WithoutFileLock())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := c.waitKey("idle k8s")
	// The first caller's listing is made (the snap idle) and its answer
	// held on the way.
	hold := make(chan struct{})
	inj := srv.InjectFault(fake.Fault{Method: "GET", Path: "/v2/changes", Hold: hold, Times: 1})
	defer inj.Remove()
	firstDone, joinerDone := make(chan error, 1), make(chan error, 1)
	go func() { firstDone <- c.WaitIdle(ctx, "k8s") }()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Handled("GET /v2/changes") == 1 }); err != nil {
		t.Fatal(err)
	}
	// A change spawns, then a second caller joins.
	x := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: "k8s"})
	go func() { joinerDone <- c.WaitIdle(ctx, "k8s") }()
	if err := processWaits.awaitSubscribers(ctx, key, 2); err != nil {
		t.Fatal(err)
	}
	close(hold) // the first caller's answer arrives: idle, as of before the change
	if err := <-firstDone; err != nil {
		t.Fatalf("the first caller: %v", err)
	}
	// The joiner needs a listing of its own: it sees the change.
	listed := make(chan error, 1)
	go func() {
		listed <- srv.WaitFor(ctx, func(v fake.View) bool { return v.Handled("GET /v2/changes") >= 2 })
	}()
	select {
	case err := <-joinerDone:
		t.Fatalf("the joiner returned %v while change %s, spawned before its call, is in progress", err, x.ID())
	case err := <-listed:
		if err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-joinerDone:
		t.Fatalf("the joiner returned %v while change %s, spawned before its call, is in progress", err, x.ID())
	default:
	}
	x.Finish()
	if err := <-joinerDone; err != nil {
		t.Fatalf("the joiner: %v", err)
	}
}

// K callers of one process waiting for one change, or for one snap to be
// idle, share one wait: snapd sees the requests of one waiter, however
// many there are. A caller that leaves early gets its context's error;
// the others still get the outcome.
func TestSharedWaits(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	const k = 10
	for _, tc := range []struct {
		v    fake.Version
		idle bool
	}{{fake.Version277, false}, {fake.Version277, true}, {fake.Version257, false}, {fake.Version257, true}} {
		name := string(tc.v) + map[bool]string{true: "/idle", false: "/change"}[tc.idle]
		t.Run(name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(tc.v), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
			clients := make([]*Client, 2) // two Clients of one process share too
			for i := range clients {
				c, err := New(WithSocket(srv.SocketPath()), WithMode(ModeREST), WithPollInterval(20*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				clients[i] = c
			}
			blk := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: "k8s"})
			key := clients[0].waitKey("change " + blk.ID())
			if tc.idle {
				key = clients[0].waitKey("idle k8s")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			early, leave := context.WithCancel(ctx)
			errs := make([]error, k+1)
			var wg sync.WaitGroup
			for i := range k + 1 {
				c, cctx := clients[i%2], ctx
				if i == k {
					cctx = early
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if tc.idle {
						errs[i] = c.WaitIdle(cctx, "k8s")
						return
					}
					var chg *Change
					chg, errs[i] = c.WaitChange(cctx, blk.ID())
					if errs[i] == nil && chg.Status != "Done" {
						t.Errorf("waiter %d: change %+v", i, chg)
					}
				}()
			}
			if err := processWaits.awaitSubscribers(ctx, key, k+1); err != nil {
				t.Fatal(err)
			}
			leave()
			if err := processWaits.awaitSubscribers(ctx, key, k); err != nil {
				t.Fatal(err)
			}
			blk.Finish()
			wg.Wait()
			for i, err := range errs[:k] {
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
			}
			if errs[k] == nil || early.Err() == nil {
				t.Errorf("the caller that left: %v", errs[k])
			}
			reads := 0
			for _, r := range srv.Requests() {
				if r.Method == "GET" {
					reads++
				}
			}
			// One waiter's reads: with notices a first read, a long-poll,
			// the change (+ a listing for WaitIdle, and one to see the snap
			// idle); without, the listing and the polls of one waiter.
			if limit := map[fake.Version]int{fake.Version277: 6, fake.Version257: 8}[tc.v]; reads > limit {
				t.Errorf("%d callers made %d reads, want at most %d (one waiter's)", k, reads, limit)
			}
			t.Logf("%d callers: %d reads", k, reads)
		})
	}
}
