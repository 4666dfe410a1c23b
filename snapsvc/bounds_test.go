package snapsvc_test

// Tests of a call's bounds (call.go): deadline, MaxElapsedTime,
// MaxUnreachable, attempts.

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// boundEpsilon is how far past its bound (its context's deadline, its
// policy's MaxElapsedTime) a call may return: the README's stated epsilon.
const boundEpsilon = 50 * time.Millisecond

// latenessSteps is how many times the machine's timer lateness a call may
// add to its bound: a call cut at its deadline wakes from a timer (the act's
// context), then from another (the look-up's), then returns, and on a busy
// machine each wake comes late by up to the lateness measured meanwhile.
const latenessSteps = 3

// checkBound fails the test when a call that started at start, bounded
// by bound, returned (now) more than boundEpsilon past it, plus
// latenessSteps times how late the machine's timers fired meanwhile (lat,
// started before the call).
func checkBound(t *testing.T, what string, start time.Time, bound time.Duration, lat *testclock.Lateness) {
	t.Helper()
	took := time.Since(start)
	late := lat.Stop()
	if over := took - bound; over > boundEpsilon+latenessSteps*late {
		t.Errorf("%s returned %v after it began, %v past its bound of %v (epsilon %v, and %d times the %v the machine's timers fired late)", what, took.Round(time.Millisecond), over.Round(time.Millisecond), bound, boundEpsilon, latenessSteps, late.Round(time.Millisecond))
	}
}

// wedge makes the fake a wedged snapd for every request matching f (its
// Kind and Hold are set here) until the test ends.
func wedge(t *testing.T, srv *fake.Server, f fake.Fault) {
	t.Helper()
	hold := make(chan struct{})
	f.Kind, f.Hold = fake.FaultWedge, hold
	inj := srv.InjectFault(f)
	t.Cleanup(func() { inj.Remove(); close(hold) })
}

// boundCalls are the calls issue 18 found outliving their deadline.
var boundCalls = []struct {
	name string
	call func(ctx context.Context, c *snapsvc.Client) error
}{
	{"Restart", func(ctx context.Context, c *snapsvc.Client) error {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		return err
	}},
	{"RestartAsync", func(ctx context.Context, c *snapsvc.Client) error {
		_, err := c.RestartAsync(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		return err
	}},
	{"Start --enable", func(ctx context.Context, c *snapsvc.Client) error {
		_, err := c.Start(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{Enable: true})
		return err
	}},
	{"whole-snap Stop", func(ctx context.Context, c *snapsvc.Client) error {
		_, err := c.Stop(ctx, []string{"k8s"}, snapsvc.StopOptions{})
		return err
	}},
}

// Issue 18, defect 1: with a 300 ms deadline against a snapd that accepts
// requests and never answers, calls returned after 2.3 s: after the
// deadline the client looked the change up for 2 s more. A call now
// returns by its deadline; its outcome is unknown and not retryable.
func TestDeadlineAgainstWedgedSnapd(t *testing.T) {
	for _, tc := range boundCalls {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			c := newClient(t, srv)
			wedge(t, srv, fake.Fault{})
			const d = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			lat := testclock.StartLateness()
			start := time.Now()
			err := tc.call(ctx, c)
			checkBound(t, tc.name, start, d, lat)
			var opErr *snapsvc.OpError
			if !errors.As(err, &opErr) || opErr.Retryable() || !errors.Is(err, snapsvc.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("error %v: want the deadline, outcome unknown, not retryable", err)
			}
		})
	}
}

// Issue 18, defect 2: with MaxElapsedTime = MaxUnreachable = 500 ms and
// no context deadline, a restart against a wedged snapd had not returned
// after 4 s: the policy was only checked between attempts. It is now a
// deadline on every request.
func TestPolicyBoundAgainstWedgedSnapd(t *testing.T) {
	policy := retry.DefaultPolicy()
	policy.MaxElapsedTime, policy.MaxUnreachable = 500*time.Millisecond, 500*time.Millisecond
	for _, tc := range boundCalls {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			c := newClient(t, srv, snapsvc.WithPolicy(policy))
			wedge(t, srv, fake.Fault{})
			lat := testclock.StartLateness()
			start := time.Now()
			err := tc.call(context.Background(), c)
			checkBound(t, tc.name, start, policy.MaxElapsedTime, lat)
			var opErr *snapsvc.OpError
			if !errors.As(err, &opErr) || opErr.Retryable() || !errors.Is(err, snapsvc.ErrOutcomeUnknown) || !errors.Is(err, snapsvc.ErrGaveUp) {
				t.Fatalf("error %v: want gave up, outcome unknown, not retryable", err)
			}
		})
	}
	t.Run("wedged while waiting for the change", func(t *testing.T) {
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
		c := newClient(t, srv, snapsvc.WithPolicy(policy))
		wedge(t, srv, fake.Fault{Method: "GET"})
		lat := testclock.StartLateness()
		start := time.Now()
		_, err := c.Restart(context.Background(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		checkBound(t, "Restart", start, policy.MaxElapsedTime, lat)
		var opErr *snapsvc.OpError
		if !errors.As(err, &opErr) || opErr.Retryable() || opErr.ChangeID == "" || !errors.Is(err, snapsvc.ErrGaveUp) {
			t.Fatalf("error %v: want gave up, naming the change, not retryable", err)
		}
	})
}

// inotifyCount counts the process's open inotify instances.
func inotifyCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(l, "inotify") {
			n++
		}
	}
	return n
}

