package snapsvc_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
	"go.uber.org/goleak"
)

// budgetEvents records a budget's events and lets a test wait for one.
type budgetEvents struct {
	mu  sync.Mutex
	evs []snapsvc.BudgetEvent
	ch  chan snapsvc.BudgetEvent
}

func newBudgetEvents() *budgetEvents {
	return &budgetEvents{ch: make(chan snapsvc.BudgetEvent, 100)}
}

func (r *budgetEvents) record(ev snapsvc.BudgetEvent) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
	r.ch <- ev
}

// kinds returns the kinds seen so far, in order.
func (r *budgetEvents) kinds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ev := range r.evs {
		out = append(out, ev.Kind)
	}
	return out
}

// all returns the events of kind seen so far, in order.
func (r *budgetEvents) all(kind string) []snapsvc.BudgetEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []snapsvc.BudgetEvent
	for _, ev := range r.evs {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// count returns how many events of kind were seen.
func (r *budgetEvents) count(kind string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.evs {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// waitFor returns the next event of kind (skipping others), or fails the
// test once ctx ends.
func (r *budgetEvents) waitFor(ctx context.Context, t *testing.T, kind string) snapsvc.BudgetEvent {
	t.Helper()
	for {
		select {
		case ev := <-r.ch:
			if ev.Kind == kind {
				return ev
			}
		case <-ctx.Done():
			t.Fatalf("no %q event; saw %q", kind, r.kinds())
		}
	}
}

// The fence runs after the slot is taken and before the request, and a
// successful one is reported.
func TestBudgetFenceBeforeRequest(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	changesAtFence := -1
	b.fence = func(context.Context, *memSlot) error {
		changesAtFence = len(srv.Changes())
		return nil
	}
	evs := newBudgetEvents()
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Progress: evs.record}))
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"acquire k8s.kubelet", "fence k8s.kubelet", "release k8s.kubelet"}; !slices.Equal(b.steps(), want) {
		t.Fatalf("steps %q, want %q", b.steps(), want)
	}
	if changesAtFence != 0 || len(srv.Changes()) != 1 {
		t.Fatalf("fence saw %d changes (want 0, before the request); after: %d (want 1)", changesAtFence, len(srv.Changes()))
	}
	if want := []string{"acquired", "fenced", "ready", "released"}; !slices.Equal(evs.kinds(), want) {
		t.Fatalf("events %q, want %q", evs.kinds(), want)
	}
}

// Issue 26: the fence's confirmation is checked at the moment of acting:
// the request is written only while it stands (the connection itself
// refuses a write past it), and a confirmation that ran out before the
// write is fenced again; snapd never sees a request sent on it.
func TestBudgetFenceValidityCheckedAtWrite(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	fences := 0
	b.fence = func(context.Context, *memSlot) error { return nil }
	b.valid = func() budget.Validity {
		fences++
		if fences == 1 {
			return budget.ValidFor(time.Nanosecond) // runs out before the write
		}
		return budget.ValidFor(time.Hour)
	}
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"acquire k8s.kubelet", "fence k8s.kubelet", "fence k8s.kubelet", "release k8s.kubelet"}; !slices.Equal(b.steps(), want) {
		t.Fatalf("steps %q, want %q", b.steps(), want)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 || res.Status != "Done" {
		t.Fatalf("snapd received %d requests to act (want 1: the one sent on the second fence); result %+v", n, res)
	}
}

// A budget whose confirmations always run out before the request can be
// written makes the operation give up, retryable and with nothing sent,
// after a few fences, not spin (with a huge confirmation that overflowed,
// the restart of issue 33's defect 1 made 700,000 attempts in a minute).
func TestBudgetConfirmationsTooShortDoNotSpin(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.fence = func(context.Context, *memSlot) error { return nil }
	b.valid = func() budget.Validity { return budget.ValidFor(time.Nanosecond) }
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var oe *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrBudgetUnavailable) || !errors.As(err, &oe) || !oe.Retryable() {
		t.Fatalf("restart on confirmations that always run out: %v; want a retryable ErrBudgetUnavailable", err)
	}
	if fences := strings.Count(strings.Join(b.steps(), "\n"), "fence "); fences != 3 {
		t.Errorf("%d fences, want 3", fences)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 0 {
		t.Errorf("snapd received %d requests to act, want 0", n)
	}
}

