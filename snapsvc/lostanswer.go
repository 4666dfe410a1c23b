package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// lost handles a request whose answer was lost: it adopts the change the
// request made, settles the outcome from the services' state, or reports
// (tryPaused) that the request made no change and may be sent again.
func (op *operation) lost(a attempt, wait bool) (*Result, bool, next, error) {
	c, k := op.c, op.k
	ev := k.event(EventAnswerLost)
	ev.Err = a.err
	c.events.emit(ev)
	id, settled, err := op.resolveLost(a.sent)
	switch {
	case err != nil:
		res, done, err := op.fail("", err)
		return res, done, 0, err
	case settled:
		k.log.Info("outcome unknown; the services reached the state asked for", "attempt", op.res.Attempts)
		op.res.Status = snapd.StatusDone
		return op.res, true, 0, nil
	case id == "":
		k.log.Info("the request made no change; sending it again", "attempt", op.res.Attempts, "error", k.last)
		return nil, false, tryPaused, nil
	}
	k.log.Info("request's answer was lost; adopting the change it made", "change", id, "attempt", op.res.Attempts)
	if op.o.enable || op.o.disable {
		// Enable and disable leave no trace in the change: a foreign plain
		// start looks exactly like our start --enable. Only the services'
		// state after the change tells them apart.
		ok, svcs, err := op.adoptedMatches(id)
		if err != nil {
			res, done, err := op.fail(id, err)
			return res, done, 0, err
		}
		if !ok {
			k.log.Info("the change found was not this request's (the services are not "+map[bool]string{true: "enabled", false: "disabled"}[op.o.enable]+"); sending it again", "change", id, "services", svcs)
			c.snaps.unclaim(op.o, id)
			op.known[id] = true
			return nil, false, tryPaused, nil
		}
		c.interval.record(op.o)
		op.res.ChangeID, op.res.Status = id, snapd.StatusDone
		return op.res, true, 0, nil
	}
	c.interval.record(op.o)
	op.res.ChangeID = id
	res, done, err := op.adopted(id, wait)
	return res, done, 0, err
}

// resolveLost finds out whether a request whose outcome is unknown made a
// change. It returns the change's id, or "" when the request made none (so
// sending it again is safe). A connection can break while snapd is still
// handling the request, before it has made the change, so one empty
// look-up is not proof: only a second one, a pause later, is. It never
// sends the action again itself: while the lookup fails it retries the
// lookup within the call's bounds. When snapd refuses the lookup (snapctl
// without snap-refresh-observe), a start or stop is settled by watching
// the services reach the state asked for ("snapctl services" needs no
// interface); a restart cannot be told from the state, so it ends with
// ErrOutcomeUnknown rather than run twice. Any other way it ends before it
// knows is ErrOutcomeUnknown too, never a retryable error.
func (op *operation) resolveLost(st sent) (id string, settled bool, err error) {
	k := op.k
	unknown := func(reason string, err error) error { return op.unknownOutcome(reason, err, st) }
	const what = "looking for the change of a request whose answer was lost"
	confirming := false
	for {
		id, err := findOpChange(k, op.o, st, time.Time{}, op.known)
		switch {
		case err == nil && (id != "" || confirming):
			return id, false, nil
		case err == nil:
			// snapd may not have handled the request yet: it carries on
			// with a request whose connection broke, and its handler
			// may be waiting for the state lock. Look again a settling
			// pause later, however short the policy's pauses.
			k.log.Debug("no change for the request whose answer was lost yet; looking again before sending it again")
			confirming = true
			if perr := k.sleep(lostAnswerSettle); perr != nil {
				return "", false, unknown(what, perr)
			}
			continue
		case isForbidden(err) && op.replay != nil:
			op.c.view.noteListing(err, op.c.mode) // the replay's verdict reads it (replayMayPass)
			return op.replayUnlisted()
		case isForbidden(err):
			if op.o.action != "start" && op.o.action != "stop" {
				// A restart or a refresh leaves no state to tell it by.
				return "", false, &outcomeUnknownError{reason: "the " + op.o.action + " may have been carried out, and snapd does not let this client list changes to find out (connect snap-refresh-observe)", last: op.lastAct(), sent: st, known: maps.Clone(op.known)}
			}
			return "", true, op.awaitState()
		case k.ctx.Err() == nil && readRefused(err):
			return "", false, &outcomeUnknownError{reason: "cannot look up the change of a request whose answer was lost (" + err.Error() + ")", last: op.lastAct(), sent: st, known: maps.Clone(op.known)}
		default:
			k.log.Debug("cannot look for the change of a request whose answer was lost", "error", err)
		}
		if k.ctx.Err() != nil {
			return "", false, unknown(what, nil)
		}
		if perr := k.pause(err); perr != nil {
			return "", false, unknown(what, perr)
		}
	}
}