// Issue 18, defect 5: Close concurrent with a client's first call raced
// on the state file's watch (-race), and after 50 such clients 12-21
// inotify instances stayed open. Close is safe with every call: no race,
// and no inotify instance, connection or goroutine is left.
func TestCloseRacingFirstCall(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithStateFile())
	before := inotifyCount(t)
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithStateFile(srv.StateFile()))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		}()
		go func() {
			defer wg.Done()
			c.Close()
		}()
	}
	wg.Wait()
	if after := inotifyCount(t); after != before {
		t.Fatalf("%d inotify instances before 50 clients closed while calling, %d after", before, after)
	}
}

// A Client closing never holds up a call: the kernel takes milliseconds
// (tens under load) to close an inotify instance, and Close did it with
// the watch's lock held, which every call takes to open the watch (a stop
// with a 19 ms bound returned 134.6 ms past it). Here closing the state
// file's watch stalls until the test ends; a call made meanwhile still
// returns within its bound.
func TestCloseNeverHoldsACallOnTheKernel(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithStateFile())
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithStateFile(srv.StateFile()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err) // the state file's watch is open from now on
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	snapsvc.SetWatchCloseHook(t, func() {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	})
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		c.Close()
	}()
	defer func() {
		once.Do(func() { close(release) })
		<-closed
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("Close never closed the state file's watch")
	}
	cctx, cancel := context.WithTimeout(ctx, 19*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Stop(cctx, []string{"k8s.kube-proxy"}, snapsvc.StopOptions{})
		done <- err
	}()
	select {
	case err := <-done:
		t.Logf("the call made while Close stalled returned: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("a call with a 19 ms bound waited for Close's inotify close (5 s and counting)")
	}
	once.Do(func() { close(release) })
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// snapd unreachable: the client backs off (on the injected clock) and
// succeeds once the socket appears.
func TestLateSocketIsRetried(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	clock := &instantClock{}
	clock.onPause = func(n int) {
		if n == 3 {
			if err := srv.StartListening(); err != nil {
				t.Error(err)
			}
		}
	}
	c := newClient(t, srv, snapsvc.WithClock(clock))
	res, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 4 {
		t.Errorf("attempts %d, want 4 (3 refused, then success)", res.Attempts)
	}
}

func TestGivesUpWithinPolicy(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	clock := &instantClock{}
	c := newClient(t, srv, snapsvc.WithPolicy(retry.Policy{MaxAttempts: 3, Clock: clock}))
	_, err := c.Stop(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StopOptions{})
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrGaveUp) || !errors.As(err, &opErr) || opErr.Attempts != 3 || !opErr.Retryable() {
		t.Fatalf("error %v, want a retryable give-up after 3 attempts", err)
	}
	var connErr *snapsvc.ConnectionError
	if !errors.As(err, &connErr) {
		t.Errorf("error does not wrap the connection failure: %v", err)
	}
	if clock.count() != 2 {
		t.Errorf("%d pauses, want 2", clock.count())
	}
}

// When the caller's context ends while snapd is away, the error keeps
// the reason the client was retrying.
func TestContextEndKeepsLastError(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	ctx, cancel := context.WithCancel(context.Background())
	clock := &instantClock{}
	clock.onPause = func(n int) {
		if n == 2 {
			cancel()
		}
	}
	c := newClient(t, srv, snapsvc.WithClock(clock))
	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var connErr *snapsvc.ConnectionError
	var opErr *snapsvc.OpError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &connErr) || !errors.As(err, &opErr) || !opErr.Retryable() {
		t.Fatalf("error %v: want cancelled, wrapping the connection failure, retryable", err)
	}
}

// A Wait given a context that is already done (the CLI's --no-wait asks
// this way whether an operation is final) fails with the context's error
// and reports no outage: the request it could not make says nothing about
// snapd. Before, it emitted EventUnreachable and the CLI printed "cannot
// reach snapd ... context canceled; retrying until ...".
func TestWaitWithDoneContextReportsNoOutage(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(k8sSnap(time.Minute)))
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

