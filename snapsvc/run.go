package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// interruptGrace bounds the look-up, in the background, for the change of
// a request whose call ended while snapd's answer was pending: a change it
// made is then waited for by the next operation on the snaps.
const interruptGrace = 2 * time.Second

// runner is the state of one operation while it runs.
type runner struct {
	c     *Client
	o     op
	log   *slog.Logger
	h     *held // nil while the locks are not held
	res   *Result
	rt    *retry.Retrier
	reach *reach
	last  error
	skip  string // the running hook's own change, never a blocker
	known map[string]bool
	cad   *cadence // blind waits (cadence.go)
	flog  faultLog
}

// lock takes the snaps' locks (unless snapd only queues the command, in a
// configure hook: such a call cannot collide with our other operations,
// and making it wait for them could deadlock the hook), then waits for the
// changes earlier asynchronous operations of this process left running.
func (r *runner) lock(ctx context.Context) error {
	if r.c.queuesInHook() {
		return nil
	}
	h, err := r.c.lockSnaps(ctx, r.o.t.snaps)
	if err != nil {
		return err
	}
	r.h = h
	var pending []string
	for _, l := range h.mem {
		pending = append(pending, l.takePending()...)
	}
	if len(pending) == 0 {
		return nil
	}
	r.log.Debug("waiting for this process's earlier changes", "changes", pending)
	if _, err := r.c.waitChanges(ctx, pending, r.waitOpts(false)); err != nil {
		for _, l := range h.mem {
			for _, id := range pending {
				l.addPending(id)
			}
		}
		r.unlock()
		return err
	}
	return nil
}

func (r *runner) unlock() {
	if r.h != nil {
		r.h.release()
		r.h = nil
	}
}

func (r *runner) fail(changeID string, err error) (*Result, bool, error) {
	r.flog.end(r.log)
	return nil, false, r.c.opError(r.o, changeID, r.res.Attempts, err)
}

// event is an Event about this operation.
func (r *runner) event(kind EventKind) Event {
	return Event{Kind: kind, Op: r.o.action, Names: r.o.t.names, Attempt: r.res.Attempts, Elapsed: r.elapsed()}
}

// waitOpts are the options for waiting for changes on behalf of r.
func (r *runner) waitOpts(stallOnWait bool) waitOpts {
	return waitOpts{stallOnWait: stallOnWait, ev: r.event(0)}
}

