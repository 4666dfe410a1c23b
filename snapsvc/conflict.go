package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// The conflict phase: someone else's change refused the attempt, and the
// operation waits it out. There are four ways to wait for a blocker, and
// the phase picks one as a change wait picks its waker (wakers.go), each
// able to hand over to the next when what it relies on fails:
//
//   - following: another process of the machine watches the snap; follow
//     what it sees, sending nothing (machinewait.go);
//   - rewrite: a first conflict where snapd's state file is watched; try
//     again at its next rewrite, without a request in between (most
//     blockers are service changes that end within milliseconds); not
//     woken within stateSafety, it hands over to one of the next two;
//   - blind: the blocker's end cannot be seen (the notices and the state
//     file unavailable, or the listing refused); retry on the blind
//     cadence (cadence.go);
//   - listed: list the blockers and wait for them (changewait.go); a
//     listing refused hands over to blind.
//
// Every one of them waits with the snaps' cross-process locks let go of
// (withoutFileLocks, lock.go).

// blockerWait is one way of waiting out a blocker (above).
type blockerWait int

const (
	waitFollowing blockerWait = iota
	waitRewrite
	waitBlind
	waitListed
)

// blockerWait picks the way attempt a's conflict ce is waited out; joined
// is set for waitFollowing (machinewait.go: when the operation began to
// follow, on the machine's clock).
func (op *operation) blockerWait(a attempt, ce *retry.ConflictError) (w blockerWait, joined int64) {
	switch joined, follow := op.watchOrFollow(ce); {
	case follow:
		return waitFollowing, joined
	case a.watched && !op.optimistic:
		return waitRewrite, 0
	case op.blind():
		return waitBlind, 0
	}
	return waitListed, 0
}

// conflict is the conflict phase (above): it waits out the change that
// refused attempt a and says what the operation does next.
func (op *operation) conflict(a attempt) (next, error) {
	if err := op.aboutToWait(); err != nil {
		return 0, err
	}
	ce, _ := retry.AsConflict(a.err)
	op.res.Refused++
	op.countConflict(ce)
	op.k.last = ce
	w, joined := op.blockerWait(a, ce)
	if w == waitFollowing {
		return op.follow(ce, joined)
	}
	if w == waitRewrite {
		woke, err := op.awaitRewrite(a, ce)
		if err != nil || woke {
			return tryFresh, err
		}
		if w = waitListed; op.blind() {
			w = waitBlind
		}
	}
	op.optimistic = false
	if w == waitBlind {
		return tryAgain, op.retryBlind(ce, a.sentAt)
	}
	return op.waitListed(a, ce)
}

// countConflict counts ce in the result (Result.Conflicts) unless it is
// the conflict already being waited out: one per blocking change, not one
// per refusal. A refusal continues the conflict held when its blocker was
// not seen to end since (a blind poll, a retry at a state file rewrite, a
// blocker not visible) and it names the same snap and change kind (and
// the same change, where both are known); the waits that see a blocker
// end clear held.
func (op *operation) countConflict(ce *retry.ConflictError) {
	if h := op.held; h != nil && ce != nil && h.Snap == ce.Snap && h.AllSnaps == ce.AllSnaps && h.ChangeKind == ce.ChangeKind &&
		(h.ChangeID == "" || ce.ChangeID == "" || h.ChangeID == ce.ChangeID) {
		return
	}
	op.res.Conflicts++
	op.held = ce
}

// reportConflict emits ev, an EventConflict, and reports whether the
// operation goes on to wait the blocker out: an observer may end the call
// at the event (snapservices' WithGiveUp(0) does), and a wait that will
// not happen is not logged as one.
func (op *operation) reportConflict(ev Event) bool {
	op.c.events.emit(ev)
	if op.k.ctx.Err() != nil {
		op.k.log.Debug("conflict; the call ended there, before waiting", "attempt", op.res.Attempts, "cause", context.Cause(op.k.ctx))
		return false
	}
	return true
}

// awaitRewrite is the rewrite wait: it reports the conflict, then waits,
// for at most stateSafety and within the call's bounds, for snapd's state
// file to be rewritten after the attempt's mark. It reports whether a
// rewrite came.
func (op *operation) awaitRewrite(a attempt, ce *retry.ConflictError) (bool, error) {
	c, k := op.c, op.k
	op.optimistic = true
	ev := k.event(EventConflict)
	ev.Err = ce
	if !op.reportConflict(ev) {
		return false, interrupted(k.ctx, ce)
	}
	k.log.Info("conflict; trying again when snapd's state changes", "kind", ce.ChangeKind, "attempt", op.res.Attempts)
	var woke bool
	err := op.withoutFileLocks(func() error {
		d := stateSafety
		if left, ok := k.left(); ok {
			d = min(d, left)
		}
		var err error
		woke, err = c.state.waitFrom(k.ctx, d, a.mark)
		if k.ctx.Err() != nil {
			return interrupted(k.ctx, k.last)
		}
		woke = woke && err == nil // a broken watch: handle the conflict by listing
		return nil
	})
	return woke, err
}

