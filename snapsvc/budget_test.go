package snapsvc_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// memBudget is an in-process RestartBudget of max slots per key for the
// core's tests (the etcd implementation is tested against real etcd in
// its own module). It records every step in order.
type memBudget struct {
	max int

	mu      sync.Mutex
	held    map[string][]*memSlot
	log     []string
	fail    error         // Acquire fails with it
	blocked chan struct{} // when set, Acquire waits for it to close

	// fence, when set, makes the slots BudgetFencers whose Fence returns
	// its result (and records "fence KEY").
	fence func(ctx context.Context, s *memSlot) error
	// valid, when set, is how long each fence's confirmation stands
	// (default an hour).
	valid func() budget.Validity
	// readier makes the slots BudgetReadiers too.
	readier bool
	// release, when set, runs before each Release attempt (from 1); an
	// error fails the attempt.
	release func(ctx context.Context, s *memSlot, attempt int) error
	// acquired, when set, is called with each slot Acquire returns.
	acquired func(s *memSlot)
	// released receives (without blocking) after each release.
	released chan struct{}
	// noAbandon: the slots do not implement budget.Abandoner (a budget of
	// another kind's).
	noAbandon bool
	// recorder, when set, makes the slots budget.Recorders (readying and
	// fencing too) whose Record returns its result (and records
	// "record KEY OUTCOME").
	recorder func(a budget.Act) (*budget.Halt, error)
}

type memSlot struct {
	b         *memBudget
	key       string
	lost      chan struct{}
	err       error
	released  bool
	abandoned bool // let go of as a crashed holder's: held until its lease and lock-delay run out
	attempts  int  // Release calls
}

// fencingSlot is a memSlot that implements snapsvc.BudgetFencer.
type fencingSlot struct{ *memSlot }

func (s fencingSlot) Fence(ctx context.Context) (budget.Validity, error) {
	s.b.record("fence " + s.key)
	valid := budget.ValidFor(time.Hour)
	s.b.mu.Lock()
	if s.b.valid != nil {
		valid = s.b.valid()
	}
	fence := s.b.fence
	s.b.mu.Unlock()
	if fence == nil {
		return valid, nil
	}
	return valid, fence(ctx, s.memSlot)
}

func newMemBudget(max int) *memBudget {
	return &memBudget{max: max, held: map[string][]*memSlot{}}
}

func (b *memBudget) record(s string) {
	b.mu.Lock()
	b.log = append(b.log, s)
	b.mu.Unlock()
}

func (b *memBudget) steps() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.log)
}

func (b *memBudget) holding(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.held[key])
}

func (b *memBudget) Acquire(ctx context.Context, key string, progress func(snapsvc.BudgetWait)) (snapsvc.BudgetSlot, error) {
	b.mu.Lock()
	fail, blocked := b.fail, b.blocked
	b.mu.Unlock()
	if blocked != nil {
		if progress != nil {
			progress(snapsvc.BudgetWait{Key: key, Holders: []string{"node-9"}, Max: b.max})
		}
		select {
		case <-blocked:
		case <-ctx.Done():
			b.record("cancelled " + key)
			return nil, context.Cause(ctx)
		}
	}
	if fail != nil {
		return nil, fail
	}
	b.mu.Lock()
	if len(b.held[key]) >= b.max {
		b.mu.Unlock()
		return nil, fmt.Errorf("memBudget: %s is full (the test expected no wait)", key)
	}
	s := &memSlot{b: b, key: key, lost: make(chan struct{})}
	b.held[key] = append(b.held[key], s)
	b.log = append(b.log, "acquire "+key)
	acquired, fence := b.acquired, b.fence
	b.mu.Unlock()
	if acquired != nil {
		acquired(s)
	}
	if b.noAbandon {
		return releaseOnly{s}, nil
	}
	if b.recorder != nil {
		return recordingSlot{readyingSlot{fencingSlot{s}}}, nil
	}
	if b.readier {
		return readyingSlot{fencingSlot{s}}, nil
	}
	if fence != nil {
		return fencingSlot{s}, nil
	}
	return s, nil
}

// recordingSlot is a readyingSlot that implements budget.Recorder.
type recordingSlot struct{ readyingSlot }

func (s recordingSlot) Record(ctx context.Context, a budget.Act) (*budget.Halt, error) {
	s.b.record("record " + s.key + " " + string(a.Outcome))
	return s.b.recorder(a)
}

// releaseOnly is a slot with the methods of snapsvc.BudgetSlot only.
type releaseOnly struct{ snapsvc.BudgetSlot }

// readyingSlot is a fencingSlot that implements snapsvc.BudgetReadier
// (it records "ready KEY").
type readyingSlot struct{ fencingSlot }