// run carries out one operation: lock, act, absorb conflicts, and (if
// wait) wait for the change. done reports whether the outcome is final.
func (c *Client) run(ctx context.Context, o op, wait bool) (*Result, bool, error) {
	r := &runner{
		c:     c,
		o:     o,
		log:   c.log(ctx).With("snap", strings.Join(o.t.snaps, ","), "action", o.action, "names", o.t.String()),
		res:   &Result{},
		rt:    c.policy.NewRetrier(),
		known: map[string]bool{},
		cad:   newCadence(c.clock, c.policy.MaxConflictInterval),
	}
	r.reach = &reach{c: c, rt: r.rt}
	// A restart that must keep its distance from the last one waits with
	// the snap's locks released, so it holds up no other operation; a
	// restart of the same service may go ahead meanwhile, hence the loop.
	for {
		if err := r.lock(ctx); err != nil {
			return r.fail("", err)
		}
		if !c.mustPace(o) {
			break
		}
		r.unlock()
		if err := c.paceRestart(ctx, o); err != nil {
			return r.fail("", err)
		}
	}
	defer r.unlock()
	onLocked(ctx)
	if c.hook != "" {
		r.skip = c.ownHookChange(ctx, o.t.snaps)
	}

	unseenConflicts := 0
	fresh := false      // an attempt is owed right after waiting out a blocker
	optimistic := false // the last conflict was retried at a state rewrite
	for {
		// Right after a blocker is done one attempt is owed even if the
		// policy's time ran out while waiting for it; its attempt count
		// still holds.
		if r.rt.Attempts() > 0 && (!fresh || r.rt.OutOfAttempts()) {
			if reason := r.rt.Exhausted(); reason != "" {
				return r.fail("", &gaveUpError{reason: reason, last: r.last})
			}
		}
		fresh = false
		// Under a restart budget: confirm the slots are still held before
		// each request that disrupts (budget.go, fence).
		if err := fenceBeforeSend(ctx); err != nil {
			return r.fail("", err)
		}
		r.res.Attempts = r.rt.Attempt()
		// Marked before the request, the state watch cannot miss the end
		// of a change that refuses it.
		var sendMark uint64
		sendWatched := c.state.open()
		if sendWatched {
			sendMark = c.state.mark()
		}
		sentAt := c.clock.Now()
		// The request leaves the last of the call's time to look up its
		// change should its answer still be pending then.
		sctx, scancel := reserveLookup(ctx)
		changeID, err := c.send(sctx, o)
		cutOff := sctx.Err() != nil
		scancel()
		if !cutOff { // a request cut off says nothing about snapd
			r.reach.observe(ctx, r.event(0), err)
		}
		if err == nil {
			return r.succeeded(ctx, changeID, sentAt, c.clock.Now(), wait)
		}
		r.last = err
		class := retry.Classify(err)
		if ctx.Err() != nil || cutOff {
			if class == retry.Indeterminate {
				return r.interruptedInFlight(ctx, sentAt)
			}
			return r.fail("", &interruptedError{ctx: deadlineCause(ctx), last: r.last})
		}
		switch class {
		case retry.Permanent:
			r.log.Info("failed", "attempt", r.res.Attempts, "error", err)
			return r.fail(c.changeFailure(ctx, o, sentAt, &err), err)
		case retry.Conflict:
			r.res.Conflicts++
			ce, _ := retry.AsConflict(err)
			r.last = ce
			if sendWatched && !optimistic {
				// Most blockers are service changes that end within
				// milliseconds: wait for snapd's next state rewrite and
				// try again, without listing changes to name the
				// blocker. Refused again, or no rewrite within
				// stateSafety, the conflict is handled as below.
				optimistic = true
				ev := r.event(EventConflict)
				ev.Err = ce
				c.emit(ev)
				r.log.Info("conflict; trying again when snapd's state changes", "kind", ce.ChangeKind, "attempt", r.res.Attempts)
				woke, err := r.awaitRewrite(ctx, sendMark)
				switch {
				case ctx.Err() != nil:
					return r.fail("", interrupted(ctx, ce))
				case err != nil:
					return r.fail("", err)
				}
				if woke {
					fresh = true
					continue
				}
			}
			optimistic = false
			if r.blind() {
				if err := r.retryBlind(ctx, ce, sentAt); err != nil {
					return r.fail("", err)
				}
				continue
			}
			// Where notices are absent (or not known yet) the wait may
			// poll: the state watch is marked before the listing, so the
			// wait can take the listing for its first read.
			var mark uint64
			watched := c.notices.Load() != noticesYes && c.state.open()
			if watched {
				mark = c.state.mark()
			}
			listedAt := c.clock.Now()
			if _, ok := r.cad.begun(); ok {
				r.cad.note(sentAt) // the refusal, a request of the blind wait going on
				if d := r.cad.delay(listedAt); d > 0 {
					if err := retry.Sleep(ctx, c.clock, d); err != nil {
						return r.fail("", interrupted(ctx, ce))
					}
					listedAt = c.clock.Now()
				}
				r.cad.note(listedAt)
			}
			ids, ferr := c.findBlockers(ctx, o.t.snaps, ce, r.skip)
			if ferr != nil {
				r.log.Debug("cannot list changes to find the blocker", "error", ferr)
				if c.noteListing(ferr); len(ids) == 0 && r.blind() {
					if _, ok := r.cad.begun(); !ok {
						r.cad.note(listedAt) // the refused listing counts as a request of the wait
					}
					if err := r.retryBlind(ctx, ce, sentAt); err != nil {
						return r.fail("", err)
					}
					continue
				}
			}
			ev := r.event(EventConflict)
			ev.Blockers, ev.Err = ids, ce
			c.emit(ev)
			if len(ids) > 0 {
				unseenConflicts = 0
				ce.ChangeID = ids[0]
				for _, id := range ids {
					r.known[id] = true
				}
				r.log.Info("conflict; waiting for blocking changes", "changes", ids, "kind", ce.ChangeKind, "attempt", r.res.Attempts)
				r.res.WaitedFor = appendNew(r.res.WaitedFor, ids...)
				if err := r.waitOut(ctx, ids, ce, watched, mark); err != nil {
					return r.fail("", err)
				}
				r.cad.reset()
				fresh = true
				continue // retry at once: the blocker is done
			}
			unseenConflicts++
			if unseenConflicts == 1 && ferr == nil {
				// The blocker finished between our request and the
				// listing: try again straight away.
				r.log.Info("conflict; blocker already gone, retrying", "kind", ce.ChangeKind, "attempt", r.res.Attempts)
				continue
			}
			r.flog.log(r.log, "in conflict with an unseen blocker", "conflict; blocker not visible, backing off", "kind", ce.ChangeKind, "attempt", r.res.Attempts)
		case retry.Indeterminate:
			ev := r.event(EventAnswerLost)
			ev.Err = err
			c.emit(ev)
			res, done, err, resend := r.recoverLost(ctx, sentAt, wait)
			if !resend {
				return res, done, err
			}
			r.log.Info("the request made no change; sending it again", "attempt", r.res.Attempts, "error", r.last)
		case retry.Transient:
			r.flog.log(r.log, "unable to reach snapd", "snapd unavailable; backing off", "attempt", r.res.Attempts, "error", err)
		}
		if reason := r.rt.Exhausted(); reason != "" {
			return r.fail("", &gaveUpError{reason: reason, last: r.last})
		}
		pause := r.rt.Pause
		if retry.Classify(r.last) == retry.Conflict {
			pause = r.rt.PauseConflict
		}
		if perr := pause(ctx); perr != nil {
			return r.fail("", interrupted(ctx, r.last))
		}
	}
}

