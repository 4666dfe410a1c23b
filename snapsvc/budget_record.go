package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
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
// change says nothing new); a ready one replaces nothing but an empty
// judgement. change is the act's change when known.
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
// hold that acted has an act (a request to act was written, or it joined
// a change), and a judgement-less one that is abandoned records
// OutcomeAbandoned. A failure that halts its key is an event and a
// warning. Bounded by ReleaseTimeout; a record that fails is an event,
// never the operation's error.
func (h *hold) record(ctx context.Context, abandon bool) {
	o := h.what
	h.mu.Lock()
	acted, outcome, reason, change := h.didAct, h.outcome, h.reason, h.change
	h.mu.Unlock()
	if !acted || h.recorded || !slices.ContainsFunc(h.slots, func(s *sharedSlot) bool {
		_, ok := s.slot.(BudgetRecorder)
		return ok
	}) {
		return
	}
	if outcome == "" {
		if !abandon {
			return // nothing snapd did is known to have ended: no act to record
		}
		outcome = budget.OutcomeAbandoned
	}
	h.recorded = true
	b := h.b
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.opts.ReleaseTimeout)
	defer cancel()
	act := budget.Act{Machine: machineName(), Action: o.action, Services: slices.Clone(o.t.names),
		Change: change, Outcome: outcome, Reason: reason}
	if change != "" && b.c.ctl == nil { // snapctl cannot read changes
		cctx, ccancel := context.WithTimeout(rctx, 2*time.Second)
		if chg, err := b.c.Change(cctx, change); err == nil {
			act.Spawn = chg.SpawnTime
			if chg.ReadyTime != nil {
				act.Ready = *chg.ReadyTime
			}
		}
		ccancel()
	}
	for _, s := range h.slots {
		r, ok := s.slot.(BudgetRecorder)
		if !ok || s.slot.Err() != nil {
			continue
		}
		a := act
		a.Key, a.Holder, a.Waited, a.Held = s.key, s.slot.Holder(), s.waited, b.held(s)
		halt, err := r.Record(rctx, a)
		if err != nil {
			b.emit(BudgetEvent{Kind: BudgetRecordFailed, Key: s.key, Holder: a.Holder, Held: a.Held, Act: &a, Err: err})
			continue
		}
		b.emit(BudgetEvent{Kind: BudgetRecorded, Key: s.key, Holder: a.Holder, Held: a.Held, Act: &a})
		if halt != nil && a.Failed() {
			b.emit(BudgetEvent{Kind: BudgetHalted, Key: s.key, Holder: a.Holder, Held: a.Held, Act: &a, Halt: halt})
			b.c.logger.Warn("snapsvc: the restart failed and its budget key is halted: no machine restarts it until an operator resumes it",
				"key", s.key, "change", a.Change, "reason", a.Reason, "halt", halt.Reason)
		}
	}
}

// failureReason says why an operation's error failed its act.
func failureReason(err error) string {
	var ce *ChangeError
	if errors.As(err, &ce) {
		return fmt.Sprintf("change %s %s: %v", ce.ID, ce.Status, err)
	}
	return err.Error()
}

// machineName is the host's name, for a record of the act.
func machineName() string {
	n, err := os.Hostname()
	if err != nil {
		return ""
	}
	return n
}