func (s readyingSlot) MarkReady(context.Context) error {
	s.b.record("ready " + s.key)
	return nil
}

func (s *memSlot) Key() string           { return s.key }
func (s *memSlot) Holder() string        { return "node-1" }
func (s *memSlot) Lost() <-chan struct{} { return s.lost }
func (s *memSlot) Err() error {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return s.err
}

// lose makes the slot lost, as an expired session would.
func (s *memSlot) lose() {
	s.b.mu.Lock()
	s.err = fmt.Errorf("%w: session expired", snapsvc.ErrSlotLost)
	s.b.mu.Unlock()
	close(s.lost)
}

func (s *memSlot) Release(ctx context.Context) error {
	s.b.mu.Lock()
	s.attempts++
	attempt, hook := s.attempts, s.b.release
	s.b.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, s, attempt); err != nil {
			s.b.record(fmt.Sprintf("release %s failed: %v", s.key, err))
			return err
		}
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.released || s.abandoned {
		return nil
	}
	s.released = true
	s.b.held[s.key] = slices.DeleteFunc(s.b.held[s.key], func(o *memSlot) bool { return o == s })
	s.b.log = append(s.b.log, "release "+s.key)
	if s.b.released != nil {
		select {
		case s.b.released <- struct{}{}:
		default:
		}
	}
	return nil
}

// Abandon lets go of the slot as a crashed holder would (budget.Abandoner):
// it stays held, as a real budget holds it until its lease and lock-delay
// run out, and a later Release does nothing.
func (s *memSlot) Abandon() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if s.released || s.abandoned {
		return
	}
	s.abandoned = true
	s.b.log = append(s.b.log, "abandon "+s.key)
}

// heldTotal is how many slots are held, over every key, not counting
// those abandoned (the budget frees them once their lease and lock-delay
// run out: nothing is left to the client).
func (b *memBudget) heldTotal() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, h := range b.held {
		for _, s := range h {
			if !s.abandoned {
				n++
			}
		}
	}
	return n
}

func (b *memBudget) slot(key string) *memSlot {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.held[key]) == 0 {
		return nil
	}
	return b.held[key][0]
}

// gate is a readiness probe that fails until opened.
type gate struct {
	name   string
	b      *memBudget
	open   chan struct{}
	checks chan struct{} // receives on every failed check
}

func newGate(name string, b *memBudget) *gate {
	return &gate{name: name, b: b, open: make(chan struct{}), checks: make(chan struct{}, 100)}
}

func (g *gate) probe() probe.Probe {
	return probe.Func("gate "+g.name, func(ctx context.Context) error {
		select {
		case <-g.open:
			g.b.record("ready " + g.name)
			return nil
		default:
			select {
			case g.checks <- struct{}{}:
			default:
			}
			return errors.New(g.name + " not serving yet")
		}
	})
}

func budgetServer(t *testing.T) *fake.Server {
	return fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(time.Millisecond)))
}

func fastProbe() probe.Options {
	return probe.Options{Interval: time.Millisecond, Timeout: time.Second}
}

func TestBudgetHeldUntilReady(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	g := newGate("apiserver", b)
	var events []string
	var evMu sync.Mutex
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Ready: func(name string) probe.Probe { return g.probe() },
		Probe: fastProbe(),
		Progress: func(ev snapsvc.BudgetEvent) {
			evMu.Lock()
			events = append(events, ev.Kind+" "+ev.Key+" "+ev.Holder)
			evMu.Unlock()
		},
	}))
	done := make(chan error, 1)
	var res *snapsvc.Result
	go func() {
		var err error
		res, err = c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
		done <- err
	}()
	recvT(t, g.checks) // the change is done and the probe is failing
	if n := b.holding("k8s.kube-apiserver"); n != 1 {
		t.Fatalf("slot not held while the service is not ready (held %d)", n)
	}
	chg := srv.Changes()
	if len(chg) != 1 || !chg[0].Ready {
		t.Fatalf("the restart's change should be done while the probe fails: %+v", chg)
	}
	close(g.open)
	if err := recvT(t, done); err != nil {
		t.Fatal(err)
	}
	if res.ChangeID != chg[0].ID {
		t.Fatalf("result change %q, want %q", res.ChangeID, chg[0].ID)
	}
	want := []string{"acquire k8s.kube-apiserver", "ready apiserver", "release k8s.kube-apiserver"}
	if got := b.steps(); !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
	evMu.Lock()
	defer evMu.Unlock()
	if want := []string{"acquired k8s.kube-apiserver node-1", "ready k8s.kube-apiserver node-1", "released k8s.kube-apiserver node-1"}; !slices.Equal(events, want) {
		t.Fatalf("events %q, want %q", events, want)
	}
}

