package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/retry"
)

// The restart budget's contract lives in package budget, which backends
// import; these names are the same types and values, for users of
// WithRestartBudget and for errors.Is.
type (
	// RestartBudget is budget.Budget: it hands out slots (see WithRestartBudget).
	RestartBudget = budget.Budget
	// BudgetSlot is budget.Slot, a slot taken from a RestartBudget.
	BudgetSlot = budget.Slot
	// BudgetFencer is budget.Fencer: slots that confirm they are still held
	// right before each request that disrupts.
	BudgetFencer = budget.Fencer
	// BudgetReadier is budget.Readier: slots that record that their
	// holder's services are ready again.
	BudgetReadier = budget.Readier
	// BudgetWait is budget.Wait: what a wait for a slot waits behind.
	BudgetWait = budget.Wait
)

// Errors of a restart budget (package budget's); match them with errors.Is.
var (
	// ErrBudgetUnavailable is budget.ErrUnavailable: the coordination
	// service could not be reached within the budget's bound. Retryable.
	ErrBudgetUnavailable = budget.ErrUnavailable
	// ErrSlotLost is budget.ErrSlotLost: the slot was lost while the
	// operation held it. Not retryable.
	ErrSlotLost = budget.ErrSlotLost
	// ErrBudgetRefused is budget.ErrRefused: the coordination service
	// answered and refused. Not retryable; never fails open.
	ErrBudgetRefused = budget.ErrRefused
	// ErrBudgetPaused is budget.ErrPaused: the key was paused, or outside
	// its window, at the moment of acting, until the operation's bounds
	// ended. Nothing was sent. Retryable.
	ErrBudgetPaused = budget.ErrPaused
	// ErrBudgetWait: no slot became free within BudgetOptions.MaxWait.
	// Retryable.
	ErrBudgetWait = errors.New("no restart budget slot became free in time")
)

// CanonicalKey is budget.CanonicalKey: the one form of a budget key.
func CanonicalKey(key string) string { return budget.CanonicalKey(key) }

// PauseScopes is budget.PauseScopes: the keys whose pause holds key back.
func PauseScopes(key string) []string { return budget.PauseScopes(key) }

// errBudgetClosed: the Client was closed while the operation waited for
// a slot (or before it asked for one).
var errBudgetClosed = errors.New("the client was closed")

// BudgetError is a failure of a budgeted operation that concerns its slot:
// it could not be had, it was lost, or the service did not become ready
// while the slot was held. It names the key, the holders when known, and
// how long the operation waited for the slot.
type BudgetError struct {
	// Key is the budget's key.
	Key string
	// Holders are who held the key's slots when last seen (empty if not
	// known).
	Holders []string
	// Waited is how long the operation waited for the slot.
	Waited time.Duration
	// Err is the cause: ErrBudgetUnavailable, ErrBudgetWait,
	// ErrBudgetRefused, ErrSlotLost, a *probe.NotReadyError, or the
	// context's error.
	Err error
}

