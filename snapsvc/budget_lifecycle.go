package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/retry"
)

// The life of an operation's restart budget slots, decided in one place:
// a hold is the slots one operation holds, and moves through these states
// only (holdMoves says which move may follow which):
//
//	granted ──► fenced ──► acted ──► settling ──► ready ──► released
//	               ▲  │      │  ▲                   ▲
//	               └──┘      └──┴── fenced again before each attempt
//	granted, fenced, acted ──► released   nothing was done, or the change failed for good
//	granted, fenced ──► settling          an earlier request (or a Stop's, for its Start) may still act
//	acted ──► kept                        a Stop under StopsAndStarts: for the Start that follows
//	granted, fenced, acted ──► kept       a Start that took a Stop's slots failed: its services are still down
//	fenced, acted, settling, ready ──► abandoned   Close, or MaxHold not knowing the change's end
//	any state ──► lost                    the backend took a slot away
//
// A slot granted without the coordination service (no cluster yet, or
// fail open: its fence confirms without end, budget.Unbounded) walks the
// same path and sends its request like any other.
//
// The slot rule decides every exit: a hold is given back only once the
// operation's outcome is final and its services are ready again —
//
//   - nothing was done (never sent, refused, or given up before snapd
//     accepted anything), or the change failed for good (Error, Undone,
//     Hold): at once, nothing of it runs;
//   - the change is Done: once the readiness checks pass (then Settle), on
//     the caller's time and, past it, in the background;
//   - the change may still run, or the outcome is unknown: settling in the
//     background, following snapd's records until they show the change
//     ready (or show that the request made none), then the readiness
//     checks.
//
// And, whatever the verdict, never while a request written under the hold
// may still be carried out: a request whose answer was never read (lost,
// or cut off by the call's end) keeps the hold until snapd can no longer
// act on it, and the changes made since are followed too (quiet, in
// budget_settle.go). A Start that took the slots a Stop kept and failed
// keeps them: the services are still down.
//
// Nothing else ends a hold: not a wait's own error, not snapd being away
// longer than the policy's MaxUnreachable, not a look-up snapd refused. A
// hold that must end while its change may still run or its services may
// still be down — Close, or BudgetOptions.MaxHold while snapd's records
// cannot show the change's end (a "hold-expired" event) — is abandoned,
// never released: its slots are freed as a crashed holder's would be,
// once their lease and lock-delay have run out (budget.Abandoner). A
// clean exit is never less safe than a crash.

// holdState is where a hold is in its life.
type holdState int

const (
	holdGranted   holdState = iota // taken (or taken over from a Stop): nothing sent yet
	holdFenced                     // confirmed held; may act until sendBy
	holdActed                      // a request to act was written: snapd may have acted
	holdKept                       // a Stop's slots, kept for the Start that follows
	holdSettling                   // the outcome is not final: following snapd's records
	holdReady                      // the change ran its course; the services passed their checks
	holdReleased                   // given back
	holdLost                       // the backend took a slot away
	holdAbandoned                  // let go of as a crashed holder's: freed behind the lock-delay
)

var holdStateNames = [...]string{"granted", "fenced", "acted", "kept", "settling", "ready", "released", "lost", "abandoned"}

func (s holdState) String() string { return holdStateNames[s] }

// holdMoves is the lifecycle: the states each state may move to.
// Released, kept, lost and abandoned are final.
var holdMoves = map[holdState][]holdState{
	holdGranted:  {holdFenced, holdSettling, holdKept, holdReleased, holdLost, holdAbandoned},
	holdFenced:   {holdFenced, holdActed, holdSettling, holdKept, holdReleased, holdLost, holdAbandoned},
	holdActed:    {holdFenced, holdActed, holdSettling, holdReady, holdKept, holdReleased, holdLost, holdAbandoned},
	holdSettling: {holdReady, holdKept, holdReleased, holdLost, holdAbandoned},
	holdReady:    {holdReleased, holdLost, holdAbandoned},
}

// testHookBadMove is called when code asks a hold for a move the
// lifecycle does not allow (export_test.go makes it fail the test).
var testHookBadMove = func(from, to holdState) {}