// waitListed is the listed wait: it finds the blockers and waits for them;
// a listing refused hands over to the blind wait, and a blocker it cannot
// see is retried at once the first time (it may have ended between the
// refusal and the listing), after a pause later.
func (op *operation) waitListed(a attempt, ce *retry.ConflictError) (next, error) {
	c, k := op.c, op.k
	// Where notices are absent (or not known yet) the wait may poll: the
	// state watch is marked before the listing, so the wait can take the
	// listing for its first read.
	var mark uint64
	watched := c.view.notices() != noticesYes && c.state.open()
	if watched {
		mark = c.state.mark()
	}
	listedAt, err := op.holdToCadence(a.sentAt)
	if err != nil {
		return 0, err
	}
	ids, ferr := findBlockers(k, op.o.t.snaps, ce, op.skip)
	if ferr != nil {
		k.log.Debug("cannot list changes to find the blocker", "error", ferr)
		if c.view.noteListing(ferr, c.mode); len(ids) == 0 && op.blind() {
			if _, ok := op.cadence().begun(); !ok {
				op.cadence().note(listedAt) // the refused listing counts as a request of the wait
			}
			return tryAgain, op.retryBlind(ce, a.sentAt)
		}
	}
	if len(ids) > 0 {
		ce.ChangeID = ids[0]
	}
	ev := k.event(EventConflict)
	ev.Blockers, ev.Err = ids, ce
	if !op.reportConflict(ev) {
		return 0, interrupted(k.ctx, ce)
	}
	if len(ids) > 0 {
		op.unseen = 0
		op.publishBlockers(ids)
		for _, id := range ids {
			op.known[id] = true
		}
		k.log.Info("conflict; waiting for blocking changes", "changes", ids, "kind", ce.ChangeKind, "attempt", op.res.Attempts)
		op.res.WaitedFor = appendNew(op.res.WaitedFor, ids...)
		if err := op.waitOut(ids, ce, watched, mark); err != nil {
			return 0, err
		}
		op.cadence().reset()
		op.held = nil
		return tryFresh, nil // the blocker is done: try again at once
	}
	op.unseen++
	if op.unseen == 1 && ferr == nil {
		// The blocker finished between our request and the listing: try
		// again straight away.
		op.held = nil
		k.log.Info("conflict; blocker already gone, retrying", "kind", ce.ChangeKind, "attempt", op.res.Attempts)
		return tryAgain, nil
	}
	k.flog.log(k.log, "in conflict with an unseen blocker", "conflict; blocker not visible, backing off", "kind", ce.ChangeKind, "attempt", op.res.Attempts)
	return tryPaused, nil
}

// holdToCadence keeps a listing made during a blind wait (one that turned to
// listing after its first seconds) to the wait's request budget, counting
// the refusal that led to it. It returns when the listing is sent.
func (op *operation) holdToCadence(refusedSentAt time.Time) (time.Time, error) {
	now := op.c.clock.Now()
	if _, ok := op.cadence().begun(); !ok {
		return now, nil
	}
	op.cadence().note(refusedSentAt)
	if d := op.cadence().delay(now); d > 0 {
		if err := op.k.sleep(d); err != nil {
			return now, err
		}
		now = op.c.clock.Now()
	}
	op.cadence().note(now)
	return now, nil
}

// waitOut waits for blocking changes of others, within the call's bounds
// (without the cross-process locks). A blocker that sits in Wait (for a
// reboot) cannot be waited out.
func (op *operation) waitOut(ids []string, ce *retry.ConflictError, watched bool, mark uint64) error {
	return op.withoutFileLocks(func() error { return op.waitBlockers(ids, ce, watched, mark) })
}

// waitBlockers is waitOut's wait.
func (op *operation) waitBlockers(ids []string, ce *retry.ConflictError, watched bool, mark uint64) error {
	wo := waitOpts{stallOnWait: true, listed: true, listedWatched: watched, listedMark: mark}
	if since, ok := op.cadence().begun(); ok { // a blind wait turned to listing: poll at its pace
		wo.since, wo.cadence = since, op.cad
	}
	_, err := waitChanges(op.k, ids, wo)
	var stalled *ChangeError
	var gaveUp *gaveUpError
	switch {
	case errors.As(err, &stalled):
		ce.ChangeID = stalled.ID
		return &gaveUpError{reason: fmt.Sprintf("blocking change %s (%s) is waiting, for a reboot or a manual step", stalled.ID, stalled.Kind), last: ce}
	case err != nil && op.k.ctx.Err() != nil:
		return interrupted(op.k.ctx, ce)
	case errors.As(err, &gaveUp):
		return &gaveUpError{reason: gaveUp.reason, last: ce}
	}
	return err
}

// blind reports whether a conflict must be waited out blind (see above):
// neither notices nor the state file can show the blocker's end, and in
// REST mode only within the first cadenceSteady of the wait (then the
// blockers are listed and followed).
func (op *operation) blind() bool {
	c := op.c
	if c.view.listingRefused() {
		return true
	}
	if c.view.notices() == noticesYes || c.state.open() {
		return false
	}
	// Until snapd has said whether it has notices for us, list (and
	// learn); after that, polling the blockers in the first seconds does
	// no better than the cadence and pays a read per poll on top.
	return c.view.notices() == noticesNo && op.cadence().steady()
}

// retryBlind waits out a conflict blind: it reports the conflict and
// pauses until the cadence's next retry, within the call's bounds
// (without the cross-process locks). Its error is final for the operation.
func (op *operation) retryBlind(ce *retry.ConflictError, sentAt time.Time) error {
	k := op.k
	first := op.cadence().n == 0
	ev := k.event(EventConflict)
	ev.Err = ce
	if !op.reportConflict(ev) {
		return interrupted(k.ctx, ce)
	}
	if first {
		k.log.Info("conflict; the blocker cannot be followed here, retrying on the blind cadence", "kind", ce.ChangeKind, "attempt", op.res.Attempts)
	} else {
		k.log.Debug("conflict; retrying on the blind cadence", "kind", ce.ChangeKind, "attempt", op.res.Attempts)
	}
	d := op.cadence().next(sentAt)
	return op.withoutFileLocks(func() error {
		if err := k.sleep(d); err != nil {
			if errors.As(err, new(*gaveUpError)) {
				return err
			}
			return interrupted(k.ctx, ce)
		}
		return nil
	})
}