// replayUnlisted is resolveLost for a replay where snapd lets the client
// list no change (snapctl without snap-refresh-observe): no process waits
// for the request any more, so a start or a stop is settled by the
// services' state after a settling pause, and sent again where it is not
// reached (both leave the services as they are if they already are);
// a restart cannot be told from the state, and its outcome stays unknown.
func (op *operation) replayUnlisted() (id string, settled bool, err error) {
	k := op.k
	if op.o.action == "restart" {
		return "", false, &outcomeUnknownError{reason: "the restart's process may have sent it, and snapd does not let this client list changes to find out (connect snap-refresh-observe)", last: errCrashed}
	}
	if err := k.sleep(lostAnswerSettle); err != nil {
		return "", false, op.unknownOutcome("waiting for a request whose process ended to reach snapd", err, sent{})
	}
	svcs, err := k.services(op.o.t.names)
	if err != nil {
		return "", false, &outcomeUnknownError{reason: "cannot read the services' state to tell whether the request was carried out", last: err}
	}
	return "", op.o.reached(svcs), nil
}

// unknownOutcome is the end of a call, for err (the call's bound, or its
// context), while it was finding out what its request to act did (what):
// ErrOutcomeUnknown, with the request's last failure, and st, when set,
// the request whose outcome is unknown.
func (op *operation) unknownOutcome(what string, err error, st sent) error {
	if g := (*gaveUpError)(nil); errors.As(err, &g) {
		return &outcomeUnknownError{reason: g.reason + " " + what, last: op.lastAct(), sent: st, known: maps.Clone(op.known)}
	}
	return &outcomeUnknownError{reason: "interrupted " + what, last: interrupted(op.k.ctx, op.lastAct()), sent: st}
}

// lastAct is the failure of the last request to act (the reads since
// then, the look-ups, have failures of their own).
func (op *operation) lastAct() error {
	if op.actErr != nil {
		return op.actErr
	}
	return ErrOutcomeUnknown
}

// awaitState waits, within the call's bounds, until the services the
// operation names are in the state it asks for.
func (op *operation) awaitState() error {
	k := op.k
	const what = "waiting for the services to reach the state asked for"
	for {
		svcs, err := k.services(op.o.t.names)
		if err == nil && op.o.reached(svcs) {
			return nil
		}
		if err != nil {
			if k.ctx.Err() == nil && readRefused(err) {
				return &outcomeUnknownError{reason: "cannot read the services' state to tell whether the request was carried out", last: err}
			}
			k.log.Debug("cannot read service state", "error", err)
		}
		if perr := k.sleep(k.rt.conflictPause()); perr != nil {
			return op.unknownOutcome(what, perr, sent{})
		}
	}
}

// adoptedMatches waits for change id, found for a start --enable or stop
// --disable whose answer was lost, and reports whether it was the
// request's: the services are now enabled (disabled) as the request asks,
// or another change has touched the snap since, so the state cannot tell.
// Only the startup is read: whether they run is the change's own outcome,
// and a foreign change (a restart, say) may be moving them at this moment.
func (op *operation) adoptedMatches(id string) (bool, []Service, error) {
	chg, err := waitChange(op.k, id, waitOpts{})
	if err != nil {
		return false, nil, adoptedWaitError(id, err)
	}
	svcs, err := op.k.services(op.o.t.names)
	if err != nil {
		return false, nil, &outcomeUnknownError{reason: fmt.Sprintf("change %s is done but the services' state cannot be read to tell whether it was this request's", id), last: err}
	}
	if op.o.flagsApplied(svcs) {
		return true, svcs, nil
	}
	// Not enabled (disabled) as asked: the change was not ours — unless
	// another change touched the snap since, which may have changed the
	// startup again; then the state says nothing and the change found
	// stands.
	later, err := op.touchedSince(chg)
	return later || err != nil, svcs, nil
}