// hold is the slots one operation holds, sorted by key.
type hold struct {
	b       *budgetRunner
	slots   []*sharedSlot
	stop    chan struct{}
	wg      sync.WaitGroup
	sendBy  time.Time     // the last fence's confirmations run out then (zero: no end)
	readied []*sharedSlot // slots whose ready count this hold raised

	mu    sync.Mutex
	state holdState
	// unanswered: the requests to act written under h whose answer was
	// never read; snapd may still carry them out (quiet).
	unanswered []unansweredRequest
	// change is the operation's change, once known; checked: its
	// services were checked on the caller's time (end).
	change  string
	checked bool
	// fromStop: the hold is of slots a Stop kept (a Start took them).
	fromStop bool
	// didAct: a request to act was written under h (or h joined a
	// change); outcome and reason judge how the act ended, for its
	// record (budget_record.go), written once (recorded).
	didAct   bool
	wrote    bool // this hold wrote a request to act (not a Stop's, not a joined one)
	joined   bool // it joined another's identical restart: that one's holder records the act
	outcome  budget.Outcome
	reason   string
	recorded bool
	actID    string       // the act's budget.Act.ID, one per hold
	spawn    [2]time.Time // the change's spawn and ready times, once read for the record
	// admitted: BudgetOptions.Admit admitted the operation.
	admitted bool
	// what is the operation the hold is for.
	what request
}

func newHold(b *budgetRunner) *hold {
	return &hold{b: b, stop: make(chan struct{}), actID: strconv.FormatUint(rand.Uint64(), 36)}
}

// setChange records the operation's change, once known.
func (h *hold) setChange(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.change = id
}

// changeID is the operation's change, "" while not known.
func (h *hold) changeID() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.change
}

// move moves h to state to, if the lifecycle allows it from where h is,
// and reports whether it did. A move the lifecycle does not allow is a
// defect: it is logged and refused.
func (h *hold) move(to holdState) bool {
	h.mu.Lock()
	from := h.state
	ok := slices.Contains(holdMoves[from], to)
	if ok {
		h.state = to
	}
	h.mu.Unlock()
	if !ok {
		testHookBadMove(from, to)
		h.b.c.logger.Error("snapsvc: restart budget hold asked to move against its lifecycle", "from", from, "to", to)
	}
	return ok
}

// current returns where h is.
func (h *hold) current() holdState {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state
}

// takeAll takes the slots of keys in order; on failure it gives back those
// it took.
func (b *budgetRunner) takeAll(ctx context.Context, keys []string) (*hold, error) {
	h := newHold(b)
	for _, k := range keys {
		s, err := b.take(ctx, k)
		if err != nil {
			h.release(ctx)
			return nil, err
		}
		h.slots = append(h.slots, s)
	}
	h.listenLost()
	return h, nil
}

// listenLost tells the caller at once (a "lost" event) when a slot is lost
// mid-operation.
func (h *hold) listenLost() {
	for _, s := range h.slots {
		h.wg.Add(1)
		// scoped: joined by stopListening.
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

// onLost calls f once any slot of h is lost, until stop is called.
func (h *hold) onLost(f func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range h.slots {
		wg.Add(1)
		// scoped: joined by stop.
		go func() {
			defer wg.Done()
			select {
			case <-s.slot.Lost():
				f()
			case <-done:
			}
		}()
	}
	return func() {
		close(done)
		wg.Wait()
	}
}

// ---- fenced, acted ----

// fence confirms every slot of h is still held, and may act now: first
// what is already known (Lost), then, for slots implementing
// BudgetFencer, with the coordination service. A lost slot is reported
// ("lost") and stops the operation (ErrSlotLost, not retryable); a fence
// that cannot tell stops it too ("fence-failed"). h.sendBy becomes the time
// the earliest of the confirmations runs out, counted from before each
// Fence was called: the request is written only before it (operation.try,
// snapd.WithSendBy), so a holder held up between its fence and its write
// (a stop signal, a slow machine) never acts on a confirmation that ran
// out. An unbounded confirmation (a slot granted without the coordination
// service) sets no send-by.
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
	h.move(holdFenced)
	return nil
}

// acted records that a request to act was written on h's confirmation:
// from now on snapd may have acted, and only the slot rule gives h back.
func (h *hold) acted() {
	h.mu.Lock()
	h.didAct, h.wrote = true, true
	h.mu.Unlock()
	h.move(holdActed)
}

// joinedAct records that the operation joined an identical restart of
// another (its change restarted the services under h too): h is acted
// on, and the act is the other's to record.
func (h *hold) joinedAct() {
	h.mu.Lock()
	h.didAct, h.joined = true, true
	h.mu.Unlock()
	h.move(holdActed)
}

// wroteRequest reports whether h wrote a request to act.
func (h *hold) wroteRequest() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wrote
}

