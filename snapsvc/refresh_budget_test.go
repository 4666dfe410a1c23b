package snapsvc_test

// queueBudget: the in-process restart budget of the refresh tests, shared
// by every machine of a test as the coordination service is: Max slots per
// key, waiters served first come first served, a history that halts a key
// after its first failed act (budget.FailuresAfter, threshold 1, as every
// backend's default), fences that refuse while the key is halted, and
// slots that can be abandoned. It is the whole-path budget of
// testsupport/budgetcontract in miniature, with no backend underneath.

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/snapsvc"
)

type queueBudget struct {
	max int

	mu        sync.Mutex
	held      map[string][]*queueSlot
	queue     map[string][]chan struct{} // waiters, first come first served
	acts      []budget.Act
	failures  map[string]int
	halts     map[string]*budget.Halt
	abandoned []string // holders whose slots were abandoned
}

func newQueueBudget(max int) *queueBudget {
	return &queueBudget{max: max, held: map[string][]*queueSlot{}, queue: map[string][]chan struct{}{},
		failures: map[string]int{}, halts: map[string]*budget.Halt{}}
}

// budget returns the budget as one machine sees it: its slots name holder.
func (b *queueBudget) machine(holder string) snapsvc.RestartBudget {
	return queueMachine{b: b, holder: holder}
}

type queueMachine struct {
	b      *queueBudget
	holder string
}

func (m queueMachine) Acquire(ctx context.Context, key string, progress func(snapsvc.BudgetWait)) (snapsvc.BudgetSlot, error) {
	b := m.b
	b.mu.Lock()
	var turn chan struct{}
	for len(b.held[key]) >= b.max || (len(b.queue[key]) > 0 && b.queue[key][0] != turn) {
		if turn == nil {
			turn = make(chan struct{}, 1)
			b.queue[key] = append(b.queue[key], turn)
		}
		if progress != nil {
			var holders []string
			for _, s := range b.held[key] {
				holders = append(holders, s.holder)
			}
			progress(snapsvc.BudgetWait{Key: key, Holders: holders, Ahead: slices.Index(b.queue[key], turn), Max: b.max})
		}
		b.mu.Unlock()
		select {
		case <-turn:
		case <-ctx.Done():
			b.mu.Lock()
			b.leaveQueue(key, turn)
			b.mu.Unlock()
			return nil, context.Cause(ctx)
		}
		b.mu.Lock()
	}
	if turn != nil {
		b.leaveQueue(key, turn)
	}
	s := &queueSlot{b: b, key: key, holder: m.holder, lost: make(chan struct{})}
	b.held[key] = append(b.held[key], s)
	b.mu.Unlock()
	return s, nil
}

// leaveQueue removes turn from key's queue and wakes the next waiter.
func (b *queueBudget) leaveQueue(key string, turn chan struct{}) {
	b.queue[key] = slices.DeleteFunc(b.queue[key], func(c chan struct{}) bool { return c == turn })
	b.wakeLocked(key)
}

func (b *queueBudget) wakeLocked(key string) {
	if q := b.queue[key]; len(q) > 0 && len(b.held[key]) < b.max {
		select {
		case q[0] <- struct{}{}:
		default:
		}
	}
}

func (b *queueBudget) free(s *queueSlot) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held[s.key] = slices.DeleteFunc(b.held[s.key], func(x *queueSlot) bool { return x == s })
	b.wakeLocked(s.key)
}

// history returns the acts recorded, in order.
func (b *queueBudget) history() []budget.Act {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.acts)
}

// halted returns key's halt, or nil.
func (b *queueBudget) halted(key string) *budget.Halt {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.halts[key]
}

// holding returns how many slots of key are held.
func (b *queueBudget) holding(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.held[key])
}

type queueSlot struct {
	b           *queueBudget
	key, holder string
	lost        chan struct{}
	once        sync.Once
}

func (s *queueSlot) Key() string           { return s.key }
func (s *queueSlot) Holder() string        { return s.holder }
func (s *queueSlot) Lost() <-chan struct{} { return s.lost }
func (s *queueSlot) Err() error            { return nil }

func (s *queueSlot) Release(context.Context) error {
	s.once.Do(func() { s.b.free(s) })
	return nil
}

// Abandon frees the slot at once: the test's lease and lock-delay are
// zero. It is recorded.
func (s *queueSlot) Abandon() {
	s.once.Do(func() {
		s.b.mu.Lock()
		s.b.abandoned = append(s.b.abandoned, s.holder)
		s.b.mu.Unlock()
		s.b.free(s)
	})
}

func (s *queueSlot) Fence(context.Context) (budget.Validity, error) {
	if h := s.b.halted(s.key); h != nil {
		return budget.Validity{}, fmt.Errorf("%w: %w: key %s halted after %s's act", budget.ErrPaused, budget.ErrHalted, s.key, h.Holder)
	}
	return budget.ValidFor(1 << 40), nil
}

func (s *queueSlot) MarkReady(context.Context) error { return nil }

func (s *queueSlot) Record(_ context.Context, act budget.Act) (*budget.Halt, error) {
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.acts = append(b.acts, act)
	after, halts := budget.FailuresAfter(b.failures[act.Key], act, budget.DefaultHaltAfter)
	b.failures[act.Key] = after
	if halts && b.halts[act.Key] == nil {
		b.halts[act.Key] = &budget.Halt{Key: act.Key, Machine: act.Machine, Holder: act.Holder, Services: act.Services,
			Change: act.Change, Reason: act.Reason, Failures: after}
	}
	return b.halts[act.Key], nil
}