func (e *BudgetError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "restart budget %s", e.Key)
	if e.Waited > 0 {
		fmt.Fprintf(&b, ": waited %s", e.Waited.Round(time.Millisecond))
	}
	if len(e.Holders) > 0 {
		fmt.Fprintf(&b, " (slot held by %s)", strings.Join(e.Holders, ", "))
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

// Unwrap returns the cause.
func (e *BudgetError) Unwrap() error { return e.Err }

// Retryable reports whether a later attempt could succeed: the budget was
// unreachable (including a fence that could not confirm the slot in time;
// nothing was sent then) or no slot came free in time. A refused budget,
// a lost slot, a service that did not become ready, a closed Client and a
// cancelled context are not.
func (e *BudgetError) Retryable() bool {
	if errors.Is(e.Err, ErrBudgetRefused) || errors.Is(e.Err, ErrSlotLost) {
		return false
	}
	return errors.Is(e.Err, ErrBudgetUnavailable) || errors.Is(e.Err, ErrBudgetWait) || errors.Is(e.Err, ErrBudgetPaused)
}

// BudgetOptions configure WithRestartBudget.
type BudgetOptions struct {
	// Key maps a service name ("snap.app") to its budget key. A
	// whole-snap name given to an operation ("snap") stands for every one
	// of its services (read from snapd's apps listing), each mapped by
	// Key, so a whole-snap restart and a restart of one of its services
	// exclude each other. Keys are put in canonical form (CanonicalKey).
	// Default: the name itself.
	Key func(name string) string
	// Ready returns the readiness check of a name, or nil when the
	// change being Done is enough. The slot is held until every check of
	// the operation passed.
	Ready func(name string) probe.Probe
	// Probe sets how Ready's checks are repeated (interval, timeout,
	// successes in a row, MaxWait). Its Clock defaults to the client's.
	Probe probe.Options
	// Settle is how long the slot is still held after the checks passed.
	Settle time.Duration
	// MaxWait bounds the wait for a slot (0: only the context bounds it);
	// past it the operation fails with ErrBudgetWait, retryable.
	MaxWait time.Duration
	// StopsAndStarts also budgets stops: a Stop of a service that is
	// running takes its slot and keeps it after the Stop returns, until a
	// Start of that service through this Client made it ready again (or
	// the Client is closed). Starts of services whose slot this Client
	// does not hold take none: starting takes nothing down.
	StopsAndStarts bool
	// ReleaseTimeout bounds one attempt to give a slot back, and how long
	// Close waits for the releases still running in the background
	// (default DefaultReleaseTimeout). It never delays an operation's
	// return past its context's deadline: see WithRestartBudget.
	ReleaseTimeout time.Duration
	// Progress, when set, receives what the budget does. It is called from
	// the operation's goroutine and, for releases and lost slots, from
	// background goroutines, possibly after the operation returned; it
	// must not block.
	Progress func(BudgetEvent)
}

// DefaultReleaseTimeout is BudgetOptions.ReleaseTimeout's default.
const DefaultReleaseTimeout = 10 * time.Second

// releaseAttempts is how many times a slot's release is tried before it
// is left to expire with its lease; releaseBackoff is the first pause
// between attempts (doubled after each, on the Client's clock).
const (
	releaseAttempts = 5
	releaseBackoff  = time.Second
)

// Budget event kinds, BudgetEvent.Kind.
const (
	// BudgetWaiting: the operation waits for a slot (Wait says behind
	// whom); sent again whenever that changes.
	BudgetWaiting = "waiting"
	// BudgetAcquired: the slot was taken (Waited: how long it took).
	BudgetAcquired = "acquired"
	// BudgetFenced: right before a request that disrupts, the slot was
	// confirmed still held (only for slots implementing BudgetFencer).
	BudgetFenced = "fenced"
	// BudgetFenceFailed: the fence could not confirm the slot (Err); the
	// request was not sent.
	BudgetFenceFailed = "fence-failed"
	// BudgetReady: the readiness checks passed; the settle time starts.
	BudgetReady = "ready"
	// BudgetMarkReadyFailed: the slot implements BudgetReadier and could
	// not record that its services are ready again (Err); the operation
	// goes on.
	BudgetMarkReadyFailed = "mark-ready-failed"
	// BudgetReleased: the slot was given back (Held: for how long it was
	// held).
	BudgetReleased = "released"
	// BudgetLost: the slot was lost while held (Err says why). Sent once
	// per slot.
	BudgetLost = "lost"
	// BudgetReleaseFailed: an attempt to give the slot back failed (Err,
	// Attempt); it is tried again in the background, up to 5 attempts or
	// until Close, after which (Final) the slot is freed only when the
	// budget expires it (its lease).
	BudgetReleaseFailed = "release-failed"
)

// BudgetEvent reports a step of a budgeted operation.
type BudgetEvent struct {
	// Time is when it happened, on the client's clock.
	Time time.Time
	// Kind is one of the Budget* kinds: "waiting", "acquired", "fenced",
	// "fence-failed", "ready", "mark-ready-failed", "released", "lost",
	// "release-failed".
	Kind string
	// Key is the budget's key.
	Key string
	// Holder is this holder (every kind but "waiting").
	Holder string
	// Wait is what the operation waits behind ("waiting").
	Wait BudgetWait
	// Waited is how long the operation has waited for the slot
	// ("waiting", "acquired").
	Waited time.Duration
	// Held is how long the slot has been held ("fenced", "fence-failed",
	// "ready", "released", "lost", "release-failed"): for "released",
	// the slot's hold time.
	Held time.Duration
	// Attempt is the release attempt ("released", "release-failed"),
	// from 1.
	Attempt int
	// Final ("release-failed") says no attempt follows: the slot is freed
	// only when the budget expires it. The last of the attempts is final,
	// and so is one that Close kept from being made (Err says so).
	Final bool
	// Err is why the slot was lost ("lost"), the fence failed
	// ("fence-failed") or the release failed ("release-failed").
	Err error
}

// WithRestartBudget makes restarts take a slot of b for each name they
// restart, sorted by key (so two operations cannot deadlock), and hold it
// through the restart until the service is ready again (opts.Ready, then
// opts.Settle). With opts.StopsAndStarts it also applies to stops of
// running services. Without this option no budget is consulted, which is
// what a first bootstrap, before any cluster exists, needs.
//
// Right before each request that disrupts (the restart or stop request,
// every attempt of it) the operation checks that its slots are still held
// and that it may act now: Lost, then BudgetFencer.Fence when the slot
// implements it; the request is then written only while the fence's
// confirmation stands. A slot lost by then stops the operation before it
// acts (a *BudgetError wrapping ErrSlotLost, not retryable); a fence that
// cannot tell stops it too (ErrBudgetUnavailable, retryable: nothing was
// sent).
//
// Slots are given back only once the operation's outcome is final and its
// services are ready (the slot rule, below: a change that may still run,
// or an unknown outcome, keeps them held in the background until the
// change is ready and the services are), and on Close. The release runs in
// the background: the operation waits for its first attempt only until its
// context ends, so a slow release (a lease revoke while etcd is
// unreachable) never delays its return past the deadline. A failed release
// is reported ("release-failed" event and a log line) and tried again in
// the background; Close waits for that work, at most ReleaseTimeout.
//
// Calls that snapd only queues (inside a configure hook) take no slot: the
// restart happens after the hook, out of the operation's sight. A restart
// paced by WithMinRestartInterval waits out its interval before taking a
// slot. Operations of one Client on the same key share one slot, so
// identical restarts still merge into one change.
func WithRestartBudget(b RestartBudget, opts BudgetOptions) Option {
	return func(s *settings) { s.budget = &budgetRunner{b: b, opts: opts} }
}

// The lifecycle of a budgeted operation, one function per step (the
// operation's phases: run.go):
//
//	acquire  takeBudget → takeAll → take → acquire: a slot per key,
//	         sorted by key, shared with the Client's other operations
//	fence    hold.fence, called by the operation right before each
//	         request that disrupts (call.fence, from runner.send); the
//	         request is written only while the confirmation stands
//	act      the operation itself (coalesce, run)
//	ready    hold.ready: readiness checks, MarkReady, then Settle
//	release  releaseBudget (sync) or holdAsync (async), by the slot rule
//	         below → hold.release → drop → releaseInBackground
//
// Exit paths: acquire fails (no slot, nothing sent: takeAll gives back
// what it took); the fence fails (nothing sent, slots given back); snapd
// refuses for good or the operation gives up before acting (slots given
// back at once); the change fails (given back at once); the change may
// still run or the outcome is unknown (held in the background until the
// change is ready and the services are); not ready or lost (reported,
// slots given back); a Stop under StopsAndStarts keeps its slots (keep)
// until the Start that follows (kept) or Close; Close cancels waits for
// slots and background holds, gives back kept slots, and waits, bounded,
// for the releases.

// budgetRunner is a Client's restart budget and the slots it holds.
type budgetRunner struct {
	b    RestartBudget
	opts BudgetOptions
	c    *Client

	mu      sync.Mutex
	slots   map[string]*sharedSlot // key -> slot held or being taken
	stopped map[string]*sharedSlot // kept by a budgeted Stop until a Start
	closed  bool
	running int           // background goroutines (releases, async holds)
	idle    chan struct{} // closed while running is 0; a new one once it is not

	base       context.Context // ends when the Client is closed
	cancelBase context.CancelFunc
	bg         context.Context // ends once Close stopped waiting: retries stop
	cancelBg   context.CancelFunc
}

// sharedSlot is one slot used by every operation of the Client on its key.
type sharedSlot struct {
	key      string
	done     chan struct{} // closed once Acquire returned
	slot     BudgetSlot
	err      error
	refs     int
	waited   time.Duration
	since    time.Time // when it was acquired (client's clock)
	lostOnce sync.Once
	// ready counts the users of the slot (refs) whose services are ready
	// again: the slot is marked ready (BudgetReadier) only once every
	// user is, since another user's act may still be under way.
	ready int
}

// init completes the runner once the Client is built.
func (b *budgetRunner) init(c *Client) {
	b.c = c
	b.slots = map[string]*sharedSlot{}
	b.stopped = map[string]*sharedSlot{}
	b.base, b.cancelBase = context.WithCancel(context.Background())
	b.bg, b.cancelBg = context.WithCancel(context.Background())
	b.idle = make(chan struct{})
	close(b.idle)
	if b.opts.Probe.Clock == nil {
		b.opts.Probe.Clock = c.clock
	}
	if b.opts.ReleaseTimeout <= 0 {
		b.opts.ReleaseTimeout = DefaultReleaseTimeout
	}
}

func (b *budgetRunner) key(name string) string {
	if b.opts.Key != nil {
		return b.opts.Key(name)
	}
	return name
}

func (b *budgetRunner) emit(ev BudgetEvent) {
	if b.opts.Progress != nil {
		ev.Time = b.c.clock.Now()
		b.opts.Progress(ev)
	}
}

// held is how long s has been held.
func (b *budgetRunner) held(s *sharedSlot) time.Duration {
	return b.c.clock.Now().Sub(s.since)
}

// keysOf returns the sorted, unique canonical keys of names (service
// names: a whole-snap name is expanded by budgetKeys first).
func (b *budgetRunner) keysOf(names []string) []string {
	var keys []string
	for _, n := range names {
		if k := CanonicalKey(b.key(n)); !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// budgetKeys returns the budget keys of names: each "snap.app" name's key,
// and for a whole-snap name the keys of every one of its services (from
// snapd's apps listing, svcs when the caller read it already), so that a
// restart of "k8s" on one machine and of "k8s.kube-apiserver" on another
// take the same slot. A snap without services keeps its own name's key.
// It reads snapd only when a whole-snap name is given and svcs is nil.
func (c *Client) budgetKeys(k *call, names []string, svcs []Service) ([]string, error) {
	var snaps []string
	for _, n := range names {
		if !strings.Contains(n, ".") && !slices.Contains(snaps, n) {
			snaps = append(snaps, n)
		}
	}
	if len(snaps) > 0 && svcs == nil {
		var err error
		if svcs, err = c.services(k, snaps); err != nil {
			return nil, err
		}
	}
	var expanded []string
	for _, n := range names {
		if strings.Contains(n, ".") {
			expanded = append(expanded, n)
			continue
		}
		found := false
		for _, s := range svcs {
			if s.Snap == n {
				expanded, found = append(expanded, s.FullName()), true
			}
		}
		if !found {
			expanded = append(expanded, n)
		}
	}
	return c.budget.keysOf(expanded), nil
}

// goBackground runs f on a goroutine that Close waits for (bounded).
// goCall runs f in the background (goBackground) on bctx, k's context
// without its end (it ends at Close), and on a wait call of its own for o
// on bctx.
func (b *budgetRunner) goCall(k *call, o op, f func(bctx context.Context, bk *call)) {
	b.goBackground(func() {
		bctx, cancel := context.WithCancel(context.WithoutCancel(k.ctx))
		defer cancel()
		stop := context.AfterFunc(b.base, cancel)
		defer stop()
		bk := b.c.newCall(bctx, callWait, o.action, o.t.names)
		defer bk.end()
		f(bctx, bk)
	})
}

func (b *budgetRunner) goBackground(f func()) {
	b.mu.Lock()
	if b.running == 0 {
		b.idle = make(chan struct{})
	}
	b.running++
	b.mu.Unlock()
	go func() {
		defer func() {
			b.mu.Lock()
			if b.running--; b.running == 0 {
				close(b.idle)
			}
			b.mu.Unlock()
		}()
		f()
	}()
}

// ---- acquire ----

// take gets the Client's slot of key: it joins one the Client already
// holds, waits for one being taken, or takes one itself.
func (b *budgetRunner) take(ctx context.Context, key string) (*sharedSlot, error) {
	c := b.c
	start := c.clock.Now()
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, &BudgetError{Key: key, Err: errBudgetClosed}
		}
		s := b.slots[key]
		if s != nil {
			select {
			case <-s.done:
				if s.err != nil || s.slot.Err() != nil {
					s = nil // failed or lost: take a fresh one
				}
			default:
			}
		}
		if s == nil {
			s = &sharedSlot{key: key, done: make(chan struct{}), refs: 1}
			b.slots[key] = s
			b.mu.Unlock()
			return b.acquire(ctx, s, start)
		}
		s.refs++
		b.mu.Unlock()
		select {
		case <-s.done:
		case <-ctx.Done():
			b.drop(ctx, s)
			return nil, &BudgetError{Key: key, Waited: c.clock.Now().Sub(start), Err: context.Cause(ctx)}
		}
		if s.err == nil {
			return s, nil
		}
		b.mu.Lock()
		s.refs--
		b.mu.Unlock()
		// The one taking it failed (perhaps only its context ended): try
		// again ourselves.
		if ctx.Err() != nil {
			return nil, &BudgetError{Key: key, Waited: c.clock.Now().Sub(start), Err: context.Cause(ctx)}
		}
	}
}

// acquire takes s's slot from the budget, bounded by MaxWait and ended by
// Close.
func (b *budgetRunner) acquire(ctx context.Context, s *sharedSlot, start time.Time) (*sharedSlot, error) {
	c := b.c
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopClose := context.AfterFunc(b.base, func() { cancel(errBudgetClosed) })
	defer stopClose()
	if b.opts.MaxWait > 0 {
		t := c.clock.NewTimer(b.opts.MaxWait)
		defer t.Stop()
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			select {
			case <-t.C():
				cancel(ErrBudgetWait)
			case <-stop:
			}
		}()
	}
	var holders []string
	slot, err := b.b.Acquire(actx, s.key, func(w BudgetWait) {
		holders = slices.Clone(w.Holders)
		b.emit(BudgetEvent{Kind: BudgetWaiting, Key: s.key, Wait: w, Waited: c.clock.Now().Sub(start)})
	})
	waited := c.clock.Now().Sub(start)
	if err == nil && slot == nil {
		err = fmt.Errorf("%w: the budget returned no slot", ErrBudgetUnavailable)
	}
	if err != nil && ctx.Err() == nil {
		switch cause := context.Cause(actx); {
		case errors.Is(cause, ErrBudgetWait):
			err = fmt.Errorf("%w (%s): %w", ErrBudgetWait, b.opts.MaxWait, err)
		case errors.Is(cause, errBudgetClosed):
			err = fmt.Errorf("%w while waiting for a slot: %w", errBudgetClosed, err)
		}
	}
	b.mu.Lock()
	s.slot, s.waited, s.since = slot, waited, c.clock.Now()
	if err != nil {
		s.err = &BudgetError{Key: s.key, Holders: holders, Waited: waited, Err: err}
		if b.slots[s.key] == s {
			delete(b.slots, s.key)
		}
	}
	close(s.done)
	b.mu.Unlock()
	if err != nil {
		return nil, s.err
	}
	b.emit(BudgetEvent{Kind: BudgetAcquired, Key: s.key, Holder: slot.Holder(), Waited: waited})
	return s, nil
}