func TestBudgetSortedKeysAndSettle(t *testing.T) {
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	clock := &instantClock{}
	c := newClient(t, srv, snapsvc.WithClock(clock), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Settle: 7 * time.Second}))
	if _, err := c.Restart(ctx, []string{"k8s.kubelet", "k8s.containerd", "k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	// Taken in key order; given back in parallel, in the background.
	want := []string{"acquire k8s.containerd", "acquire k8s.kubelet", "release k8s.containerd", "release k8s.kubelet"}
	got := b.steps()
	if len(got) == 4 {
		slices.Sort(got[2:])
	}
	if !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
	clock.mu.Lock()
	defer clock.mu.Unlock()
	if !slices.Contains(clock.pauses, 7*time.Second) {
		t.Fatalf("no settle pause of 7s on the client's clock: %v", clock.pauses)
	}
}

func TestBudgetUnavailableIsRetryable(t *testing.T) {
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.fail = fmt.Errorf("%w: etcd at 127.0.0.1:2379: context deadline exceeded", snapsvc.ErrBudgetUnavailable)
	b.blocked = make(chan struct{})
	close(b.blocked)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	_, err := c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	var be *snapsvc.BudgetError
	if !errors.As(err, &opErr) || !errors.As(err, &be) || !errors.Is(err, snapsvc.ErrBudgetUnavailable) {
		t.Fatalf("want an OpError wrapping a BudgetError and ErrBudgetUnavailable, got %v", err)
	}
	if !opErr.Retryable() {
		t.Fatalf("an unreachable budget must be retryable: %v", err)
	}
	if be.Key != "k8s.kube-apiserver" || !slices.Equal(be.Holders, []string{"node-9"}) {
		t.Fatalf("error names key %q holders %q", be.Key, be.Holders)
	}
	for _, part := range []string{"restart k8s.kube-apiserver", "restart budget k8s.kube-apiserver", "slot held by node-9", "[retryable]"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q lacks %q", err, part)
		}
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("restarted without a slot: %d changes", n)
	}
}

func TestBudgetMaxWait(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.blocked = make(chan struct{}) // never frees
	clock := &instantClock{}
	c := newClient(t, srv, snapsvc.WithClock(clock), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{MaxWait: time.Minute}))
	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrBudgetWait) || !errors.As(err, &opErr) || !opErr.Retryable() {
		t.Fatalf("want a retryable ErrBudgetWait, got %v", err)
	}
	if !slices.Contains(b.steps(), "cancelled k8s.kubelet") {
		t.Fatalf("the waiter was not cancelled: %q", b.steps())
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("restarted without a slot: %d changes", n)
	}
}

func TestBudgetSlotLostMidRestart(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	g := newGate("kubelet", b)
	lostEv := make(chan snapsvc.BudgetEvent, 1)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Ready: func(string) probe.Probe { return g.probe() },
		Probe: fastProbe(),
		Progress: func(ev snapsvc.BudgetEvent) {
			if ev.Kind == "lost" {
				lostEv <- ev
			}
		},
	}))
	done := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- err
	}()
	recvT(t, g.checks)
	b.slot("k8s.kubelet").lose()
	ev := recvT(t, lostEv) // told at once, while the operation still waits
	if !errors.Is(ev.Err, snapsvc.ErrSlotLost) {
		t.Fatalf("lost event error %v", ev.Err)
	}
	close(g.open)
	err := recvT(t, done)
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrSlotLost) || !errors.As(err, &opErr) || opErr.Retryable() {
		t.Fatalf("want a non-retryable ErrSlotLost, got %v", err)
	}
	if opErr.ChangeID == "" || opErr.ChangeID != srv.Changes()[0].ID {
		t.Fatalf("error should name the restart's change: %v", err)
	}
	// Where no change can be named (snapctl), the error still says the
	// services were acted on.
	var be *snapsvc.BudgetError
	if !errors.As(err, &be) || !be.ChangeDone || !strings.Contains(err.Error(), "after the change was done") {
		t.Fatalf("error should say the change was done: %v", err)
	}
}

func TestBudgetNotReady(t *testing.T) {
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	g := newGate("kubelet", b)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Ready: func(string) probe.Probe { return g.probe() },
		Probe: probe.Options{Interval: time.Millisecond, MaxWait: 20 * time.Millisecond},
	}))
	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	if !errors.Is(err, probe.ErrNotReady) || !errors.As(err, &opErr) || opErr.Retryable() {
		t.Fatalf("want a non-retryable probe.ErrNotReady, got %v", err)
	}
	if b.holding("k8s.kubelet") != 0 {
		t.Fatal("slot not given back after the failure")
	}
}

