package snapsvc

import (
	"errors"
	"fmt"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// conflict waits out the change that refused the attempt: at the state
// file's next rewrite for a first conflict (most blockers are service
// changes that end within milliseconds), blind where the blocker's end
// cannot be seen (cadence.go), else by finding the blockers and waiting
// for them.
func (op *operation) conflict(a attempt) (next, error) {
	c, k := op.c, op.k
	op.res.Conflicts++
	ce, _ := retry.AsConflict(a.err)
	k.last = ce
	if joined, follow := op.watchOrFollow(ce); follow {
		// Another process of the machine watches the snap: follow it
		// (machinewait.go).
		return op.follow(ce, joined)
	}
	if a.watched && !op.optimistic {
		op.optimistic = true
		ev := k.event(EventConflict)
		ev.Err = ce
		c.events.emit(ev)
		k.log.Info("conflict; trying again when snapd's state changes", "kind", ce.ChangeKind, "attempt", op.res.Attempts)
		woke, err := op.awaitRewrite(a.mark)
		if err != nil {
			return 0, err
		}
		if woke {
			return tryFresh, nil
		}
	}
	op.optimistic = false
	if op.blind() {
		return tryAgain, op.retryBlind(ce, a.sentAt)
	}
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
	ev := k.event(EventConflict)
	ev.Blockers, ev.Err = ids, ce
	c.events.emit(ev)
	if len(ids) > 0 {
		op.unseen = 0
		op.publishBlockers(ids)
		ce.ChangeID = ids[0]
		for _, id := range ids {
			op.known[id] = true
		}
		k.log.Info("conflict; waiting for blocking changes", "changes", ids, "kind", ce.ChangeKind, "attempt", op.res.Attempts)
		op.res.WaitedFor = appendNew(op.res.WaitedFor, ids...)
		if err := op.waitOut(ids, ce, watched, mark); err != nil {
			return 0, err
		}
		op.cadence().reset()
		return tryFresh, nil // the blocker is done: try again at once
	}
	op.unseen++
	if op.unseen == 1 && ferr == nil {
		// The blocker finished between our request and the listing: try
		// again straight away.
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

// awaitRewrite waits, for at most stateSafety and within the call's
// bounds, for snapd's state file to be rewritten after mark. Like waitOut,
// it lets go of the cross-process locks meanwhile.
func (op *operation) awaitRewrite(mark uint64) (bool, error) {
	if op.locks != nil {
		op.locks.releaseFiles()
	}
	d := stateSafety
	if left, ok := op.k.left(); ok {
		d = min(d, left)
	}
	woke, err := op.c.state.waitFrom(op.k.ctx, d, mark)
	if op.k.ctx.Err() != nil {
		return false, interrupted(op.k.ctx, op.k.last)
	}
	if err != nil {
		woke = false // the watch broke: handle the conflict by listing
	}
	return woke, op.relockFiles()
}

// waitOut waits for blocking changes of others, within the call's bounds.
// It lets go of the cross-process locks meanwhile (a hook the blocker
// runs, a separate process, may need them) but keeps this process's own,
// so identical requests queued behind it can still merge. A blocker that
// sits in Wait (for a reboot) cannot be waited out.
func (op *operation) waitOut(ids []string, ce *retry.ConflictError, watched bool, mark uint64) error {
	if op.locks != nil {
		op.locks.releaseFiles()
	}
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
	case err != nil:
		return err
	}
	return op.relockFiles()
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
// pauses until the cadence's next retry, within the call's bounds. Like
// waitOut, it lets go of the cross-process locks meanwhile (a hook of the
// blocking change, another process, may need them), keeping this
// process's own. Its error is final for the operation.
func (op *operation) retryBlind(ce *retry.ConflictError, sentAt time.Time) error {
	c, k := op.c, op.k
	first := op.cadence().n == 0
	ev := k.event(EventConflict)
	ev.Err = ce
	c.events.emit(ev)
	if first {
		k.log.Info("conflict; the blocker cannot be followed here, retrying on the blind cadence", "kind", ce.ChangeKind, "attempt", op.res.Attempts)
	} else {
		k.log.Debug("conflict; retrying on the blind cadence", "kind", ce.ChangeKind, "attempt", op.res.Attempts)
	}
	d := op.cadence().next(sentAt)
	if op.locks != nil {
		op.locks.releaseFiles()
	}
	if err := k.sleep(d); err != nil {
		if errors.As(err, new(*gaveUpError)) {
			return err
		}
		return interrupted(k.ctx, ce)
	}
	return op.relockFiles()
}
