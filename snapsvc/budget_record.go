package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/retry"
)

// What a hold tells the fleet, beside its slots: before it acts, the
// application's admission check (BudgetOptions.Admit); once its outcome is
// final, a record of the act in the budget's history (budget.Recorder),
// which halts the key after failed acts. The record is written before the
// slots are given back, so the next machine's fence already reads the
// halt a failure wrote.

// admit asks BudgetOptions.Admit whether the operation o may act now,
// once per hold (its first attempt): on a refusal it keeps the slots and
// asks again with backoff until the check admits or ctx ends (an error
// wrapping ErrAdmissionRefused, nothing sent). It reports whether it
// waited, so that the caller fences again before it acts.
func (h *hold) admit(ctx context.Context, o request) (waited bool, err error) {
	b := h.b
	if b.opts.Admit == nil || h.admitted {
		return false, nil
	}
	a := Admission{Action: o.action, Services: slices.Clone(o.t.names)}
	for _, s := range h.slots {
		a.Keys = append(a.Keys, s.key)
	}
	pause := b.opts.AdmitRetry.Initial
	if pause <= 0 {
		pause = time.Second
	}
	most := b.opts.AdmitRetry.Max
	if most <= 0 {
		most = 15 * time.Second
	}
	most = max(most, pause)
	for {
		refusal := b.opts.Admit(ctx, a)
		if refusal == nil {
			h.admitted = true
			return a.Refusals > 0, nil
		}
		a.Refusals++
		b.emitAll(h, BudgetEvent{Kind: BudgetAdmissionRefused, Err: refusal})
		if err := retry.Sleep(ctx, b.c.clock, pause); err != nil {
			return true, &BudgetError{Key: h.keys(), Holders: h.holders(),
				Err: fmt.Errorf("%w %d times, the last: %v; nothing was sent (%w)", ErrAdmissionRefused, a.Refusals, refusal, ctxErr(ctx, "waiting for the admission check"))}
		}
		pause = min(2*pause, most)
	}
}

// holders returns the holders of h's slots.
func (h *hold) holders() []string {
	var hs []string
	for _, s := range h.slots {
		hs = append(hs, s.slot.Holder())
	}
	return hs
}

// judge sets how the hold's act ended, for its record: the first
// judgement of a failure stands (a later readiness check of a failed
// change says nothing new); any other replaces the one before. change is
// the act's change when known.
func (h *hold) judge(outcome budget.Outcome, reason, change string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.outcome == budget.OutcomeFailed {
		return
	}
	h.outcome, h.reason = outcome, reason
	if change != "" {
		h.change = change
	}
}

// record writes the hold's act in the history of each slot whose budget
// keeps one (budget.Recorder), before the slots are let go of: only a
// hold that acted has an act (it wrote a request to act, or took over the
// slots of a Stop that did; one that joined another's identical restart
// leaves the act to that one's holder), and a judgement-less one that is
// abandoned records OutcomeAbandoned. A slot lost meanwhile records too:
// the act happened. A failure that halts its key is an event and a
// warning. It reports false when a failed act could not be recorded on
// every slot (its halt may be unwritten): the caller must not let go of
// the slots yet (recordInBackground). Other records that fail are an
// event, never the operation's error. Each Record is bounded by
// ReleaseTimeout; the read of the change's times by a bound of its own.
func (h *hold) record(ctx context.Context, abandon bool) bool {
	o := h.what
	h.mu.Lock()
	acted, joined, outcome, reason, change := h.didAct, h.joined && !h.wrote, h.outcome, h.reason, h.change
	h.mu.Unlock()
	if !acted || joined || h.recorded || !slices.ContainsFunc(h.slots, func(s *sharedSlot) bool {
		_, ok := s.slot.(BudgetRecorder)
		return ok
	}) {
		return true
	}
	if outcome == "" {
		if !abandon {
			return true // nothing snapd did is known to have ended: no act to record
		}
		outcome = budget.OutcomeAbandoned
	}
	b := h.b
	if change != "" && b.c.ctl == nil && h.spawn[0].IsZero() { // snapctl cannot read changes
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		if chg, err := b.c.Change(cctx, change); err == nil {
			h.spawn[0] = chg.SpawnTime
			if chg.ReadyTime != nil {
				h.spawn[1] = *chg.ReadyTime
			}
		}
		ccancel()
	}
	act := budget.Act{ID: h.actID, Machine: machineName(), Action: o.action, Services: slices.Clone(o.t.names),
		Change: change, Spawn: h.spawn[0], Ready: h.spawn[1], Outcome: outcome, Reason: reason}
	ok := true
	for _, s := range h.slots {
		r, isRecorder := s.slot.(BudgetRecorder)
		if !isRecorder {
			continue
		}
		a := act
		a.Key, a.Holder, a.Waited, a.Held = s.key, s.slot.Holder(), s.waited, b.held(s)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.ReleaseTimeout)
		halt, err := r.Record(rctx, a)
		cancel()
		if err != nil {
			ok = ok && !a.Failed()
			b.emit(BudgetEvent{Kind: BudgetRecordFailed, Key: s.key, Holder: a.Holder, Held: a.Held, Act: &a, Err: err})
			continue
		}
		b.emit(BudgetEvent{Kind: BudgetRecorded, Key: s.key, Holder: a.Holder, Held: a.Held, Act: &a})
		if halt != nil && a.Failed() && halt.Holder == a.Holder && halt.Change == a.Change && slices.Equal(halt.Services, a.Services) {
			// This act's failure halted the key (a Record on a key
			// halted before returns that halt: no second event).
			b.emit(BudgetEvent{Kind: BudgetHalted, Key: s.key, Holder: a.Holder, Held: a.Held, Act: &a, Halt: halt})
			b.c.logger.Warn("snapsvc: the restart failed and its budget key is halted: no machine restarts it until an operator resumes it",
				"key", s.key, "change", a.Change, "reason", a.Reason, "halt", halt.Reason)
		}
	}
	h.recorded = ok
	return ok
}

// recordInBackground keeps h's slots while its failed act cannot be
// recorded (the budget's store unreachable past ReleaseTimeout): the
// record is tried again with backoff (the act's ID makes a repeat count
// once), and the slots are let go of once it is written. Close ends the
// tries: the slots are then abandoned (freed as a crashed holder's,
// behind their lease and lock-delay), with an error logged, since the
// halt may never be written.
func (h *hold) recordInBackground(abandon bool) {
	b := h.b
	b.emitAll(h, BudgetEvent{Kind: BudgetSettling, Err: errors.New("the failed act could not be recorded yet; the slots stay held until it is")})
	b.c.bg.run(func() {
		pause := time.Second
		for {
			if err := retry.Sleep(b.base, b.c.clock, pause); err != nil {
				b.c.logger.Error("snapsvc: a failed restart could not be recorded before the client closed; its budget slots are abandoned and the key may not halt",
					"keys", h.keys(), "change", h.changeID())
				h.recorded = true // nothing more to try: let go as a crash would
				h.letGo(context.Background(), true)
				return
			}
			if h.record(b.base, abandon) {
				h.letGo(context.Background(), abandon)
				return
			}
			pause = min(2*pause, 30*time.Second)
		}
	})
}

// failureReason says why an operation's error failed its act.
func failureReason(err error) string {
	var ce *ChangeError
	if errors.As(err, &ce) {
		return fmt.Sprintf("change %s %s: %v", ce.ID, ce.Status, err)
	}
	return err.Error()
}

// machineName is the host's name, for a record of the act, read once.
var machineName = sync.OnceValue(func() string {
	n, err := os.Hostname()
	if err != nil {
		return ""
	}
	return n
})