// hold is the slots one operation holds, sorted by key.
type hold struct {
	b       *budgetRunner
	slots   []*sharedSlot
	stop    chan struct{}
	wg      sync.WaitGroup
	sendBy  time.Time     // the last fence's confirmations run out then (zero: no fencer)
	readied []*sharedSlot // slots whose ready count this hold raised
}

// takeAll takes the slots of keys in order; on failure it gives back those
// it took.
func (b *budgetRunner) takeAll(ctx context.Context, keys []string) (*hold, error) {
	h := &hold{b: b, stop: make(chan struct{})}
	for _, k := range keys {
		s, err := b.take(ctx, k)
		if err != nil {
			h.release(ctx)
			return nil, err
		}
		h.slots = append(h.slots, s)
	}
	h.watch()
	return h, nil
}

// watch tells the caller at once (a "lost" event) when a slot is lost
// mid-operation.
func (h *hold) watch() {
	for _, s := range h.slots {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			select {
			case <-s.slot.Lost():
				h.b.reportLost(s, s.slot.Err())
			case <-h.stop:
			}
		}()
	}
}

// reportLost sends s's "lost" event, once per slot.
func (b *budgetRunner) reportLost(s *sharedSlot, err error) {
	s.lostOnce.Do(func() {
		b.emit(BudgetEvent{Kind: BudgetLost, Key: s.key, Holder: s.slot.Holder(), Held: b.held(s), Err: err})
	})
}