// A slot no coordination service can take away (granted without a
// cluster, or on fail-open) confirms with no end, and its restart is sent
// like any other (issue 33, defect 1: its confirmation was a huge duration
// whose send-by overflowed, and every write was refused).
func TestBudgetUnboundedConfirmationSends(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.fence = func(context.Context, *memSlot) error { return nil }
	b.valid = budget.Unbounded
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 || res.Status != "Done" || res.ChangeID == "" {
		t.Fatalf("snapd received %d requests to act (want 1); result %+v", n, res)
	}
}

// gatedProbe returns a readiness probe whose nth check (from 0) says its
// number on entered and passes once gates[n] is closed (the last gate for
// every check past it).
func gatedProbe(n int) (ready probe.Probe, entered chan int, gates []chan struct{}) {
	entered = make(chan int, n)
	for range n {
		gates = append(gates, make(chan struct{}))
	}
	var mu sync.Mutex
	calls := 0
	ready = probe.Func("test", func(ctx context.Context) error {
		mu.Lock()
		i := calls
		calls++
		mu.Unlock()
		entered <- i
		select {
		case <-gates[min(i, n-1)]:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	return ready, entered, gates
}

// Issue 26: MarkReady says the services a holder disrupted are ready
// again. Two operations of one Client that share a slot mark it ready only
// once both are: the first one's readiness says nothing of the second's
// act, which may still be under way.
func TestBudgetMarkReadyOnceEveryUserIsReady(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.readier = true
	ready, entered, gates := gatedProbe(2)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Ready: func(string) probe.Probe { return ready }}))
	errs := make(chan error, 2)
	restart := func(opts snapsvc.RestartOptions) {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, opts)
		errs <- err
	}
	go restart(snapsvc.RestartOptions{})
	if n := recvT(t, entered); n != 0 {
		t.Fatalf("probe %d first", n)
	}
	// The first restart waits for its services; a second joins its slot,
	// acts, and waits for its own.
	go restart(snapsvc.RestartOptions{Reload: true})
	if n := recvT(t, entered); n != 1 {
		t.Fatalf("probe %d second", n)
	}
	close(gates[0])
	if err := recvT(t, errs); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(b.steps(), "ready k8s.kubelet") {
		t.Fatalf("the slot was marked ready while the second restart's services were not: steps %q", b.steps())
	}
	close(gates[1])
	if err := recvT(t, errs); err != nil {
		t.Fatal(err)
	}
	if want := []string{"acquire k8s.kubelet", "fence k8s.kubelet", "fence k8s.kubelet", "ready k8s.kubelet", "release k8s.kubelet"}; !slices.Equal(b.steps(), want) {
		t.Fatalf("steps %q, want %q", b.steps(), want)
	}
}

