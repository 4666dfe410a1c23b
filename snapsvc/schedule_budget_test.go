package snapsvc_test

// The randomized schedule test's restart budget: one behaviour per
// schedule, drawn from what real backends do, and a record of every grant
// (with the call it was for) and of when each slot was held.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Budget behaviours of a schedule.
const (
	budgetGrant      = "grant"        // every Acquire grants; fences confirm for an hour
	budgetUnbudgeted = "unbudgeted"   // every grant is made without the coordination service (no cluster)
	budgetFailOpen   = "fail-open"    // half the grants are unbudgeted (the service was unreachable)
	budgetLost       = "lost"         // a third of the slots are lost 0-40 ms after their grant
	budgetSlowFence  = "slow-fence"   // each fence takes 0-30 ms
	budgetExpired    = "expired"      // each slot's first fence confirms for 1 ns
	budgetRefused    = "refused"      // half the Acquires are refused for good (ErrBudgetRefused)
	budgetSlowFree   = "slow-release" // releases take 0-300 ms, as a lease revoke with etcd away
)

var budgetBehaviours = []string{budgetGrant, budgetUnbudgeted, budgetFailOpen, budgetLost, budgetSlowFence, budgetExpired, budgetRefused, budgetSlowFree}

// callKey carries, in a call's context, the schedule's call (the budget
// records whose grant it is).
type callKey struct{}

// grant is one slot granted (or one Acquire refused).
type grant struct {
	call       *call
	key        string
	at         time.Time
	unbudgeted bool
	refused    bool
	slot       *schedSlot
}

// schedBudget is the schedule's budget: Max 100 per key (the core's
// behaviour under a budget is what is tested, not contention), one
// behaviour.
type schedBudget struct {
	behaviour string
	rng       *rand.Rand
	slots     *slotLog

	mu      sync.Mutex
	grants  []grant
	held    map[string][]*schedSlot
	timers  sync.WaitGroup // slots' loss timers
	stopped chan struct{}  // ends the loss timers
}

func newSchedBudget(behaviour string, seed uint64, slots *slotLog) *schedBudget {
	return &schedBudget{behaviour: behaviour, rng: rand.New(rand.NewPCG(seed, seed^0xb0d9e7)), slots: slots,
		held: map[string][]*schedSlot{}, stopped: make(chan struct{})}
}

// intN is rng.IntN under the budget's lock.
func (b *schedBudget) intN(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rng.IntN(n)
}

func (b *schedBudget) Acquire(ctx context.Context, key string, _ func(snapsvc.BudgetWait)) (snapsvc.BudgetSlot, error) {
	cl, _ := ctx.Value(callKey{}).(*call)
	g := grant{call: cl, key: key, at: time.Now()}
	if b.behaviour == budgetRefused && cl != nil && b.intN(2) == 0 { // the warm-up is never refused
		g.refused = true
		b.mu.Lock()
		b.grants = append(b.grants, g)
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: schedule: key %s refused by the coordination service", budget.ErrRefused, key)
	}
	g.unbudgeted = b.behaviour == budgetUnbudgeted || (b.behaviour == budgetFailOpen && b.intN(2) == 0)
	s := &schedSlot{b: b, key: key, lost: make(chan struct{}), unbudgeted: g.unbudgeted}
	g.slot = s
	b.mu.Lock()
	b.grants = append(b.grants, g)
	b.held[key] = append(b.held[key], s)
	b.mu.Unlock()
	client := -1
	if cl != nil {
		client = cl.client
	}
	b.slots.taken(s, client)
	if b.behaviour == budgetLost && cl != nil && !g.unbudgeted && b.intN(3) == 0 { // nor is the warm-up's slot lost
		after := time.Duration(b.intN(40)) * time.Millisecond
		b.timers.Add(1)
		go func() {
			defer b.timers.Done()
			t := time.NewTimer(after) // the session's own expiry, not synchronisation
			defer t.Stop()
			select {
			case <-t.C:
				s.lose()
			case <-s.done():
			case <-b.stopped:
			}
		}()
	}
	return s, nil
}

// close ends the loss timers.
func (b *schedBudget) close() {
	close(b.stopped)
	b.timers.Wait()
}

// stillHeld returns how many slots are held, and how many of them were
// abandoned (freed by the budget once their lease and lock-delay run out:
// nothing left to the clients).
func (b *schedBudget) stillHeld() (held, abandoned int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.held {
		for _, s := range h {
			s.mu.Lock()
			if s.abandoned {
				abandoned++
			} else {
				held++
			}
			s.mu.Unlock()
		}
	}
	return held, abandoned
}

// grantsOf returns the grants the budget made.
func (b *schedBudget) allGrants() []grant {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.grants)
}

// schedSlot is a slot of schedBudget: a Fencer.
type schedSlot struct {
	b          *schedBudget
	key        string
	unbudgeted bool

	lost      chan struct{}
	mu        sync.Mutex
	err       error
	fences    int
	released  bool
	abandoned bool          // let go of as a crashed holder's: held until its lease and lock-delay ran out
	freed     chan struct{} // closed at release (lazily made)
}

// Abandon lets go of the slot as a crashed holder would (budget.Abandoner):
// it counts as held until its lease and lock-delay ran out, which in a
// schedule is after its end, and a later Release does nothing.
func (s *schedSlot) Abandon() {
	s.mu.Lock()
	if s.released || s.abandoned {
		s.mu.Unlock()
		return
	}
	s.abandoned = true
	s.mu.Unlock()
	s.b.slots.abandoned(s)
}