// touchedSince reports whether a change other than chg, made after it (a
// higher id: snapd numbers its changes in order, where their stamps follow
// a wall clock that may step), touches one of the operation's snaps.
func (op *operation) touchedSince(chg *snapd.Change) (bool, error) {
	k, snaps := op.k, op.o.t.snaps
	chgs, err := k.listOnce(snapd.SelectAll)
	if err != nil {
		return false, err
	}
	for i := range chgs {
		other := &chgs[i]
		if !lessID(chg.ID, other.ID) {
			continue
		}
		for _, s := range snaps {
			if touches(other, s, summaryPattern(s)) {
				return true, nil
			}
		}
	}
	return false, nil
}

// interruptedAt ends an operation whose call's time (its context, or the
// policy's) ran out, or was about to, during attempt a. If snapd's answer
// was pending, the request may have made a change, or snapd may still make
// it: what is left of the call's time (the look-up reserve) goes to
// looking the change up. Found, the error names it (not retryable:
// retrying would act twice) and the next operation on the snaps waits for
// it; otherwise the outcome is unknown (ErrOutcomeUnknown) and the look-up
// goes on in the background, bounded by interruptGrace and ended by Close,
// never on the caller's time.
func (op *operation) interruptedAt(a attempt) (*Result, bool, error) {
	c, k, o := op.c, op.k, op.o
	cause := &interruptedError{ctx: deadlineCause(k.ctx), last: a.err}
	if a.step != lookUp {
		return op.fail("", cause)
	}
	if k.ctx.Err() == nil {
		id, err := findOpChange(k, o, a.sent, time.Time{}, op.known)
		if err == nil && id != "" {
			c.interval.record(o)
			c.snaps.addPending(o, id)
			k.log.Info("the call's time ran out while snapd's answer was pending; the request made a change", "change", id)
			return op.fail(id, &cutOffChangeError{id: id, ctx: cause.ctx})
		}
	}
	known, log := maps.Clone(op.known), k.log
	found := make(chan lookupResult, 1)
	started := c.bg.do(interruptGrace, func(bctx context.Context) {
		defer close(found)
		bk := c.newCall(bctx, callWait, o.action, o.t.names)
		defer bk.end()
		res := lookFor(bk, o, a.sent, known)
		if res.id != "" {
			c.interval.record(o)
			c.snaps.addPending(o, res.id)
			log.Info("a request cut off before its answer made a change; the next operation waits for it", "change", res.id)
		} else {
			log.Debug("no change found for a request cut off before its answer", "within", interruptGrace, "listed", res.listed, "refused", res.refused)
		}
		found <- res
	})
	if !started {
		close(found)
	}
	return op.fail("", &outcomeUnknownError{reason: "ended while snapd's answer was pending; snapd may have acted on the request, or may still act on it", last: cause, sent: a.sent, known: known, found: found})
}

// lookupResult is what a look-up for the change of a request whose answer
// was lost found.
type lookupResult struct {
	id string // the change, "" when none was found
	// listed: the last listing answered, so "" means the request had made
	// no change by then.
	listed bool
	// refused: snapd does not let this client list its changes (or the
	// listing fails for good): nothing can be found, and "" says nothing.
	refused bool
}

// lookFor looks, until k's context ends (interruptGrace, in the
// background), for the change of request o sent at st: snapd carries on
// with a request whose client left, and a handler stuck behind its state
// lock may make the change late.
func lookFor(k *call, o request, st sent, known map[string]bool) lookupResult {
	var res lookupResult
	for {
		id, err := findOpChange(k, o, st, time.Time{}, known)
		switch {
		case err == nil && id != "":
			return lookupResult{id: id, listed: true}
		case err == nil:
			res.listed = true
		case readRefused(err):
			return lookupResult{refused: true}
		default:
			res.listed = false // a failure that may pass: look again within the grace
		}
		if k.sleep(lostAnswerSettle) != nil {
			return res
		}
	}
}

// adopted finishes an operation whose change was found after its answer
// was lost.
func (op *operation) adopted(id string, wait bool) (*Result, bool, error) {
	wo := waitOpts{found: true}
	if op.c.mode == ModeSnapctl {
		chg, err := waitChange(op.k.ownChange(), id, wo)
		if err != nil {
			return op.fail(id, adoptedWaitError(id, err))
		}
		op.res.Status = chg.Status
		return op.res, true, nil
	}
	return op.c.finish(op.k, op.o, op.res, wait, wo)
}