// A hold's readiness counts once toward a shared slot's, whichever path
// checks it: an operation whose time ends while it settles keeps its slot
// in the background and checks its services again there, and that second
// check must not count as another user's readiness (the slot would be
// marked ready while the other operation's services are not).
func TestBudgetReadyCountsOncePerHold(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	mc := fake.NewManualClock(stepT0)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	srv.SetDurations("k8s", "kubelet", 0, 0)
	b := newMemBudget(1)
	b.readier = true
	ready, entered, gates := gatedProbe(3)
	evs := newBudgetEvents()
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Ready:    func(string) probe.Probe { return ready },
		Settle:   7 * time.Second,
		Progress: evs.record,
	}))
	actx, cancelA := context.WithCancel(ctx)
	defer cancelA()
	errA, errB := make(chan error, 1), make(chan error, 1)
	go func() { _, err := c.Restart(actx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); errA <- err }()
	if n := recvT(t, entered); n != 0 {
		t.Fatalf("probe %d first", n)
	}
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{Reload: true})
		errB <- err
	}()
	if n := recvT(t, entered); n != 1 {
		t.Fatalf("probe %d second", n)
	}
	close(gates[0]) // A is ready (1 of 2) and settles...
	evs.waitFor(ctx, t, "ready")
	cancelA() // ...until its context ends
	if err := recvT(t, errA); err == nil {
		t.Fatal("the restart whose context ended while settling returned nil")
	}
	// A's hold, in the background, checks its services again; then B's
	// services are ready.
	if n := recvT(t, entered); n != 2 {
		t.Fatalf("probe %d third", n)
	}
	close(gates[2])
	close(gates[1])
	if err := testclock.Drive(t, mc, 7*time.Second, errB); err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }() // waits for A's hold in the background
	testclock.Drive(t, mc, 7*time.Second, closed)
	// Two users, two readinesses: one MarkReady, once both were ready.
	if n := evs.count("ready"); n != 2 {
		t.Errorf("%d ready events, want 2 (one per restart)", n)
	}
	if want := []string{"acquire k8s.kubelet", "fence k8s.kubelet", "fence k8s.kubelet", "ready k8s.kubelet", "release k8s.kubelet"}; !slices.Equal(b.steps(), want) {
		t.Fatalf("steps %q, want %q", b.steps(), want)
	}
}

// Issue 19 defect 3: a slot found lost right before acting stops the
// request (nothing is sent), is reported once ("lost"), not retryable,
// and the slot is given back. Both ways of finding out: the fence says so,
// or the slot already knows (Lost) and has no fence.
func TestBudgetLostSlotStopsRequest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		action string
		fence  bool
	}{
		{"restart/fence", "restart", true},
		{"stop/fence", "stop", true},
		{"restart/lost", "restart", false},
		{"stop/lost", "stop", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkLeaks(t)
			ctx := ctxT(t)
			srv := budgetServer(t)
			b := newMemBudget(1)
			if tc.fence {
				b.fence = func(context.Context, *memSlot) error {
					return fmt.Errorf("%w: lease 7587 expired, key now held by node-2", snapsvc.ErrSlotLost)
				}
			} else {
				b.acquired = func(s *memSlot) { s.lose() } // paused past its lease right after Acquire
			}
			evs := newBudgetEvents()
			c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{StopsAndStarts: true, Progress: evs.record}))
			var err error
			if tc.action == "restart" {
				_, err = c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			} else {
				_, err = c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{})
			}
			var opErr *snapsvc.OpError
			var be *snapsvc.BudgetError
			if !errors.Is(err, snapsvc.ErrSlotLost) || !errors.As(err, &opErr) || !errors.As(err, &be) || opErr.Retryable() {
				t.Fatalf("want a non-retryable BudgetError wrapping ErrSlotLost, got %v", err)
			}
			if be.Key != "k8s.kubelet" {
				t.Fatalf("error names key %q", be.Key)
			}
			if chg := srv.Changes(); len(chg) != 0 {
				t.Fatalf("acted on a lost slot: %d changes (%s %s)", len(chg), chg[0].Kind, chg[0].Summary)
			}
			if n := evs.count("lost"); n != 1 {
				t.Fatalf("%d lost events, want 1 (%q)", n, evs.kinds())
			}
			if n := b.holding("k8s.kubelet"); n != 0 {
				t.Fatalf("lost slot not given back (held %d)", n)
			}
		})
	}
}