// succeeded handles snapd's acceptance of the request.
func (r *runner) succeeded(ctx context.Context, changeID string, sentAt, answeredAt time.Time, wait bool) (*Result, bool, error) {
	c := r.c
	r.flog.end(r.log)
	c.recordRestart(r.o)
	if c.queuesInHook() {
		r.log.Info("queued by snapd until the hook ends", "hook", c.hook, "attempt", r.res.Attempts)
		r.res.Queued = true
		return r.res, true, nil
	}
	if c.mode == ModeSnapctl {
		// Outside configure hooks snapctl answers once the change is ready
		// and Done (ctlcmd runServiceCommand waits for chg.Ready and
		// returns chg.Err). Where snapd lets us list changes, find the
		// change, and notice a command queued by a hook snapsvc could not
		// identify.
		all, err := c.wholeSnapServices(ctx, r.o)
		var chgs []snapd.Change
		if err == nil && !c.blind.noListing.Load() {
			chgs, err = c.main.Changes(ctx, snapd.SelectAll, "")
			c.noteListing(err)
		}
		if err == nil {
			if id := queuedIn(chgs, r.o, all, sentAt, answeredAt); id != "" {
				r.log.Info("queued by snapd until the hook ends", "change", id, "attempt", r.res.Attempts)
				r.res.Queued, r.res.ChangeID = true, id
				return r.res, true, nil
			}
			r.res.ChangeID = c.claimOpChange(chgs, r.o, all, sentAt, answeredAt, r.known)
		}
		r.res.Status = snapd.StatusDone
		ev := r.event(EventAccepted)
		ev.ChangeID = r.res.ChangeID
		c.emit(ev)
		r.log.Info("done", "change", r.res.ChangeID, "attempt", r.res.Attempts)
		return r.res, true, nil
	}
	r.res.ChangeID = changeID
	c.rememberOwn(r.o, changeID)
	ev := r.event(EventAccepted)
	ev.ChangeID = changeID
	c.emit(ev)
	r.log.Info("change created", "change", changeID, "attempt", r.res.Attempts)
	wo := r.waitOpts(false)
	wo.fresh, wo.answeredAt = true, answeredAt
	return c.finish(ctx, r.o, r.res, wait, wo)
}