// A socket that appears late: the client re-dials quickly (no backoff
// towards seconds), reports the outage once through the observer, and
// succeeds within one re-dial interval of the socket appearing.
func TestLateSocketRedialsAndReports(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	var mu sync.Mutex
	var events []snapsvc.Event
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithObserver(func(e snapsvc.Event) {
		if e.Kind == snapsvc.EventStarted || e.Kind == snapsvc.EventDone || e.Kind == snapsvc.EventFailed {
			return // the operation's lifecycle; this test is about reaching snapd
		}
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{})
		errc <- err
	}()
	start := mc.Now()
	// Ten seconds without a socket, re-dialled every 50 ms on the clock.
	for mc.Now().Sub(start) < 10*time.Second {
		testclock.WaitTimerAt(ctxT(t), t, mc, mc.Now().Add(50*time.Millisecond))
		mc.AdvanceToNext()
	}
	if err := srv.StartListening(); err != nil {
		t.Fatal(err)
	}
	up := mc.Now()
	if err := testclock.Drive(t, mc, time.Minute, errc); err != nil {
		t.Fatal(err)
	}
	var post fake.Request
	for _, r := range srv.Requests() {
		if r.Method == "POST" {
			post = r
		}
	}
	if d := post.Time.Sub(up); d > 50*time.Millisecond {
		t.Errorf("accepted %v after the socket appeared, want within one re-dial interval", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) < 3 || events[0].Kind != snapsvc.EventUnreachable || events[0].Socket != srv.SocketPath() ||
		!events[0].GiveUpAt.Equal(start.Add(30*time.Second)) || events[1].Kind != snapsvc.EventReachable {
		t.Fatalf("events %+v: want unreachable (socket, give-up time) once, then reachable", events)
	}
}

// A socket that never appears: the operation gives up after
// MaxUnreachable, far below the conflict budget, with a retryable error
// that names the socket.
func TestAbsentSocketBoundedByMaxUnreachable(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)))
	errc := make(chan error, 1)
	start := mc.Now()
	go func() {
		_, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		errc <- err
	}()
	err := testclock.Drive(t, mc, time.Minute, errc)
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrGaveUp) || !errors.As(err, &opErr) || !opErr.Retryable() ||
		!strings.Contains(err.Error(), srv.SocketPath()) || !strings.Contains(err.Error(), "unreachable for 30s") {
		t.Fatalf("error %v", err)
	}
	if d := mc.Now().Sub(start); d > 31*time.Second {
		t.Fatalf("gave up after %v", d)
	}

}

// A context that ends before anything was done (here, while the call waits
// for the snap's lock) leaves a retryable error: nothing ran.
func TestInterruptedBeforeActingIsRetryable(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	hold := make(chan struct{})
	seen := make(chan struct{}, 1)
	srv.InjectFault(fake.Fault{Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold, Match: arrived(seen, nil)})
	first := make(chan error, 1)
	go func() {
		_, err := c.Restart(context.Background(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		first <- err
	}()
	recvT(t, seen) // the first call holds the snap's lock, its answer pending
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{})
	var opErr *snapsvc.OpError
	if !errors.As(err, &opErr) || !opErr.Retryable() || !errors.Is(err, context.Canceled) || opErr.ChangeID != "" {
		t.Fatalf("error %v: want cancelled, retryable, no change", err)
	}
	close(hold)
	if err := recvT(t, first); err != nil {
		t.Fatal(err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 {
		t.Fatalf("%d POSTs: the cancelled call acted", n)
	}
}

// Issue 18, defect 8: New accepted a NaN in the policy, which made the
// backoff a busy loop (775 requests in 500 ms); it now fails.
func TestNewRejectsInvalidPolicy(t *testing.T) {
	p := retry.DefaultPolicy()
	p.Multiplier = math.NaN()
	if c, err := snapsvc.New(snapsvc.WithPolicy(p)); err == nil {
		c.Close()
		t.Fatal("New accepted a NaN Multiplier")
	}
}

// Issue 27: inside a caller's own retry loop the nested policy's time
// (25 s) cut the wait for the operation's own change too, so a service
// that took longer than that to start failed, where the snap command the
// loop used to run waited for its change. Policy.ChangeWait bounds that
// wait on its own: 0 keeps it under MaxElapsedTime, negative leaves it to
// the context, positive bounds it from snapd's answer.
func TestChangeWaitBoundsTheOwnChange(t *testing.T) {
	for _, tc := range []struct {
		name       string
		changeWait time.Duration
		ok         bool
	}{
		{"with the call (0)", 0, false},
		{"the context's (-1)", -1, true},
		{"its own, longer (2s)", 2 * time.Second, true},
		{"its own, shorter (100ms)", 100 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			srv.SetDurations("k8s", "kubelet", 250*time.Millisecond, 250*time.Millisecond)
			p := retry.DefaultPolicy()
			p.MaxElapsedTime = 200 * time.Millisecond
			p.ChangeWait = tc.changeWait
			c := newClient(t, srv, snapsvc.WithPolicy(p))
			res, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			if tc.ok {
				if err != nil || res.Status != "Done" {
					t.Fatalf("a 500 ms restart with ChangeWait %v: %+v %v", tc.changeWait, res, err)
				}
				return
			}
			var oe *snapsvc.OpError
			if !errors.As(err, &oe) || oe.ChangeID == "" || oe.Retryable() {
				t.Fatalf("a 500 ms restart with ChangeWait %v: %v, want an error naming its change, not retryable", tc.changeWait, err)
			}
		})
	}
	if retry.NestedPolicy().ChangeWait >= 0 {
		t.Error("the nested policy bounds the own change's wait by the loop's time")
	}
}