// A fence that cannot tell (etcd unreachable) stops the request too, but
// a later attempt may succeed: retryable, nothing sent.
func TestBudgetFenceUnavailable(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.fence = func(context.Context, *memSlot) error {
		return fmt.Errorf("%w: linearizable read: context deadline exceeded", snapsvc.ErrBudgetUnavailable)
	}
	evs := newBudgetEvents()
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Progress: evs.record}))
	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrBudgetUnavailable) || !errors.As(err, &opErr) || !opErr.Retryable() {
		t.Fatalf("want a retryable ErrBudgetUnavailable, got %v", err)
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("acted without confirming the slot: %d changes", n)
	}
	if evs.count("fence-failed") != 1 || evs.count("lost") != 0 {
		t.Fatalf("events %q, want one fence-failed and no lost", evs.kinds())
	}
	if b.holding("k8s.kubelet") != 0 {
		t.Fatal("slot not given back")
	}
}

// ErrBudgetRefused (a permanent refusal) is never retryable, even when an
// implementation also wraps ErrBudgetUnavailable; a lost slot neither.
func TestBudgetErrorRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{snapsvc.ErrBudgetUnavailable, true},
		{snapsvc.ErrBudgetWait, true},
		{fmt.Errorf("%w: request is too large", snapsvc.ErrBudgetRefused), false},
		{errors.Join(snapsvc.ErrBudgetRefused, snapsvc.ErrBudgetUnavailable), false},
		{errors.Join(snapsvc.ErrSlotLost, snapsvc.ErrBudgetUnavailable), false},
		{snapsvc.ErrSlotLost, false},
		{context.Canceled, false},
	} {
		be := &snapsvc.BudgetError{Key: "k8s.kubelet", Err: tc.err}
		if got := be.Retryable(); got != tc.want {
			t.Errorf("Retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestBudgetRefusedNotRetryable(t *testing.T) {
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.fail = fmt.Errorf("%w: etcdserver: permission denied", snapsvc.ErrBudgetRefused)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrBudgetRefused) || !errors.As(err, &opErr) || opErr.Retryable() {
		t.Fatalf("want a non-retryable ErrBudgetRefused, got %v", err)
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("restarted without a slot: %d changes", n)
	}
}

// releaseEpsilon is how late, past its context's deadline, a call whose
// slot's release hangs may return on a loaded 2-core machine under -race.
const releaseEpsilon = 150 * time.Millisecond

// Issue 18 defect 3: a release that hangs (a lease revoke while etcd is
// unreachable) must not hold the call past its deadline; the slot is
// still given back, in the background.
func TestBudgetSlowReleaseDoesNotDelayReturn(t *testing.T) {
	checkLeaks(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	unblock := make(chan struct{})
	b.release = func(ctx context.Context, _ *memSlot, _ int) error {
		select {
		case <-unblock:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	evs := newBudgetEvents()
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Progress: evs.record}))
	const deadline = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * deadline): // a guard, not a synchronisation
		close(unblock)
		<-done
		t.Fatalf("Restart with a %s deadline had not returned after %s: the release holds it", deadline, 10*deadline)
	}
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the restart was done; a slow release must not fail it: %v", err)
	}
	if took > deadline+releaseEpsilon {
		t.Fatalf("returned %s after the start, past its %s deadline + %s", took, deadline, releaseEpsilon)
	}
	t.Logf("returned %s past its deadline while the release hung", (took - deadline).Round(time.Microsecond))
	if n := len(srv.Changes()); n != 1 {
		t.Fatalf("%d changes, want 1", n)
	}
	close(unblock)
	wctx := ctxT(t)
	ev := evs.waitFor(wctx, t, "released")
	if ev.Key != "k8s.kubelet" || b.holding("k8s.kubelet") != 0 {
		t.Fatalf("slot not given back in the background: %+v, held %d", ev, b.holding("k8s.kubelet"))
	}
}