func TestBudgetSharedByIdenticalRestarts(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	g := newGate("kubelet", b)
	const n = 5
	inHold := make(chan struct{}, n) // one per operation waiting for readiness
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Ready: func(string) probe.Probe { inHold <- struct{}{}; return g.probe() },
		Probe: fastProbe(),
	}))
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			errs <- err
		}()
	}
	for range n {
		recvT(t, inHold) // every restart is under the one slot, none ready yet
	}
	close(g.open)
	for range n {
		if err := recvT(t, errs); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"acquire k8s.kubelet", "release k8s.kubelet"}
	got := slices.DeleteFunc(b.steps(), func(s string) bool { return strings.HasPrefix(s, "ready") })
	if !slices.Equal(got, want) {
		t.Fatalf("%d restarts of one Client: steps %q, want one slot %q", n, got, want)
	}
}

func TestBudgetNotTakenInConfigureHook(t *testing.T) {
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	hook := srv.StartHook("k8s", "configure")
	c := newSnapctlClient(t, srv, hook.Cookie(), snapsvc.WithHook("configure"), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil || !res.Queued {
		t.Fatalf("want a queued restart, got %+v %v", res, err)
	}
	if steps := b.steps(); len(steps) != 0 {
		t.Fatalf("a queued restart took a slot: %q", steps)
	}
	hook.Finish()
}

func TestBudgetStopKeepsSlotUntilStartReady(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	g := newGate("kubelet", b)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		StopsAndStarts: true,
		Ready:          func(string) probe.Probe { return g.probe() },
		Probe:          fastProbe(),
	}))
	if _, err := c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	if b.holding("k8s.kubelet") != 1 {
		t.Fatal("a Stop of a running service must keep its slot")
	}
	// Stopping it again takes nothing: it is not running.
	if _, err := c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Start(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{})
		done <- err
	}()
	recvT(t, g.checks)
	if b.holding("k8s.kubelet") != 1 {
		t.Fatal("slot given back before the started service was ready")
	}
	close(g.open)
	if err := recvT(t, done); err != nil {
		t.Fatal(err)
	}
	want := []string{"acquire k8s.kubelet", "ready kubelet", "release k8s.kubelet"}
	if got := b.steps(); !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
	// A Start of a service whose slot nobody kept takes none.
	if _, err := c.Start(ctx, []string{"k8s.kube-proxy"}, snapsvc.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := b.steps(); len(got) != 3 {
		t.Fatalf("a plain Start took a slot: %q", got)
	}
}

// The slot a Stop kept, its service down, is abandoned at Close (the
// budget frees it as a crashed holder's, behind the lock-delay): it was
// released, and the next machine's restart could take the service down
// while this one's was.
func TestBudgetCloseAbandonsKeptSlots(t *testing.T) {
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{StopsAndStarts: true}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if want := []string{"acquire k8s.kubelet", "abandon k8s.kubelet"}; !slices.Equal(b.steps(), want) {
		t.Fatalf("steps %q, want %q", b.steps(), want)
	}
}

func TestBudgetAsyncReleasesAfterReady(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	g := newGate("kubelet", b)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Ready: func(string) probe.Probe { return g.probe() },
		Probe: fastProbe(),
	}))
	op, err := c.RestartAsync(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	recvT(t, g.checks) // released only once ready, whether or not Wait is called
	if b.holding("k8s.kubelet") != 1 {
		t.Fatal("slot given back before ready")
	}
	close(g.open)
	res, err := op.Wait(ctx)
	if err != nil || res.Status != "Done" {
		t.Fatalf("Wait: %+v %v", res, err)
	}
	if b.holding("k8s.kubelet") != 0 {
		t.Fatal("slot not given back after Wait")
	}
}

func TestBudgetPacesBeforeTakingSlot(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	mc := fake.NewManualClock(stepT0)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	srv.SetDurations("k8s", "kubelet", 0, 0)
	b := newMemBudget(1)
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithMinRestartInterval(10*time.Second),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctx, out, "k8s.kubelet")
	testclock.WaitTimerAt(ctx, t, mc, stepT0.Add(10*time.Second)) // pacing
	if got := b.steps(); len(got) != 2 || b.holding("k8s.kubelet") != 0 {
		t.Fatalf("a slot was taken while pacing: %q", got)
	}
	mc.Advance(10 * time.Second)
	if o := recvT(t, out); o.err != nil {
		t.Fatal(o.err)
	}
	want := []string{"acquire k8s.kubelet", "release k8s.kubelet", "acquire k8s.kubelet", "release k8s.kubelet"}
	if got := b.steps(); !slices.Equal(got, want) {
		t.Fatalf("steps %q, want %q", got, want)
	}
}