// lostError is the error of a lost slot: a *BudgetError wrapping
// ErrSlotLost.
func (b *budgetRunner) lostError(s *sharedSlot, err error, what string) error {
	if !errors.Is(err, ErrSlotLost) {
		err = fmt.Errorf("%w: %w", ErrSlotLost, err)
	}
	if what != "" {
		err = fmt.Errorf("%w (%s)", err, what)
	}
	return &BudgetError{Key: s.key, Holders: []string{s.slot.Holder()}, Waited: s.waited, Err: err}
}

// ---- fence ----

// fence is called by the operation right before each request to act
// (runner.send): under a budget that applies to the request, it confirms
// the operation's slots are still held and that it may act now (the
// budget's pause and window, checked by the budget's Fence), and makes the
// request's write conditional on that confirmation still standing (see
// hold.fence). A non-nil error means the request must not be sent.
func (k *call) fence() error {
	if k.hold == nil {
		return nil
	}
	return k.hold.fence(k.ctx)
}

// fence confirms every slot of h is still held, and may act now: first
// what is already known (Lost), then, for slots implementing
// BudgetFencer, with the coordination service. A lost slot is reported
// ("lost") and stops the operation (ErrSlotLost, not retryable); a fence
// that cannot tell stops it too ("fence-failed"). h.sendBy becomes the time
// the earliest of the confirmations runs out, counted from before each
// Fence was called: the request is written only before it (runner.send,
// snapd.WithSendBy), so a holder held up between its fence and its write
// (a stop signal, a slow machine) never acts on a confirmation that ran
// out.
func (h *hold) fence(ctx context.Context) error {
	b := h.b
	h.sendBy = time.Time{}
	for _, s := range h.slots {
		if err := s.slot.Err(); err != nil {
			b.reportLost(s, err)
			return b.lostError(s, err, "before the request; nothing was sent")
		}
		f, ok := s.slot.(BudgetFencer)
		if !ok {
			continue
		}
		asked := time.Now()
		valid, err := f.Fence(ctx)
		switch {
		case err == nil:
			// An unbounded confirmation (an unbudgeted slot) sets no
			// send-by: nothing can take the slot away.
			if until, ends := valid.Until(asked); ends && (h.sendBy.IsZero() || until.Before(h.sendBy)) {
				h.sendBy = until
			}
			b.emit(BudgetEvent{Kind: BudgetFenced, Key: s.key, Holder: s.slot.Holder(), Held: b.held(s)})
		case errors.Is(err, ErrSlotLost):
			b.reportLost(s, err)
			return b.lostError(s, err, "fence before the request; nothing was sent")
		default:
			b.emit(BudgetEvent{Kind: BudgetFenceFailed, Key: s.key, Holder: s.slot.Holder(), Held: b.held(s), Err: err})
			return &BudgetError{Key: s.key, Holders: []string{s.slot.Holder()}, Waited: s.waited,
				Err: fmt.Errorf("cannot confirm the slot is still held, so the request was not sent: %w", err)}
		}
	}
	return nil
}