// A release that fails is reported (event and log) and tried again in the
// background until it succeeds.
func TestBudgetFailedReleaseRetried(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.release = func(_ context.Context, _ *memSlot, attempt int) error {
		if attempt < 3 {
			return fmt.Errorf("%w: lease revoke: etcdserver: request timed out", snapsvc.ErrBudgetUnavailable)
		}
		return nil
	}
	evs := newBudgetEvents()
	logs := newLogWatch()
	clock := &instantClock{}
	c := newClient(t, srv, snapsvc.WithClock(clock), snapsvc.WithLogger(logs.logger()),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Progress: evs.record}))
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := evs.waitFor(ctx, t, "released")
	if ev.Attempt != 3 || evs.count("release-failed") != 2 || b.holding("k8s.kubelet") != 0 {
		t.Fatalf("released at attempt %d after %d failures (want 3, 2), held %d; events %q", ev.Attempt, evs.count("release-failed"), b.holding("k8s.kubelet"), evs.kinds())
	}
	var warned int
	for _, l := range logs.all() {
		if strings.Contains(l, "restart budget slot not given back; trying again") && strings.Contains(l, "key=k8s.kubelet") {
			warned++
		}
	}
	if warned != 2 {
		t.Fatalf("%d warnings for the failed releases, want 2: %q", warned, logs.all())
	}
}

// A release that never succeeds is given up after a bounded number of
// attempts, reported at Error.
func TestBudgetReleaseGivenUp(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.release = func(context.Context, *memSlot, int) error {
		return fmt.Errorf("%w: lease revoke: no leader", snapsvc.ErrBudgetUnavailable)
	}
	evs := newBudgetEvents()
	logs := newLogWatch()
	gaveUp := logs.seen("it is freed when the budget expires it")
	c := newClient(t, srv, snapsvc.WithClock(&instantClock{}), snapsvc.WithLogger(logs.logger()),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Progress: evs.record}))
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gaveUp:
	case <-ctx.Done():
		t.Fatalf("never gave up: %q", evs.kinds())
	}
	if n := evs.count("release-failed"); n != 5 || evs.count("released") != 0 {
		t.Fatalf("%d release-failed events, want 5: %q", n, evs.kinds())
	}
	for i, ev := range evs.all("release-failed") {
		if ev.Final != (i == 4) {
			t.Errorf("release-failed event %d: Final %v, want %v (only the last attempt is final)", i+1, ev.Final, i == 4)
		}
	}
}

// Close ending the retries of a release says so: the last event is a
// final "release-failed" (a metric of held slots must not count the slot
// for ever).
func TestBudgetReleaseRetriesEndedByClose(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.release = func(context.Context, *memSlot, int) error {
		return fmt.Errorf("%w: lease revoke: no leader", snapsvc.ErrBudgetUnavailable)
	}
	evs := newBudgetEvents()
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{ReleaseTimeout: 50 * time.Millisecond, Progress: evs.record}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	evs.waitFor(ctx, t, "release-failed") // the first attempt; the next waits a second
	c.Close()
	for {
		ev := evs.waitFor(ctx, t, "release-failed")
		if ev.Final {
			if ev.Attempt >= 5 || ev.Err == nil {
				t.Fatalf("final release-failed event %+v: want one Close ended before the fifth attempt, with why", ev)
			}
			break
		}
	}
	if n := evs.count("release-failed"); !evs.all("release-failed")[n-1].Final {
		t.Fatalf("the last release-failed event is not final: %+v", evs.all("release-failed"))
	}
}

// Issue 18 defect 4: Close while a budgeted Stop is under way must not
// leak the slot the Stop would keep; its service is down, so it is
// abandoned (freed behind the lock-delay), never released (issue 41).
func TestBudgetCloseDuringStopAbandons(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	var c *snapsvc.Client
	closed := make(chan struct{})
	c = newClient(t, srv,
		snapsvc.WithObserver(func(ev snapsvc.Event) {
			if ev.Kind == snapsvc.EventAccepted && ev.Op == "stop" {
				c.Close() // the stop's change runs; its slot is held
				close(closed)
			}
		}),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{StopsAndStarts: true}))
	if _, err := c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	recvT(t, closed)
	if n := b.heldTotal(); n != 0 {
		t.Fatalf("Close during a budgeted Stop leaked the slot (held %d); steps %q", n, b.steps())
	}
	c.Close() // a second Close is harmless
	if want := []string{"acquire k8s.kubelet", "abandon k8s.kubelet"}; !slices.Equal(b.steps(), want) {
		t.Fatalf("steps %q, want %q", b.steps(), want)
	}
}

