package snapsvc

import (
	"errors"

	"github.com/snapsvc/snapsvc/budget"
)

// The exit of a hold (budget_lifecycle.go's lifecycle): the slot rule
// applied to an operation's outcome, for a synchronous operation (end)
// and an asynchronous one (endAsync), and the act's judgement for its
// record (budget_record.go).

// ---- the exit: the slot rule ----

// holdVerdict sorts an operation's outcome for the slot rule.
type holdVerdict int

const (
	verdictDone        holdVerdict = iota // the change is Done
	verdictNothingDone                    // nothing was done: no change made, none can be
	verdictFailed                         // the change failed for good
	verdictRunning                        // a change was made and may still run
	verdictUnknown                        // snapd may have made a change, or may still make one
)

func holdVerdictOf(err error) holdVerdict {
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

// end is the release phase of a synchronous operation that took h, on its
// call k: res and err are the operation's outcome, which it returns,
// joined with what the readiness checks met. The caller's time bounds only
// the wait for readiness here (Policy.ChangeWait's call); past it, and for
// an outcome that is not final, h settles in the background.
func (h *hold) end(k *call, o request, res *Result, err error) error {
	c := h.b.c
	v := holdVerdictOf(err)
	if err == nil && res != nil && res.NoUpdate {
		v = verdictNothingDone // a refresh with no update: snapd made no change
	}
	switch {
	case (v == verdictNothingDone || v == verdictFailed) && h.mayStillAct():
		k.log.Info("a request to act got no answer and snapd may still carry it out; the restart budget slots stay held until it cannot", "error", err)
		h.settleInBackground(k, o, err, nil)
		return err
	case (v == verdictNothingDone || v == verdictFailed) && h.fromStop:
		k.log.Info("the start failed: its services are still down, and the restart budget slots their stop kept stay kept", "error", err)
		if v == verdictFailed || h.wroteRequest() {
			// A start snapd refused or never got (a fence that could not
			// tell, an admission refusal, the call's end) is no failed
			// act: the kept slots wait for the next Start.
			h.judge(budget.OutcomeFailed, "the start after a stop failed, its services are still down: "+failureReason(err), changeIDOf(err))
		}
		h.b.keep(k.ctx, h)
		return err
	case v == verdictFailed:
		h.judge(budget.OutcomeFailed, failureReason(err), changeIDOf(err))
		h.release(k.ctx)
		return err
	case v == verdictNothingDone:
		h.release(k.ctx)
		return err
	case o.action == "stop":
		h.b.keep(k.ctx, h)
		return err
	case v == verdictRunning || v == verdictUnknown:
		k.log.Info("the operation's outcome is not final; its restart budget slots stay held until snapd shows its change ready and its services are ready", "error", err)
		h.settleInBackground(k, o, err, nil)
		return err
	}
	rk := k.ownChange()
	h.setChange(res.ChangeID)
	rerr := h.ready(rk.ctx, o)
	notReady := rerr // the services' checks failed (judged even when a slot was lost meanwhile)
	if rerr != nil && rk.ctx.Err() != nil {
		k.log.Info("services not ready within the call's time; the restart budget slots stay held until they are", "error", rerr)
		h.settleInBackground(k, o, nil, nil)
		return c.opError(o, res.ChangeID, res.Attempts, rerr)
	}
	if rerr == nil {
		// A slot lost while the change ran: the services were acted on.
		var be *BudgetError
		if rerr = h.lost(); errors.As(rerr, &be) {
			be.ChangeDone = true
		}
	}
	if h.lost() == nil && h.mayStillAct() {
		// The change was found, not named by snapd's answer: it may be
		// someone else's identical one, and the request's own may come.
		k.log.Info("a request to act got no answer and snapd may still carry it out; the restart budget slots stay held until it cannot")
		h.checked = true
		if notReady != nil {
			h.judge(budget.OutcomeFailed, "not ready after the change: "+notReady.Error(), res.ChangeID)
		}
		h.settleInBackground(k, o, nil, nil)
		if rerr != nil {
			return c.opError(o, res.ChangeID, res.Attempts, rerr)
		}
		return nil
	}
	if notReady != nil {
		h.judge(budget.OutcomeFailed, "not ready after the change: "+notReady.Error(), res.ChangeID)
	}
	h.release(rk.ctx)
	if rerr != nil {
		return c.opError(o, res.ChangeID, res.Attempts, rerr)
	}
	return nil
}

// endAsync is the release phase of an asynchronous operation that snapd
// accepted (res; done says its outcome is final): a Stop keeps its slots
// for the Start that follows; anything else settles in the background, and
// the Operation's Wait learns how it ended.
func (h *hold) endAsync(k *call, op *Operation, done bool) {
	o, res := op.op, op.result
	switch {
	case o.action == "stop":
		h.b.keep(k.ctx, h)
		return
	case res.NoUpdate && !h.mayStillAct():
		h.release(k.ctx) // a refresh with no update: snapd made no change
		return
	}
	a := &asyncHold{done: make(chan struct{})}
	op.budget = a
	var err error
	if !done && res.ChangeID != "" {
		err = h.b.c.opError(o, res.ChangeID, res.Attempts, errChangeRunning)
	}
	h.settleInBackground(k, o, err, a)
}

// errChangeRunning is the outcome of an asynchronous operation whose
// change snapd accepted and may still run.
var errChangeRunning = errors.New("the change may still run")