// unansweredRequest is a request to act whose answer was never read.
type unansweredRequest struct {
	o      request   // what it asked
	sent   sent      // when it was written, and what the client had seen
	gaveUp time.Time // when the client stopped waiting for its answer
}

// noAnswer records that request o, written at s under h, got no answer
// the client could read by gaveUp (lost, cut, or cut off by the call's
// end): snapd may have acted on it, or may still (quiet).
func (h *hold) noAnswer(o request, s sent, gaveUp time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unanswered = append(h.unanswered, unansweredRequest{o: o, sent: s, gaveUp: gaveUp})
}

// takeUnanswered returns the requests of h that got no answer and forgets
// them.
func (h *hold) takeUnanswered() []unansweredRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	reqs := h.unanswered
	h.unanswered = nil
	return reqs
}

// mayStillAct reports whether a request written under h got no answer.
func (h *hold) mayStillAct() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.unanswered) > 0
}

// ---- ready ----

// ready waits until the services o names pass their checks, then settles.
// Each slot of the hold counts its readiness once, however often ready
// runs (again in the background when the call ended while settling).
func (h *hold) ready(ctx context.Context, o request) error {
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
	if st := h.current(); st == holdActed || st == holdSettling {
		h.move(holdReady)
	}
	h.judge(budget.OutcomeReady, "", "")
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

// keys returns the keys of h's slots, joined with ", ".
func (h *hold) keys() string {
	var ks []string
	for _, s := range h.slots {
		ks = append(ks, s.key)
	}
	return strings.Join(ks, ", ")
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

// ---- released ----

// stopListening ends the watch for lost slots.
func (h *hold) stopListening() {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	h.wg.Wait()
}

// release gives back every slot, in reverse order, and ends h (released,
// or lost when a slot was). It waits for the first attempt of each release
// only until ctx ends; the rest happens in the background.
func (h *hold) release(ctx context.Context) { h.letGo(ctx, false) }

// abandon lets go of every slot as a crashed holder would
// (budgetRunner.abandonNow), and ends h (abandoned, or lost when a slot
// was): its change may still run, or its services may still be down.
func (h *hold) abandon(ctx context.Context) { h.letGo(ctx, true) }

// letGo is release, or abandon. The act is recorded first (before the
// slots are free, so that a halt it writes holds the next holder back).
func (h *hold) letGo(ctx context.Context, abandon bool) {
	if len(h.slots) > 0 && !h.record(ctx, abandon) {
		// A failure whose record (and so its halt) could not be written:
		// the slots stay held until it is (budget_record.go).
		h.recordInBackground(abandon)
		return
	}
	switch st := h.current(); {
	case st == holdReleased || st == holdKept || st == holdLost || st == holdAbandoned:
	case h.lost() != nil:
		h.move(holdLost)
	case abandon:
		h.move(holdAbandoned)
	default:
		h.move(holdReleased)
	}
	h.stopListening()
	h.b.mu.Lock()
	for _, s := range h.readied {
		s.ready--
	}
	h.b.mu.Unlock()
	h.readied = nil
	var pending []<-chan struct{}
	for i := len(h.slots) - 1; i >= 0; i-- {
		if ch := h.b.letGo(ctx, h.slots[i], abandon); ch != nil {
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

// emitAll sends ev for every slot of h, with each slot's key, holder and
// hold time.
func (b *budgetRunner) emitAll(h *hold, ev BudgetEvent) {
	for _, s := range h.slots {
		e := ev
		e.Key, e.Holder, e.Held = s.key, s.slot.Holder(), b.held(s)
		b.emit(e)
	}
}