// Every Close waits for the releases under way, one begun after an earlier
// Close included: a restart that raced a first Close gives its slot back
// as it ends, and a second Close waited for nothing (the schedule test
// found the slot still held after every client was closed).
func TestBudgetSecondCloseWaitsForLateRelease(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.release = func(ctx context.Context, _ *memSlot, _ int) error {
		t := time.NewTimer(200 * time.Millisecond) // the release's own duration, as a lease revoke's
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	var c *snapsvc.Client
	c = newClient(t, srv,
		snapsvc.WithObserver(func(ev snapsvc.Event) {
			if ev.Kind == snapsvc.EventAccepted && ev.Op == "restart" {
				c.Close() // the restart's change runs; its slot is held
			}
		}),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	// The call's deadline comes before its release's end: it returns
	// while the release goes on in the background.
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.Restart(rctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if n := b.holding("k8s.kubelet"); n != 0 {
		t.Fatalf("%d slots still held once the second Close returned; steps %q", n, b.steps())
	}
}

// Close while an operation waits for a slot ends the wait at once: the
// operation fails (not retryable on this Client), takes nothing, acts on
// nothing.
func TestBudgetCloseEndsWaitForSlot(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.blocked = make(chan struct{}) // never frees
	waiting := make(chan struct{}, 1)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		StopsAndStarts: true,
		Progress: func(ev snapsvc.BudgetEvent) {
			if ev.Kind == "waiting" {
				waiting <- struct{}{}
			}
		},
	}))
	done := make(chan error, 1)
	go func() {
		_, err := c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{})
		done <- err
	}()
	recvT(t, waiting)
	c.Close()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second): // a guard, not a synchronisation
		close(b.blocked)
		<-done
		t.Fatal("Stop still waited for a slot 10s after Close")
	}
	var opErr *snapsvc.OpError
	if !errors.As(err, &opErr) || opErr.Retryable() {
		t.Fatalf("want a non-retryable OpError, got %v", err)
	}
	if !slices.Contains(b.steps(), "cancelled k8s.kubelet") || len(srv.Changes()) != 0 || b.holding("k8s.kubelet") != 0 {
		t.Fatalf("steps %q, %d changes, held %d", b.steps(), len(srv.Changes()), b.holding("k8s.kubelet"))
	}
	// Nothing is budgeted after Close.
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err == nil {
		t.Fatal("a budgeted restart after Close took no slot and acted")
	}
}

// Close waits for a hung release at most ReleaseTimeout, and the release
// goroutine ends with it. (A budget whose slots cannot be abandoned has the
// slot a Stop kept released at Close.)
func TestBudgetCloseBoundedBySlowRelease(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.noAbandon = true
	b.release = func(ctx context.Context, _ *memSlot, _ int) error {
		<-ctx.Done() // etcd unreachable: the revoke never answers
		return ctx.Err()
	}
	evs := newBudgetEvents()
	const bound = 200 * time.Millisecond
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{StopsAndStarts: true, ReleaseTimeout: bound, Progress: evs.record}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c.Close()
	took := time.Since(start)
	if took > bound+releaseEpsilon {
		t.Fatalf("Close took %s with a hung release, want ≤ %s + %s", took, bound, releaseEpsilon)
	}
	t.Logf("Close returned %s with a hung release (bound %s)", took.Round(time.Microsecond), bound)
	ev := evs.waitFor(ctx, t, "release-failed")
	if !errors.Is(ev.Err, context.DeadlineExceeded) || ev.Attempt != 1 {
		t.Fatalf("release-failed event %+v", ev)
	}
}