// recoverLost handles a request whose answer was lost: it adopts the
// change the request made, settles the outcome from the services' state,
// or reports (resend) that the request made no change and may be sent
// again.
func (r *runner) recoverLost(ctx context.Context, sentAt time.Time, wait bool) (res *Result, done bool, err error, resend bool) {
	c := r.c
	id, settled, err := r.resolveLost(ctx, sentAt)
	if err != nil {
		res, done, err = r.fail("", err)
		return res, done, err, false
	}
	if settled {
		r.log.Info("outcome unknown; the services reached the state asked for", "attempt", r.res.Attempts)
		r.res.Status = snapd.StatusDone
		return r.res, true, nil, false
	}
	if id == "" {
		return nil, false, nil, true
	}
	r.log.Info("request's answer was lost; adopting the change it made", "change", id, "attempt", r.res.Attempts)
	if r.o.enable || r.o.disable {
		// Enable and disable leave no trace in the change: a foreign plain
		// start looks exactly like our start --enable. Only the services'
		// state after the change tells them apart.
		ok, svcs, err := r.adoptedMatches(ctx, id)
		if err != nil {
			res, done, err = r.fail(id, err)
			return res, done, err, false
		}
		if !ok {
			r.log.Info("the change found was not this request's (the services are not "+map[bool]string{true: "enabled", false: "disabled"}[r.o.enable]+"); sending it again", "change", id, "services", svcs)
			c.unclaim(r.o, id)
			r.known[id] = true
			return nil, false, nil, true
		}
		c.recordRestart(r.o)
		r.res.ChangeID, r.res.Status = id, snapd.StatusDone
		return r.res, true, nil, false
	}
	c.recordRestart(r.o)
	r.res.ChangeID = id
	res, done, err = r.adopted(ctx, id, wait)
	return res, done, err, false
}

// adoptedMatches waits for change id, found for a start --enable or stop
// --disable whose answer was lost, and reports whether it was the
// request's: the services are now enabled (disabled) as the request asks,
// or another change has touched the snap since, so the state cannot tell.
// Only the startup is read: whether they run is the change's own outcome,
// and a foreign change (a restart, say) may be moving them at this moment.
func (r *runner) adoptedMatches(ctx context.Context, id string) (bool, []Service, error) {
	chg, err := r.c.waitChange(ctx, id, r.waitOpts(false))
	if err != nil {
		return false, nil, adoptedWaitError(id, err)
	}
	for {
		svcs, err := r.c.Services(ctx, r.o.t.names...)
		r.reach.observe(ctx, r.event(0), err)
		if err == nil {
			if r.o.flagsApplied(svcs) {
				return true, svcs, nil
			}
			// Not enabled (disabled) as asked: the change was not ours —
			// unless another change touched the snap since, which may have
			// changed the startup again; then the state says nothing and
			// the change found stands.
			later, err := r.c.touchedSince(ctx, r.o.t.snaps, chg)
			return later || err != nil, svcs, nil
		}
		if !retry.IsRetryable(err) {
			return false, nil, &outcomeUnknownError{reason: fmt.Sprintf("change %s is done but the services' state cannot be read to tell whether it was this request's", id), last: err}
		}
		if reason := r.rt.Exhausted(); reason != "" {
			return false, nil, &outcomeUnknownError{reason: reason + " reading the services' state after change " + id, last: err}
		}
		if perr := r.rt.Pause(ctx); perr != nil {
			return false, nil, &outcomeUnknownError{reason: "interrupted reading the services' state after change " + id, last: interrupted(ctx, err)}
		}
	}
}

