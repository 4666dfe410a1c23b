package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/retry"
)

// The lifecycle of a budgeted operation, one function per step (the
// operation's phases: operation.go):
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