// Hold time: "ready" and "released" carry how long the slot was held, on
// the Client's clock.
func TestBudgetEventsHoldTime(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	mc := fake.NewManualClock(stepT0)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	srv.SetDurations("k8s", "kubelet", 0, 0)
	b := newMemBudget(1)
	evs := newBudgetEvents()
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Ready:    func(string) probe.Probe { return probe.Func("ok", func(context.Context) error { return nil }) },
		Settle:   7 * time.Second,
		Progress: evs.record,
	}))
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctx, out, "k8s.kubelet")
	ready := evs.waitFor(ctx, t, "ready")
	testclock.WaitTimerAt(ctx, t, mc, mc.Now().Add(7*time.Second)) // settling
	mc.Advance(7 * time.Second)
	if o := recvT(t, out); o.err != nil {
		t.Fatal(o.err)
	}
	rel := evs.waitFor(ctx, t, "released")
	if rel.Held-ready.Held != 7*time.Second || rel.Attempt != 1 {
		t.Fatalf("held %s at ready, %s at release (attempt %d): want 7s more", ready.Held, rel.Held, rel.Attempt)
	}
}

// Close racing every kind of budgeted operation, at a random point of
// each schedule: once everything returned, every slot taken was given
// back and nothing is left running.
func TestBudgetCloseRacingOperations(t *testing.T) {
	checkLeaks(t)
	const schedules = 40
	for seed := range uint64(schedules) {
		rng := rand.New(rand.NewPCG(seed, seed^0xc105e))
		ctx := ctxT(t)
		srv := budgetServer(t)
		b := newMemBudget(100)
		b.released = make(chan struct{}, 1)
		closeAt := rng.IntN(12) // after this many observed events
		var c *snapsvc.Client
		var once sync.Once
		closed := make(chan struct{})
		closeNow := func() { once.Do(func() { go func() { c.Close(); close(closed) }() }) }
		var events atomic.Int32
		var err error
		c, err = snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
			snapsvc.WithObserver(func(snapsvc.Event) {
				if int(events.Add(1)) > closeAt {
					closeNow()
				}
			}),
			snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{StopsAndStarts: true, Probe: fastProbe()}))
		if err != nil {
			t.Fatal(err)
		}
		if closeAt == 0 {
			closeNow()
		}
		var wg sync.WaitGroup
		do := func(f func()) {
			wg.Add(1)
			go func() { defer wg.Done(); f() }()
		}
		do(func() { c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}) })
		do(func() { c.Restart(ctx, []string{"k8s.containerd", "k8s.kubelet"}, snapsvc.RestartOptions{}) })
		do(func() {
			c.Stop(ctx, []string{"k8s.kube-proxy"}, snapsvc.StopOptions{})
			c.Start(ctx, []string{"k8s.kube-proxy"}, snapsvc.StartOptions{})
		})
		do(func() {
			if op, err := c.RestartAsync(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{}); err == nil {
				op.Wait(ctx)
			}
		})
		do(func() { c.Stop(ctx, []string{"k8s.kube-scheduler"}, snapsvc.StopOptions{}) }) // kept until Close
		do(func() {
			if op, err := c.StopAsync(ctx, []string{"k8s.kube-apiserver"}, snapsvc.StopOptions{}); err == nil {
				op.Wait(ctx)
			}
		})
		wg.Wait()
		closeNow() // if the schedule made fewer events
		<-closed
		for b.heldTotal() > 0 {
			select {
			case <-b.released:
			case <-ctx.Done():
				t.Fatalf("seed %d (Close after %d events): %d slots still held; steps %q", seed, closeAt, b.heldTotal(), b.steps())
			}
		}
		var acquired, released int
		for _, st := range b.steps() {
			acquired += boolInt(strings.HasPrefix(st, "acquire "))
			released += boolInt((strings.HasPrefix(st, "release ") && !strings.Contains(st, "failed")) || strings.HasPrefix(st, "abandon "))
		}
		if acquired != released {
			t.Fatalf("seed %d: %d acquired, %d released or abandoned: %q", seed, acquired, released, b.steps())
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
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
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(200*time.Millisecond)))
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