// touchedSince reports whether a change other than chg, spawned after it,
// touches one of snaps.
func (c *Client) touchedSince(ctx context.Context, snaps []string, chg *snapd.Change) (bool, error) {
	chgs, err := c.main.Changes(ctx, snapd.SelectAll, "")
	if err != nil {
		return false, err
	}
	for i := range chgs {
		other := &chgs[i]
		if other.ID == chg.ID || !other.SpawnTime.After(chg.SpawnTime) {
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

// interruptedInFlight ends an operation whose call's time (its context,
// or the policy's) ran out, or was about to, while snapd's answer to its
// request was pending. The request may have made a change, or snapd may
// still make it. What is left of the call's time (reserveLookup) goes to
// looking the change up: found, the error names it (not retryable:
// retrying would act twice) and the next operation on the snaps waits for
// it; otherwise the outcome is unknown (ErrOutcomeUnknown) and the look-up
// goes on in the background, bounded by interruptGrace and ended by Close,
// never on the caller's time.
func (r *runner) interruptedInFlight(ctx context.Context, sentAt time.Time) (*Result, bool, error) {
	c, o, log := r.c, r.o, r.log
	cause := &interruptedError{ctx: deadlineCause(ctx), last: r.last}
	if ctx.Err() == nil {
		id, err := c.findOpChange(ctx, o, sentAt, time.Time{}, r.known)
		if err == nil && id != "" {
			c.recordRestart(o)
			c.addPending(o, id)
			log.Info("the call's time ran out while snapd's answer was pending; the request made a change", "change", id)
			return r.fail(id, &inFlightError{id: id, ctx: cause.ctx})
		}
	}
	known := maps.Clone(r.known)
	c.bg.do(interruptGrace, func(bctx context.Context) {
		id, err := c.findOpChange(bctx, o, sentAt, time.Time{}, known)
		switch {
		case err != nil:
			log.Debug("cannot look for the change of a request cut off in flight", "error", err)
		case id != "":
			c.recordRestart(o)
			c.addPending(o, id)
			log.Info("a request cut off in flight made a change; the next operation waits for it", "change", id)
		}
	})
	return r.fail("", &outcomeUnknownError{reason: "ended while snapd's answer was pending; snapd may have acted on the request, or may still act on it", last: cause})
}

// adopted finishes an operation whose change was found after its answer
// was lost.
func (r *runner) adopted(ctx context.Context, id string, wait bool) (*Result, bool, error) {
	wo := r.waitOpts(false)
	wo.found = true
	if r.c.mode == ModeSnapctl {
		chg, err := r.c.waitChange(ctx, id, wo)
		if err != nil {
			return r.fail(id, adoptedWaitError(id, err))
		}
		r.res.Status = chg.Status
		return r.res, true, nil
	}
	return r.c.finish(ctx, r.o, r.res, wait, wo)
}

// awaitRewrite waits, for at most stateSafety and what is left of the
// policy's time, for snapd's state file to be rewritten after mark. Like
// waitOut, it lets go of the cross-process locks meanwhile. Its error is
// the context's end.
func (r *runner) awaitRewrite(ctx context.Context, mark uint64) (bool, error) {
	if r.h != nil {
		r.h.releaseFiles()
	}
	d := stateSafety
	if left, ok := r.rt.Remaining(); ok {
		d = min(d, left)
	}
	woke, err := r.c.state.waitFrom(ctx, d, mark)
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if err != nil {
		woke = false // the watch broke: handle the conflict by listing
	}
	if r.h != nil {
		if err := r.c.lockFiles(ctx, r.h, r.o.t.snaps); err != nil {
			return false, err
		}
	}
	return woke, nil
}

// waitOut waits for blocking changes of others, bounded by what is left of
// the policy's time. It lets go of the cross-process locks meanwhile (a
// hook the blocker runs, a separate process, may need them) but keeps this
// process's own, so identical requests queued behind it can still merge.
// A blocker that sits in Wait (for a reboot) cannot be waited out.
func (r *runner) waitOut(ctx context.Context, ids []string, ce *retry.ConflictError, watched bool, mark uint64) error {
	if r.h != nil {
		r.h.releaseFiles()
	}
	wctx := ctx
	if left, ok := r.rt.Remaining(); ok {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, left)
		defer cancel()
	}
	wo := r.waitOpts(true)
	wo.listed, wo.listedWatched, wo.listedMark = true, watched, mark
	if since, ok := r.cad.begun(); ok { // a blind wait turned to listing: poll at its pace
		wo.since, wo.pacer = since, r.cad
	}
	_, err := r.c.waitChanges(wctx, ids, wo)
	var stalled *ChangeError
	switch {
	case errors.As(err, &stalled):
		ce.ChangeID = stalled.ID
		return &gaveUpError{reason: fmt.Sprintf("blocking change %s (%s) is waiting, for a reboot or a manual step", stalled.ID, stalled.Kind), last: ce}
	case err != nil && ctx.Err() != nil:
		return interrupted(ctx, ce)
	case err != nil && wctx.Err() != nil:
		return &gaveUpError{reason: "gave up waiting for blocking change " + ce.ChangeID, last: ce}
	case err != nil:
		return err
	}
	if r.h != nil {
		return r.c.lockFiles(ctx, r.h, r.o.t.snaps)
	}
	return nil
}

// lostAnswerSettle is the least pause between the two look-ups that tell
// that a request whose answer was lost made no change: long enough for a
// handler that was waiting for snapd's state lock to have made it, short
// against the cost of acting twice (the snap command polls at this rate).
const lostAnswerSettle = 100 * time.Millisecond

// resolveLost finds out whether a request whose outcome is unknown made a
// change. It returns the change's id, or "" when the request made none (so
// sending it again is safe). A connection can break while snapd is still
// handling the request, before it has made the change, so one empty
// look-up is not proof: only a second one, a pause later, is. It never
// sends the action again itself: while the lookup fails it retries the
// lookup within the policy. When snapd refuses the lookup (snapctl without
// snap-refresh-observe), a start or stop is settled by watching the
// services reach the state asked for ("snapctl services" needs no
// interface); a restart cannot be told from the state, so it ends with
// ErrOutcomeUnknown rather than run twice. Any other way it ends before it
// knows is ErrOutcomeUnknown too, never a retryable error.
func (r *runner) resolveLost(ctx context.Context, sentAt time.Time) (id string, settled bool, err error) {
	confirming := false
	for {
		id, err := r.c.findOpChange(ctx, r.o, sentAt, time.Time{}, r.known)
		r.reach.observe(ctx, r.event(0), err)
		switch {
		case err == nil && (id != "" || confirming):
			return id, false, nil
		case err == nil:
			// snapd may not have handled the request yet: it carries on
			// with a request whose connection broke, and its handler
			// may be waiting for the state lock. Look again a settling
			// pause later, however short the policy's pauses.
			r.log.Debug("no change for the request whose answer was lost yet; looking again before sending it again")
			confirming = true
			if perr := retry.Sleep(ctx, r.c.clock, lostAnswerSettle); perr != nil {
				return "", false, &outcomeUnknownError{reason: "interrupted looking for the change of a request whose answer was lost", last: interrupted(ctx, r.last)}
			}
			continue
		case isForbidden(err):
			if r.o.action == "restart" {
				return "", false, &outcomeUnknownError{reason: "the restart may have been carried out, and snapd does not let this client list changes to find out (connect snap-refresh-observe)", last: r.last}
			}
			return "", true, r.awaitState(ctx)
		default:
			r.log.Debug("cannot look for the change of a request whose answer was lost", "error", err)
		}
		if ctx.Err() != nil {
			return "", false, &outcomeUnknownError{reason: "interrupted looking for the change of a request whose answer was lost", last: interrupted(ctx, r.last)}
		}
		if reason := r.rt.Exhausted(); reason != "" {
			return "", false, &outcomeUnknownError{reason: reason + " looking for the change of a request whose answer was lost", last: r.last}
		}
		if perr := r.rt.Pause(ctx); perr != nil {
			return "", false, &outcomeUnknownError{reason: "interrupted looking for the change of a request whose answer was lost", last: interrupted(ctx, r.last)}
		}
	}
}

// awaitState waits, within the policy, until the services o names are in
// the state o asks for.
func (r *runner) awaitState(ctx context.Context) error {
	for {
		svcs, err := r.c.Services(ctx, r.o.t.names...)
		if err == nil && r.o.reached(svcs) {
			return nil
		}
		if err != nil {
			r.log.Debug("cannot read service state", "error", err)
		}
		if reason := r.rt.Exhausted(); reason != "" {
			return &outcomeUnknownError{reason: reason + " waiting for the services to reach the state asked for", last: r.last}
		}
		if perr := r.rt.PauseConflict(ctx); perr != nil {
			return &outcomeUnknownError{reason: "interrupted waiting for the services to reach the state asked for", last: interrupted(ctx, r.last)}
		}
	}
}

// flagsApplied reports whether svcs are enabled or disabled as o asks.
func (o op) flagsApplied(svcs []Service) bool {
	if len(svcs) == 0 {
		return false
	}
	for _, s := range svcs {
		if (o.enable && !s.Enabled) || (o.disable && s.Enabled) {
			return false
		}
	}
	return true
}

// reached reports whether svcs are in the state o asks for.
func (o op) reached(svcs []Service) bool {
	if len(svcs) == 0 {
		return false
	}
	for _, s := range svcs {
		switch {
		case o.action == "start" && (!s.Active || (o.enable && !s.Enabled)):
			return false
		case o.action == "stop" && (s.Active || (o.disable && s.Enabled)):
			return false
		}
	}
	return true
}

// reach turns a Retrier's view of whether snapd can be reached into
// EventUnreachable and EventReachable.
type reach struct {
	c    *Client
	rt   *retry.Retrier
	down bool
}

// observe records the outcome of a request (err nil for an answer). A
// request that failed because ctx ended says nothing about snapd: it is
// not reported as snapd being unreachable (a Wait given a context already
// done, to see whether an operation is final, would otherwise announce an
// outage that never happened).
func (x *reach) observe(ctx context.Context, ev Event, err error) {
	if err != nil && ctx.Err() != nil {
		return
	}
	if x.rt.Observe(err) {
		x.down = true
		ev.Kind, ev.Err = EventUnreachable, err
		var ce *snapd.ConnectionError
		if errors.As(err, &ce) {
			ev.Socket = ce.Socket
		}
		ev.GiveUpAt, _ = x.rt.UnreachableDeadline()
		if dl, ok := ctx.Deadline(); ok && (ev.GiveUpAt.IsZero() || dl.Before(ev.GiveUpAt)) {
			ev.GiveUpAt = dl
		}
		x.c.log(ctx).Info("snapd unreachable; retrying", "socket", ev.Socket, "until", ev.GiveUpAt, "error", err)
		x.c.emit(ev)
		return
	}
	if x.down {
		if _, still := x.rt.Unreachable(); !still {
			x.down = false
			ev.Kind = EventReachable
			x.c.emit(ev)
		}
	}
}