// ---- ready ----

// ready waits until the services o names pass their checks, then settles.
// Each slot of the hold counts its readiness once, however often ready
// runs (again in the background when the call ended while settling).
func (h *hold) ready(ctx context.Context, o op) error {
	b := h.b
	names := slices.Clone(o.t.names)
	slices.Sort(names)
	for _, n := range names {
		p := (probe.Probe)(nil)
		if b.opts.Ready != nil {
			p = b.opts.Ready(n)
		}
		if p == nil {
			continue
		}
		if err := probe.Wait(ctx, p, b.opts.Probe); err != nil {
			return h.errFor(n, err)
		}
	}
	for _, s := range h.slots {
		if slices.Contains(h.readied, s) {
			continue // counted by an earlier check of this hold (one cut short while settling)
		}
		b.emit(BudgetEvent{Kind: BudgetReady, Key: s.key, Holder: s.slot.Holder(), Held: b.held(s)})
		b.mu.Lock()
		s.ready++
		every := s.ready >= s.refs
		b.mu.Unlock()
		h.readied = append(h.readied, s)
		if r, ok := s.slot.(BudgetReadier); ok && every {
			if err := r.MarkReady(ctx); err != nil {
				b.emit(BudgetEvent{Kind: BudgetMarkReadyFailed, Key: s.key, Holder: s.slot.Holder(), Held: b.held(s), Err: err})
			}
		}
	}
	if b.opts.Settle > 0 {
		if err := retry.Sleep(ctx, b.c.clock, b.opts.Settle); err != nil {
			return h.errFor(names[0], ctxErr(ctx, "settling after the services became ready"))
		}
	}
	return nil
}