// A request whose answer never came may still be carried out after the
// change its look-up found is ready: that change can be someone else's
// identical restart, and the request's own comes later. Here the request
// is wedged in snapd, an identical restart of someone else's is made
// meanwhile, the call's time runs out (its look-up names the foreign
// change), and snapd gets to the request only once the foreign change is
// ready. Judged from snapd's records, the slot must be held through the
// change the request itself made. Before the hold waited for unanswered
// requests (schedule seed 442), it was given back as soon as the foreign
// change was ready.
func TestBudgetSlotHeldThroughTheLateChangeOfAnUnansweredRequest(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(100*time.Millisecond)))
	b := newMemBudget(1)
	times := newSlotTimes()
	logs := newLogWatch()
	quiet := logs.seen("a request that got no answer may still act")
	c := newClient(t, srv, snapsvc.WithLogger(logs.logger()), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Progress: times.progress}))
	unwedge := make(chan struct{})
	inj := srv.InjectFault(fake.Fault{Kind: fake.FaultWedge, Method: "POST", Path: "/v2/apps", Hold: unwedge, Times: 1})
	defer inj.Remove()
	wait := ctxT(t)
	type outcome struct{ err error }
	done := make(chan outcome, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- outcome{err}
	}()
	if err := srv.WaitFor(wait, func(v fake.View) bool { return v.RequestsTo("POST /v2/apps") == 1 }); err != nil {
		t.Fatal(err)
	}
	foreign, err := postApps(srv.SocketPath(), `{"action":"restart","names":["k8s.kubelet"]}`)
	if err != nil {
		t.Fatal(err)
	}
	o := recvT(t, done)
	var oe *snapsvc.OpError
	if !errors.As(o.err, &oe) || oe.ChangeID != foreign || !errors.Is(o.err, snapsvc.ErrOutcomeUnknown) {
		t.Fatalf("error %v; want the look-up to name the foreign change %s, outcome unknown", o.err, foreign)
	}
	if err := srv.WaitFor(wait, func(v fake.View) bool {
		for _, chg := range v.InProgress() {
			if chg.ID == foreign {
				return false
			}
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	// The foreign change is ready: the hold either gives the slot back
	// (the defect) or waits for the unanswered request.
	given := false
	select {
	case <-times.ch:
		given = true
	case <-quiet:
	case <-wait.Done():
		t.Fatal("neither given back nor held for the unanswered request")
	}
	close(unwedge) // snapd gets to the request at last
	if err := srv.WaitFor(wait, func(v fake.View) bool { return v.Handled("POST /v2/apps") == 2 }); err != nil {
		t.Fatal(err)
	}
	var own string
	for _, r := range srv.Requests() {
		if r.Fault == "wedge" {
			own = r.Change
		}
	}
	if !given {
		select {
		case <-times.ch:
		case <-wait.Done():
			t.Fatal("the slot was never given back")
		}
	}
	if err := srv.WaitFor(wait, func(v fake.View) bool { return len(v.InProgress()) == 0 }); err != nil {
		t.Fatal(err)
	}
	var ready time.Time
	for _, chg := range srv.Changes() {
		if chg.ID == own {
			ready = chg.ReadyTime
		}
	}
	times.mu.Lock()
	released := times.released[0]
	times.mu.Unlock()
	if own == "" || ready.IsZero() || released.Before(ready) {
		t.Fatalf("slot given back at %v; the request's own change %q was ready at %v (the foreign one was %s): the slot must be held through it", released.Format("15:04:05.000"), own, ready.Format("15:04:05.000"), foreign)
	}
}