func (s *schedSlot) Key() string { return s.key }
func (s *schedSlot) Holder() string {
	if s.unbudgeted {
		return "schedule (unbudgeted)"
	}
	return "schedule"
}
func (s *schedSlot) Lost() <-chan struct{} { return s.lost }
func (s *schedSlot) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// done is closed once the slot was released.
func (s *schedSlot) done() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed == nil {
		s.freed = make(chan struct{})
		if s.released {
			close(s.freed)
		}
	}
	return s.freed
}

// lose makes the slot lost, as an expired session does.
func (s *schedSlot) lose() {
	s.mu.Lock()
	if s.released || s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = fmt.Errorf("%w: schedule: session expired", budget.ErrSlotLost)
	s.mu.Unlock()
	s.b.slots.lost(s)
	close(s.lost)
}

func (s *schedSlot) Fence(ctx context.Context) (budget.Validity, error) {
	if s.b.behaviour == budgetSlowFence {
		t := time.NewTimer(time.Duration(s.b.intN(30)) * time.Millisecond) // the fence's own round trip
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return budget.Validity{}, fmt.Errorf("%w: schedule: fence: %w", budget.ErrUnavailable, context.Cause(ctx))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return budget.Validity{}, s.err
	}
	if s.released {
		return budget.Validity{}, fmt.Errorf("%w: schedule: fence after release", budget.ErrSlotLost)
	}
	s.fences++
	switch {
	case s.unbudgeted:
		return budget.Unbounded(), nil
	case s.b.behaviour == budgetExpired && s.fences == 1:
		return budget.ValidFor(time.Nanosecond), nil
	}
	return budget.ValidFor(time.Hour), nil
}

func (s *schedSlot) Release(ctx context.Context) error {
	s.mu.Lock()
	abandoned := s.abandoned
	s.mu.Unlock()
	if abandoned {
		return nil
	}
	s.b.slots.given(s) // the slot stops counting as held when its release begins
	if s.b.behaviour == budgetSlowFree {
		t := time.NewTimer(time.Duration(s.b.intN(300)) * time.Millisecond) // the revoke's own duration
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	s.mu.Lock()
	first := !s.released
	s.released = true
	if first && s.freed != nil {
		close(s.freed)
	}
	s.mu.Unlock()
	if first {
		s.b.mu.Lock()
		s.b.held[s.key] = slices.DeleteFunc(s.b.held[s.key], func(o *schedSlot) bool { return o == s })
		s.b.mu.Unlock()
	}
	return nil
}

// slotLog records, on the real clock, when each slot was held.
type slotLog struct {
	mu    sync.Mutex
	spans map[*schedSlot]*slotSpan
}

type slotSpan struct {
	key       string
	client    int
	from, to  time.Time
	released  bool
	lost      bool
	abandoned bool // held on, as by a crashed holder, until after the schedule
}

func (l *slotLog) taken(s *schedSlot, client int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.spans == nil {
		l.spans = map[*schedSlot]*slotSpan{}
	}
	l.spans[s] = &slotSpan{key: s.key, client: client, from: time.Now()}
}

func (l *slotLog) given(s *schedSlot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sp := l.spans[s]; sp != nil && !sp.released {
		sp.to, sp.released = time.Now(), true
	}
}

func (l *slotLog) abandoned(s *schedSlot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sp := l.spans[s]; sp != nil {
		sp.abandoned = true
	}
}

func (l *slotLog) lost(s *schedSlot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sp := l.spans[s]; sp != nil {
		sp.lost = true
	}
}

// covers reports whether a slot of key that client held covered from to
// to (real clock), and whether a slot of key the client held from sent
// (when the call that sent the request began) on was lost before to: the
// budget took it away, and nothing is promised after that (snapd may act
// on a request written under a slot after the slot is gone: a handler
// late for its state lock). A slot counts as lost only if the client had
// not given it back first (schedSlot.lose), so an early release is never
// taken for a loss.
func (l *slotLog) covers(key string, client int, sent, from, to time.Time) (covered, lost bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := from
	if sent.Before(first) {
		first = sent
	}
	for _, sp := range l.spans {
		if sp.key != key || sp.client != client {
			continue
		}
		if !sp.from.After(from) && (!sp.released || !sp.to.Before(to)) {
			return true, false
		}
		if sp.lost && !sp.from.After(to) && (!sp.released || !sp.to.Before(first)) {
			lost = true
		}
	}
	return false, lost
}

// describe says, for a failure's message, when each slot of key was held
// (the real clock).
func (l *slotLog) describe(key string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, sp := range l.spans {
		if sp.key == key {
			fmt.Fprintf(&b, "\n  client %d from %s", sp.client, sp.from.Format("15:04:05.000"))
			if sp.released {
				fmt.Fprintf(&b, " to %s", sp.to.Format("15:04:05.000"))
			}
			if sp.lost {
				b.WriteString(" (lost)")
			}
			if sp.abandoned {
				b.WriteString(" (abandoned)")
			}
		}
	}
	return b.String()
}

// isBudgetError reports whether err is a budget's failure (a *BudgetError).
func isBudgetError(err error) bool {
	var be *snapsvc.BudgetError
	return errors.As(err, &be)
}
