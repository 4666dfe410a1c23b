package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// budgetRunner is a Client's restart budget and the slots it holds.
type budgetRunner struct {
	b    RestartBudget
	opts BudgetOptions
	c    *Client

	mu      sync.Mutex
	slots   map[string]*sharedSlot // key -> slot held or being taken
	stopped map[string]*sharedSlot // kept by a budgeted Stop until a Start
	closed  bool

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
	// unanswered: the requests of the Stop that keeps the slot (stopped)
	// that got no answer, for the Start that takes it over.
	unanswered []unansweredRequest
	// abandon: a user let go of the slot while its change may still run
	// or its services may still be down: the last use abandons it
	// (budget.Abandoner) rather than release it.
	abandon bool
}

// init completes the runner once the Client is built.
func (b *budgetRunner) init(c *Client) {
	b.c = c
	b.slots = map[string]*sharedSlot{}
	b.stopped = map[string]*sharedSlot{}
	b.base, b.cancelBase = context.WithCancel(context.Background())
	b.bg, b.cancelBg = context.WithCancel(context.Background())
	if b.opts.Probe.Clock == nil {
		b.opts.Probe.Clock = c.clock
	}
	if b.opts.ReleaseTimeout <= 0 {
		b.opts.ReleaseTimeout = DefaultReleaseTimeout
	}
	if b.opts.MaxHold == 0 {
		b.opts.MaxHold = DefaultMaxHold
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
		// scoped: ends as acquire returns (stop).
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

// drop gives up one use of s; the last use releases the slot, in the
// background. It returns a channel closed once the release's first
// attempt ended (nil when s is still used).
func (b *budgetRunner) drop(ctx context.Context, s *sharedSlot) <-chan struct{} {
	return b.letGo(ctx, s, false)
}

// letGo gives up one use of s, its user's change possibly still running
// or its services possibly still down (abandon); the last use releases
// the slot in the background, or abandons it where any use did (abandonNow:
// it is freed as a crashed holder's would be). It returns a channel closed
// once the release's first attempt ended (nil when s is still used, or
// abandoned).
func (b *budgetRunner) letGo(ctx context.Context, s *sharedSlot, abandon bool) <-chan struct{} {
	b.mu.Lock()
	s.refs--
	s.abandon = s.abandon || abandon
	last := s.refs == 0
	if last && b.slots[s.key] == s {
		delete(b.slots, s.key)
	}
	abandon = s.abandon
	b.mu.Unlock()
	switch {
	case !last:
		return nil
	case abandon:
		b.abandonNow(ctx, s)
		return nil
	}
	return b.releaseInBackground(ctx, s)
}

// abandonNow lets go of s as a crashed holder would (budget.Abandoner): the
// budget frees it once its lease runs out and, as it may have acted
// without a readiness since, once the lock-delay has passed. A slot that
// cannot be abandoned (a budget without Abandoner) is released, with a
// warning: nothing else would ever free it.
func (b *budgetRunner) abandonNow(ctx context.Context, s *sharedSlot) {
	<-s.done
	if s.slot == nil {
		return
	}
	if a, ok := s.slot.(BudgetAbandoner); ok {
		a.Abandon()
		b.emit(BudgetEvent{Kind: BudgetAbandoned, Key: s.key, Holder: s.slot.Holder(), Held: b.held(s)})
		b.c.log(ctx).Warn("restart budget slot abandoned: its change may still run or its services may still be down; the budget frees it as a crashed holder's, after its lease and lock-delay", "key", s.key, "holder", s.slot.Holder())
		return
	}
	b.c.log(ctx).Warn("restart budget slot released although its change may still run or its services may still be down: the budget cannot abandon it (budget.Abandoner)", "key", s.key, "holder", s.slot.Holder())
	b.releaseInBackground(ctx, s)
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
	c.bg.run(func() {
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

// keep moves a Stop's slots to the kept set, where the Start that follows
// finds them (and a failed Start's back there: their services are still
// down). Once the Client is closed nothing is kept: the slots are
// abandoned.
func (b *budgetRunner) keep(ctx context.Context, h *hold) {
	h.record(ctx, false) // a Start that failed: its services are still down (kept, whatever the record's fate)
	h.move(holdKept)
	h.stopListening()
	var extra []*sharedSlot
	b.mu.Lock()
	// The Stop's requests that got no answer go with each of its slots:
	// the Start that takes any of them holds it until those cannot act.
	reqs := h.takeUnanswered()
	closed := b.closed
	for _, s := range h.slots {
		if closed {
			extra = append(extra, s)
			continue
		}
		if earlier := b.stopped[s.key]; earlier != nil {
			extra = append(extra, s) // an earlier Stop keeps it
			earlier.unanswered = append(earlier.unanswered, reqs...)
			continue
		}
		b.stopped[s.key] = s
		s.unanswered = append(s.unanswered, reqs...)
	}
	b.mu.Unlock()
	h.slots = extra
	if closed {
		h.abandon(ctx) // no Start will come: the services stay down
		return
	}
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
				h = newHold(b)
				h.fromStop = true
				h.didAct = true // the Stop's act: the Start's outcome ends it
			}
			h.slots = append(h.slots, s)
			h.unanswered = append(h.unanswered, s.unanswered...)
			s.unanswered = nil
		}
	}
	return h
}

// close lets go of every slot the Client still holds: it ends waits for
// slots and asynchronous holds (those whose change may still run, or
// whose services may still be down, abandon their slots: a clean exit is
// never less safe than a crash), abandons the slots Stops kept (their
// services are down), and waits for the background releases at most
// ReleaseTimeout (real time), after which retries stop. A slot an
// operation still holds is let go of when that operation ends (its first
// release attempt runs even after Close).
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
		b.letGo(context.Background(), s, true) // its service is down
	}
	// Every Close waits for the background work under way, a release
	// begun after an earlier Close (by a call that raced it) included.
	b.c.bg.awaitIdle(b.opts.ReleaseTimeout)
	if first {
		b.cancelBg()
	}
}