func (h *hold) errFor(name string, err error) error {
	key := h.b.key(name)
	for _, s := range h.slots {
		if s.key == key {
			return &BudgetError{Key: key, Holders: []string{s.slot.Holder()}, Waited: s.waited, Err: err}
		}
	}
	return &BudgetError{Key: key, Err: err}
}

// lost returns the error of the first slot lost, or nil.
func (h *hold) lost() error {
	for _, s := range h.slots {
		if err := s.slot.Err(); err != nil {
			return h.b.lostError(s, err, "")
		}
	}
	return nil
}

// ---- release ----

// stopWatching ends the watch for lost slots.
func (h *hold) stopWatching() {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	h.wg.Wait()
}

// release gives back every slot, in reverse order. It waits for the first
// attempt of each release only until ctx ends; the rest happens in the
// background.
func (h *hold) release(ctx context.Context) {
	h.stopWatching()
	h.b.mu.Lock()
	for _, s := range h.readied {
		s.ready--
	}
	h.b.mu.Unlock()
	h.readied = nil
	var pending []<-chan struct{}
	for i := len(h.slots) - 1; i >= 0; i-- {
		if ch := h.b.drop(ctx, h.slots[i]); ch != nil {
			pending = append(pending, ch)
		}
	}
	h.slots = nil
	for _, ch := range pending {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// drop gives up one use of s; the last use releases the slot, in the
// background. It returns a channel closed once the release's first
// attempt ended (nil when s is still used).
func (b *budgetRunner) drop(ctx context.Context, s *sharedSlot) <-chan struct{} {
	b.mu.Lock()
	s.refs--
	last := s.refs == 0
	if last && b.slots[s.key] == s {
		delete(b.slots, s.key)
	}
	b.mu.Unlock()
	if !last {
		return nil
	}
	return b.releaseInBackground(ctx, s)
}

// releaseInBackground gives s back: once its Acquire returned, up to
// releaseAttempts attempts, each bounded by ReleaseTimeout, with a
// doubling pause between them on the Client's clock. The first attempt
// always runs (even after Close); later ones stop once Close stopped
// waiting. Every failure is reported ("release-failed" and a log line).
func (b *budgetRunner) releaseInBackground(ctx context.Context, s *sharedSlot) <-chan struct{} {
	c := b.c
	log := c.log(ctx)
	first := make(chan struct{})
	b.goBackground(func() {
		firstDone := sync.OnceFunc(func() { close(first) })
		defer firstDone()
		<-s.done // Acquire returns promptly once its context ends (or Close)
		if s.slot == nil {
			return
		}
		pause := releaseBackoff
		for attempt := 1; ; attempt++ {
			rctx, cancel := context.WithTimeout(context.Background(), b.opts.ReleaseTimeout)
			stop := func() bool { return true }
			if attempt > 1 {
				stop = context.AfterFunc(b.bg, cancel)
			}
			err := s.slot.Release(rctx)
			stop()
			cancel()
			if err == nil {
				b.emit(BudgetEvent{Kind: BudgetReleased, Key: s.key, Holder: s.slot.Holder(), Held: b.held(s), Attempt: attempt})
				return
			}
			final := attempt == releaseAttempts || b.bg.Err() != nil
			b.emit(BudgetEvent{Kind: BudgetReleaseFailed, Key: s.key, Holder: s.slot.Holder(), Held: b.held(s), Attempt: attempt, Err: err, Final: final})
			firstDone()
			if final {
				log.Error("restart budget slot not given back; it is freed when the budget expires it", "key", s.key, "holder", s.slot.Holder(), "attempts", attempt, "error", err)
				return
			}
			log.Warn("restart budget slot not given back; trying again", "key", s.key, "holder", s.slot.Holder(), "attempt", attempt, "retry_in", pause, "error", err)
			if retry.Sleep(b.bg, c.clock, pause) != nil {
				err = fmt.Errorf("not tried: the client was closed (attempt %d: %w)", attempt, err)
				b.emit(BudgetEvent{Kind: BudgetReleaseFailed, Key: s.key, Holder: s.slot.Holder(), Held: b.held(s), Attempt: attempt + 1, Err: err, Final: true})
				log.Error("restart budget slot not given back before Close; it is freed when the budget expires it", "key", s.key, "holder", s.slot.Holder(), "attempts", attempt, "error", err)
				return
			}
			pause *= 2
		}
	})
	return first
}

// ---- the operation: take (phase budget), release (phase release) ----

// applies reports whether o takes slots.
func (b *budgetRunner) applies(o op) bool {
	if b.c.queuesInHook() {
		return false
	}
	switch o.action {
	case "restart":
		return true
	case "stop", "start":
		return b.opts.StopsAndStarts
	}
	return false
}

// takeBudget is the budget phase of an operation: it takes (or, for a
// Start, finds) the slots o needs. A nil hold means o runs unbudgeted. A
// restart paced by WithMinRestartInterval waits out its interval first, so
// no slot is held while pacing.
func (c *Client) takeBudget(k *call, o op) (*hold, error) {
	b := c.budget
	if b == nil || !b.applies(o) {
		return nil, nil
	}
	if o.action == "start" {
		keys, err := c.budgetKeys(k, o.t.names, nil)
		if err != nil {
			return nil, c.opError(o, "", 0, err)
		}
		h := b.kept(keys)
		if h != nil {
			h.watch()
		}
		return h, nil
	}
	names := o.t.names
	var svcs []Service
	if o.action == "stop" {
		running, all, err := c.running(k, o)
		if err != nil {
			return nil, c.opError(o, "", 0, err)
		}
		names, svcs = running, all
	}
	keys, err := c.budgetKeys(k, names, svcs)
	if err != nil {
		return nil, c.opError(o, "", 0, err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	if err := c.paceRestart(k, o); err != nil { // a no-op unless a restart must be paced
		return nil, c.opError(o, "", 0, err)
	}
	h, err := b.takeAll(k.ctx, keys)
	if err != nil {
		return nil, c.opError(o, "", 0, err)
	}
	return h, nil
}

// The slot rule. An operation's slots are given back only once its
// outcome is final and its services are ready again, on every path:
//
//   - nothing was done (the request was never sent, or snapd refused it,
//     or the operation gave up before snapd accepted anything): at once;
//   - the change failed for good (a *ChangeError: Error, Undone, Hold):
//     at once — nothing of it runs any more;
//   - the change is Done: once the readiness checks pass (then Settle);
//   - the change may still run (the call ended while waiting for it, or
//     found it after a lost answer and did not see it end), or the
//     outcome is unknown (snapd may have made a change, or may still make
//     one): held in the background until the change is ready (found
//     first, by a bounded look-up, when its id is not known), then until
//     the services are ready — exactly as an asynchronous operation's
//     slots are held.
//
// What is held in the background ends only that way, at the readiness
// checks' own bound (BudgetOptions.Probe.MaxWait), or at Close. A Stop
// under StopsAndStarts keeps its slots for the Start that follows (keep),
// unless nothing was done or its change failed.

// releaseBudget is the release phase of a synchronous operation that
// took h: res and err are the operation's outcome, which it returns,
// joined with what the readiness checks met. The caller's time bounds
// only the wait for readiness here; past it the slots stay held in the
// background (see the slot rule).
func (c *Client) releaseBudget(k *call, o op, h *hold, res *Result, err error) error {
	b := c.budget
	switch v := budgetVerdictOf(err); {
	case v == verdictNothingDone || v == verdictFailed:
		h.release(k.ctx)
		return err
	case o.action == "stop":
		b.keep(k.ctx, h)
		return err
	case v == verdictRunning || v == verdictUnknown:
		k.log.Info("the operation's outcome is not final; its restart budget slots stay held until its change is ready and its services are ready", "error", err)
		b.holdInBackground(k, o, h, func(bk *call) (bool, error) { return settleChange(bk, o, err) })
		return err
	}
	// Done: ready on the caller's time (the bound of the wait for its own
	// change: Policy.ChangeWait), or, past it, in the background.
	rk := k.ownChange()
	rerr := h.ready(rk.ctx, o)
	if rerr != nil && rk.ctx.Err() != nil {
		k.log.Info("services not ready within the call's time; the restart budget slots stay held until they are", "error", rerr)
		b.holdInBackground(k, o, h, func(*call) (bool, error) { return true, nil })
		return c.opError(o, res.ChangeID, res.Attempts, rerr)
	}
	if rerr == nil {
		rerr = h.lost()
	}
	h.release(rk.ctx)
	if rerr != nil {
		return c.opError(o, res.ChangeID, res.Attempts, rerr)
	}
	return nil
}

// budgetVerdict sorts an operation's outcome for the slot rule.
type budgetVerdict int

const (
	verdictDone        budgetVerdict = iota // the change is Done
	verdictNothingDone                      // nothing was done: no change made, none can be
	verdictFailed                           // the change failed for good
	verdictRunning                          // a change was made and may still run
	verdictUnknown                          // snapd may have made a change, or may still make one
)

func budgetVerdictOf(err error) budgetVerdict {
	var ce *ChangeError
	var oe *OpError
	switch {
	case err == nil:
		return verdictDone
	case errors.As(err, &ce) && ce.ChangeFailed():
		return verdictFailed
	case errors.As(err, &oe) && oe.ChangeID != "":
		return verdictRunning
	case errors.Is(err, ErrOutcomeUnknown):
		return verdictUnknown
	}
	return verdictNothingDone
}

// settleChange waits, on the background call bk, until the change of an
// operation that ended with err (verdictRunning or verdictUnknown) is
// ready: the change it names, or the one a look-up finds (the look-up
// that ran when the call ended, or a new one, each looking for
// interruptGrace: snapd may make the change late). It reports whether a change was found and ran its
// course: the services must then be ready before the slots go.
func settleChange(bk *call, o op, err error) (bool, error) {
	c := bk.c
	id := ""
	var oe *OpError
	if errors.As(err, &oe) {
		id = oe.ChangeID
	}
	if id == "" {
		var ue *outcomeUnknownError
		if !errors.As(err, &ue) {
			return false, nil
		}
		switch {
		case ue.found != nil:
			select {
			case id = <-ue.found:
			case <-bk.ctx.Done():
				return false, bk.ctx.Err()
			}
		case !ue.sent.at.IsZero():
			lctx, cancel := context.WithTimeout(bk.ctx, interruptGrace)
			lk := c.newCall(lctx, callWait, o.action, o.t.names)
			id = c.lookFor(lk, o, ue.sent, nil)
			lk.end()
			cancel()
		}
		if id == "" {
			return false, nil // no change was made: nothing to wait for
		}
	}
	_, werr := c.sharedWaitChange(bk, id)
	var ce *ChangeError
	if errors.As(werr, &ce) {
		return !ce.ChangeFailed(), nil
	}
	return werr == nil, werr
}

// holdInBackground keeps h after its operation returned, until settle
// says the change ran its course (then the services must be ready) or that
// there was none, and gives the slots back. It stops at Close (the slots
// are given back then too).
func (b *budgetRunner) holdInBackground(k *call, o op, h *hold, settle func(bk *call) (bool, error)) {
	log := k.log
	b.goCall(k, o, func(bctx context.Context, bk *call) {
		ran, err := settle(bk)
		switch {
		case err != nil:
			log.Info("could not see the change end; giving the restart budget slots back", "error", err)
		case ran:
			if rerr := h.ready(bctx, o); rerr != nil {
				log.Info("services not ready; giving the restart budget slots back", "error", rerr)
			}
		}
		h.release(bctx)
	})
}

// asyncHold finishes a budgeted asynchronous operation in the background:
// it waits for the change and the services' readiness, then gives the
// slots back, whether or not anyone calls Operation.Wait.
type asyncHold struct {
	done chan struct{}
	err  error
}

// wait returns the background's outcome, or ctx's end.
func (a *asyncHold) wait(ctx context.Context) error {
	select {
	case <-a.done:
		return a.err
	case <-ctx.Done():
		return ctxErr(ctx, "waiting for the services to be ready before giving back the restart budget slot")
	}
}

// budgetWait waits, under WithRestartBudget, until the operation's
// services are ready and its slots given back (nil without a budget).
func (o *Operation) budgetWait(ctx context.Context) error {
	if o.budget == nil {
		return nil
	}
	return o.budget.wait(ctx)
}

// holdAsync is the release phase of an asynchronous operation that snapd
// accepted: a Stop keeps its slots for the Start that follows; anything
// else waits in the background for its change and its services, then gives
// the slots back (the slot rule).
func (c *Client) holdAsync(k *call, op *Operation, h *hold, done bool) {
	b, o, res := c.budget, op.op, op.result
	if o.action == "stop" {
		b.keep(k.ctx, h)
		return
	}
	a := &asyncHold{done: make(chan struct{})}
	op.budget = a
	b.goCall(k, o, func(bctx context.Context, bk *call) {
		defer close(a.done)
		var werr error
		if !done && res.ChangeID != "" {
			if _, err := c.sharedWaitChange(bk, res.ChangeID); err != nil {
				werr = c.opError(o, res.ChangeID, res.Attempts, err)
			}
		}
		a.err = c.releaseBudget(bk, o, h, &res, werr)
	})
}

// running returns the names of o that name a running service (or a snap
// with one), and the services it read.
func (c *Client) running(k *call, o op) ([]string, []Service, error) {
	svcs, err := c.services(k, o.t.names)
	if err != nil {
		return nil, nil, err
	}
	var out []string
	for _, n := range o.t.names {
		for _, s := range svcs {
			if s.Active && (s.FullName() == n || s.Snap == n) {
				out = append(out, n)
				break
			}
		}
	}
	return out, svcs, nil
}

// keep moves a Stop's slots to the kept set, where the Start that follows
// finds them. Once the Client is closed nothing is kept: the slots are
// given back.
func (b *budgetRunner) keep(ctx context.Context, h *hold) {
	h.stopWatching()
	var extra []*sharedSlot
	b.mu.Lock()
	for _, s := range h.slots {
		if b.closed || b.stopped[s.key] != nil {
			extra = append(extra, s) // closed, or an earlier Stop keeps it
			continue
		}
		b.stopped[s.key] = s
	}
	b.mu.Unlock()
	h.slots = extra
	h.release(ctx)
}

// kept returns a hold of the slots a Stop kept for keys (nil: none).
func (b *budgetRunner) kept(keys []string) *hold {
	b.mu.Lock()
	defer b.mu.Unlock()
	var h *hold
	for _, k := range keys {
		if s := b.stopped[k]; s != nil {
			delete(b.stopped, k)
			if h == nil {
				h = &hold{b: b, stop: make(chan struct{})}
			}
			h.slots = append(h.slots, s)
		}
	}
	return h
}

// close gives back every slot the Client still holds: it ends waits for
// slots and asynchronous holds, releases the kept slots, and waits for the
// background releases at most ReleaseTimeout (real time), after which
// retries stop. A slot an operation still holds is released when that
// operation ends (its first release attempt runs even after Close).
func (b *budgetRunner) close() {
	b.mu.Lock()
	first := !b.closed
	b.closed = true
	kept := b.stopped
	b.stopped = map[string]*sharedSlot{}
	b.mu.Unlock()
	if first {
		b.cancelBase()
	}
	for _, s := range kept {
		b.drop(context.Background(), s)
	}
	// Every Close waits for the background work under way, a release
	// begun after an earlier Close (by a call that raced it) included.
	b.mu.Lock()
	idle := b.idle
	b.mu.Unlock()
	t := time.NewTimer(b.opts.ReleaseTimeout)
	select {
	case <-idle:
	case <-t.C:
	}
	t.Stop()
	if first {
		b.cancelBg()
	}
}
