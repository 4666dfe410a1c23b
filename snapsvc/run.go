package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// The life of one operation (Start, Stop, Restart), as named phases, each
// in a small function, every one on the operation's call (call.go), which
// holds all of its bounds:
//
//	bound    newCall: the call's deadline, MaxUnreachable, MaxAttempts
//	pace     paceRestart: WithMinRestartInterval, no slot or lock held
//	budget   takeBudget: the restart budget's slots (budget.go)
//	lock     runner.lock: the snaps' locks, in and across processes
//	send     runner.send: fence the slots, then one request to act
//	find     runner.lost: the change of a request whose answer was lost
//	wait     runner.conflict (someone else's change), runner.accepted
//	         (the operation's own change)
//	verdict  runner.accepted, runner.refused: what the change did
//	release  releaseBudget: the slots, given back only once the outcome is
//	         final and the services are ready (budget.go)
//
// run covers lock to verdict: it sends until snapd accepts the request
// (waiting out conflicts, finding the change of a lost answer, pausing
// while snapd is away), then waits for the change.

// interruptGrace bounds the look-up, in the background, for the change of
// a request whose call ended while snapd's answer was pending: a change it
// made is then waited for by the next operation on the snaps.
const interruptGrace = 2 * time.Second

// runner is the state of one operation while it runs.
type runner struct {
	c     *Client
	k     *call
	o     op
	h     *held // nil while the locks are not held
	res   *Result
	skip  string // the running hook's own change, never a blocker
	known map[string]bool
	cad   *cadence // blind waits (cadence.go)

	unseen     int  // conflicts in a row whose blocker was not seen
	fresh      bool // an attempt is owed right after waiting out a blocker
	optimistic bool // the last conflict was retried at a state rewrite
}

// attempt is what one request to act met.
type attempt struct {
	sent       sent
	sentAt     time.Time
	answeredAt time.Time
	changeID   string
	err        error
	class      retry.Class
	cutOff     bool   // ended by the call's time, or the look-up reserve
	watched    bool   // the state file was watched when it was sent
	mark       uint64 // the state watch's mark before it was sent
}

// next says what an operation does after an attempt that did not end it.
type next int

const (
	tryAgain  next = iota // at once
	tryFresh              // at once: a blocker just ended (owed even out of time)
	tryPaused             // after the policy's pause
)

// run carries out one operation on its call: lock, send until snapd
// accepts, wait for the change, judge it. done reports whether the outcome
// is final.
func (c *Client) run(k *call, o op, wait bool) (*Result, bool, error) {
	r := &runner{c: c, k: k, o: o, res: &Result{}, known: map[string]bool{},
		cad: newCadence(c.clock, k.rt.Policy().MaxConflictInterval)}
	if err := r.lock(); err != nil {
		return r.fail("", err)
	}
	defer r.unlock()
	for {
		if err := r.mayTry(); err != nil {
			return r.fail("", err)
		}
		a, err := r.send()
		if err != nil {
			return r.fail("", err)
		}
		if a.err == nil {
			return r.accepted(a, wait)
		}
		if errors.Is(a.err, snapd.ErrSendDeadline) {
			// The fence's confirmation ran out before the request's first
			// byte was written: snapd saw nothing. Fence again.
			k.log.Info("the restart budget's confirmation ran out before the request was written; fencing again", "attempt", r.res.Attempts)
			continue
		}
		if a.cutOff || k.ctx.Err() != nil {
			return r.interruptedAt(a)
		}
		var step next
		switch a.class {
		case retry.Permanent:
			return r.refused(a)
		case retry.Conflict:
			step, err = r.conflict(a)
		case retry.Indeterminate:
			var res *Result
			var done bool
			res, done, step, err = r.lost(a, wait)
			if res != nil || err != nil {
				return res, done, err
			}
		case retry.Transient:
			r.k.flog.log(r.k.log, "unable to reach snapd", "snapd unavailable; backing off", "attempt", r.res.Attempts, "error", a.err)
			step = tryPaused
		}
		if err != nil {
			return r.fail("", err)
		}
		r.fresh = step == tryFresh
		if step == tryPaused {
			if err := r.k.pause(a.err); err != nil {
				return r.fail("", err)
			}
		}
	}
}

// ---- lock ----

// lock takes the snaps' locks (unless snapd only queues the command, in a
// configure hook: such a call cannot collide with our other operations,
// and making it wait for them could deadlock the hook), then waits for the
// changes earlier asynchronous operations of this process left running.
// A restart that must keep its distance from the last one (pace.go) waits
// with the locks released, so it holds up no other operation; a restart of
// the same service may go ahead meanwhile, hence the loop.
func (r *runner) lock() error {
	c := r.c
	for {
		if !c.queuesInHook() {
			h, err := c.lockSnaps(r.k.ctx, r.o.t.snaps)
			if err != nil {
				return err
			}
			r.h = h
		}
		if !c.mustPace(r.o) {
			break
		}
		r.unlock()
		if err := c.paceRestart(r.k, r.o); err != nil {
			return err
		}
	}
	onLocked(r.k.ctx)
	if err := r.waitPending(); err != nil {
		r.unlock()
		return err
	}
	if c.hook != "" {
		r.skip = c.ownHookChange(r.k, r.o.t.snaps)
	}
	return nil
}

// waitPending waits for the changes earlier asynchronous operations of
// this process left running on the snaps.
func (r *runner) waitPending() error {
	if r.h == nil {
		return nil
	}
	var pending []string
	for _, l := range r.h.mem {
		pending = append(pending, l.takePending()...)
	}
	if len(pending) == 0 {
		return nil
	}
	r.k.log.Debug("waiting for this process's earlier changes", "changes", pending)
	if _, err := r.c.waitChanges(r.k, pending, waitOpts{}); err != nil {
		for _, l := range r.h.mem {
			for _, id := range pending {
				l.addPending(id)
			}
		}
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

// ---- send ----

// mayTry returns the error that ends the operation before another attempt:
// its attempts or time ran out. Right after a blocker is done one attempt
// is owed even if the call's time ran out while waiting for it; its
// attempt count still holds.
func (r *runner) mayTry() error {
	if r.k.rt.Attempts() == 0 || (r.fresh && !r.k.rt.OutOfAttempts()) {
		return nil
	}
	return r.k.exhausted(r.k.last)
}

// send makes one attempt: under a restart budget it first confirms the
// slots are still held (budget.go, fence), then sends the request to act,
// leaving the last of the call's time to look up its change.
func (r *runner) send() (attempt, error) {
	c, k := r.c, r.k
	if err := k.fence(); err != nil {
		return attempt{}, err
	}
	r.fresh = false
	r.res.Attempts = k.rt.Attempt()
	var a attempt
	// Marked before the request, the state watch cannot miss the end of
	// a change that refuses it.
	if a.watched = c.state.open(); a.watched {
		a.mark = c.state.mark()
	}
	a.sent = c.sending()
	a.sentAt = a.sent.at
	actx, cancel := k.actCtx()
	if k.hold != nil && !k.hold.sendBy.IsZero() {
		actx = snapd.WithSendBy(actx, k.hold.sendBy)
	}
	a.changeID, a.err = c.send(actx, r.o)
	a.cutOff = actx.Err() != nil && a.err != nil
	cancel()
	a.answeredAt = c.clock.Now()
	if !a.cutOff && !errors.Is(a.err, snapd.ErrSendDeadline) { // neither says anything about snapd
		k.observe(a.err)
	}
	if a.err != nil {
		k.last = a.err
		a.class = retry.Classify(a.err)
	}
	return a, nil
}

func (r *runner) fail(changeID string, err error) (*Result, bool, error) {
	r.k.flog.gaveUp(r.k.log)
	return nil, false, r.c.opError(r.o, changeID, r.res.Attempts, err)
}

// ---- verdict: refused ----

// refused ends an operation snapd refused for good (an unknown service, a
// failed change reported by snapctl).
func (r *runner) refused(a attempt) (*Result, bool, error) {
	r.k.log.Info("failed", "attempt", r.res.Attempts, "error", a.err)
	err := a.err
	id := r.c.changeFailure(r.k, r.o, a.sentAt, &err)
	return r.fail(id, err)
}

// ---- wait: someone else's change ----

// conflict waits out the change that refused the attempt: at the state
// file's next rewrite for a first conflict (most blockers are service
// changes that end within milliseconds), blind where the blocker's end
// cannot be seen (cadence.go), else by finding the blockers and waiting
// for them.
func (r *runner) conflict(a attempt) (next, error) {
	c, k := r.c, r.k
	r.res.Conflicts++
	ce, _ := retry.AsConflict(a.err)
	k.last = ce
	if a.watched && !r.optimistic {
		r.optimistic = true
		ev := k.event(EventConflict)
		ev.Err = ce
		c.emit(ev)
		k.log.Info("conflict; trying again when snapd's state changes", "kind", ce.ChangeKind, "attempt", r.res.Attempts)
		woke, err := r.awaitRewrite(a.mark)
		if err != nil {
			return 0, err
		}
		if woke {
			return tryFresh, nil
		}
	}
	r.optimistic = false
	if r.blind() {
		return tryAgain, r.retryBlind(ce, a.sentAt)
	}
	// Where notices are absent (or not known yet) the wait may poll: the
	// state watch is marked before the listing, so the wait can take the
	// listing for its first read.
	var mark uint64
	watched := c.notices.Load() != noticesYes && c.state.open()
	if watched {
		mark = c.state.mark()
	}
	listedAt, err := r.paceListing(a.sentAt)
	if err != nil {
		return 0, err
	}
	ids, ferr := c.findBlockers(k, r.o.t.snaps, ce, r.skip)
	if ferr != nil {
		k.log.Debug("cannot list changes to find the blocker", "error", ferr)
		if c.noteListing(ferr); len(ids) == 0 && r.blind() {
			if _, ok := r.cad.begun(); !ok {
				r.cad.note(listedAt) // the refused listing counts as a request of the wait
			}
			return tryAgain, r.retryBlind(ce, a.sentAt)
		}
	}
	ev := k.event(EventConflict)
	ev.Blockers, ev.Err = ids, ce
	c.emit(ev)
	if len(ids) > 0 {
		r.unseen = 0
		ce.ChangeID = ids[0]
		for _, id := range ids {
			r.known[id] = true
		}
		k.log.Info("conflict; waiting for blocking changes", "changes", ids, "kind", ce.ChangeKind, "attempt", r.res.Attempts)
		r.res.WaitedFor = appendNew(r.res.WaitedFor, ids...)
		if err := r.waitOut(ids, ce, watched, mark); err != nil {
			return 0, err
		}
		r.cad.reset()
		return tryFresh, nil // the blocker is done: try again at once
	}
	r.unseen++
	if r.unseen == 1 && ferr == nil {
		// The blocker finished between our request and the listing: try
		// again straight away.
		k.log.Info("conflict; blocker already gone, retrying", "kind", ce.ChangeKind, "attempt", r.res.Attempts)
		return tryAgain, nil
	}
	k.flog.log(k.log, "in conflict with an unseen blocker", "conflict; blocker not visible, backing off", "kind", ce.ChangeKind, "attempt", r.res.Attempts)
	return tryPaused, nil
}

// paceListing keeps a listing made during a blind wait (one that turned to
// listing after its first seconds) to the wait's request budget, counting
// the refusal that led to it. It returns when the listing is sent.
func (r *runner) paceListing(refusedSentAt time.Time) (time.Time, error) {
	now := r.c.clock.Now()
	if _, ok := r.cad.begun(); !ok {
		return now, nil
	}
	r.cad.note(refusedSentAt)
	if d := r.cad.delay(now); d > 0 {
		if err := r.k.sleep(d); err != nil {
			return now, err
		}
		now = r.c.clock.Now()
	}
	r.cad.note(now)
	return now, nil
}

// awaitRewrite waits, for at most stateSafety and within the call's
// bounds, for snapd's state file to be rewritten after mark. Like waitOut,
// it lets go of the cross-process locks meanwhile.
func (r *runner) awaitRewrite(mark uint64) (bool, error) {
	if r.h != nil {
		r.h.releaseFiles()
	}
	d := stateSafety
	if left, ok := r.k.left(); ok {
		d = min(d, left)
	}
	woke, err := r.c.state.waitFrom(r.k.ctx, d, mark)
	if r.k.ctx.Err() != nil {
		return false, interrupted(r.k.ctx, r.k.last)
	}
	if err != nil {
		woke = false // the watch broke: handle the conflict by listing
	}
	return woke, r.relockFiles()
}

// relockFiles takes back the cross-process locks let go while waiting.
func (r *runner) relockFiles() error {
	if r.h == nil {
		return nil
	}
	return r.c.lockFiles(r.k.ctx, r.h, r.o.t.snaps)
}

// waitOut waits for blocking changes of others, within the call's bounds.
// It lets go of the cross-process locks meanwhile (a hook the blocker
// runs, a separate process, may need them) but keeps this process's own,
// so identical requests queued behind it can still merge. A blocker that
// sits in Wait (for a reboot) cannot be waited out.
func (r *runner) waitOut(ids []string, ce *retry.ConflictError, watched bool, mark uint64) error {
	if r.h != nil {
		r.h.releaseFiles()
	}
	wo := waitOpts{stallOnWait: true, listed: true, listedWatched: watched, listedMark: mark}
	if since, ok := r.cad.begun(); ok { // a blind wait turned to listing: poll at its pace
		wo.since, wo.pacer = since, r.cad
	}
	_, err := r.c.waitChanges(r.k, ids, wo)
	var stalled *ChangeError
	var gaveUp *gaveUpError
	switch {
	case errors.As(err, &stalled):
		ce.ChangeID = stalled.ID
		return &gaveUpError{reason: fmt.Sprintf("blocking change %s (%s) is waiting, for a reboot or a manual step", stalled.ID, stalled.Kind), last: ce}
	case err != nil && r.k.ctx.Err() != nil:
		return interrupted(r.k.ctx, ce)
	case errors.As(err, &gaveUp):
		return &gaveUpError{reason: gaveUp.reason, last: ce}
	case err != nil:
		return err
	}
	return r.relockFiles()
}

// ---- find: the change of a lost answer ----

// lost handles a request whose answer was lost: it adopts the change the
// request made, settles the outcome from the services' state, or reports
// (tryPaused) that the request made no change and may be sent again.
func (r *runner) lost(a attempt, wait bool) (*Result, bool, next, error) {
	c, k := r.c, r.k
	ev := k.event(EventAnswerLost)
	ev.Err = a.err
	c.emit(ev)
	id, settled, err := r.resolveLost(a.sent)
	switch {
	case err != nil:
		res, done, err := r.fail("", err)
		return res, done, 0, err
	case settled:
		k.log.Info("outcome unknown; the services reached the state asked for", "attempt", r.res.Attempts)
		r.res.Status = snapd.StatusDone
		return r.res, true, 0, nil
	case id == "":
		k.log.Info("the request made no change; sending it again", "attempt", r.res.Attempts, "error", k.last)
		return nil, false, tryPaused, nil
	}
	k.log.Info("request's answer was lost; adopting the change it made", "change", id, "attempt", r.res.Attempts)
	if r.o.enable || r.o.disable {
		// Enable and disable leave no trace in the change: a foreign plain
		// start looks exactly like our start --enable. Only the services'
		// state after the change tells them apart.
		ok, svcs, err := r.adoptedMatches(id)
		if err != nil {
			res, done, err := r.fail(id, err)
			return res, done, 0, err
		}
		if !ok {
			k.log.Info("the change found was not this request's (the services are not "+map[bool]string{true: "enabled", false: "disabled"}[r.o.enable]+"); sending it again", "change", id, "services", svcs)
			c.unclaim(r.o, id)
			r.known[id] = true
			return nil, false, tryPaused, nil
		}
		c.recordRestart(r.o)
		r.res.ChangeID, r.res.Status = id, snapd.StatusDone
		return r.res, true, 0, nil
	}
	c.recordRestart(r.o)
	r.res.ChangeID = id
	res, done, err := r.adopted(id, wait)
	return res, done, 0, err
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
// lookup within the call's bounds. When snapd refuses the lookup (snapctl
// without snap-refresh-observe), a start or stop is settled by watching
// the services reach the state asked for ("snapctl services" needs no
// interface); a restart cannot be told from the state, so it ends with
// ErrOutcomeUnknown rather than run twice. Any other way it ends before it
// knows is ErrOutcomeUnknown too, never a retryable error.
func (r *runner) resolveLost(st sent) (id string, settled bool, err error) {
	k := r.k
	unknown := func(reason string, err error) error { return r.unknownOutcome(reason, err, st) }
	const what = "looking for the change of a request whose answer was lost"
	confirming := false
	for {
		id, err := r.c.findOpChange(k, r.o, st, time.Time{}, r.known)
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
		case isForbidden(err):
			if r.o.action == "restart" {
				return "", false, &outcomeUnknownError{reason: "the restart may have been carried out, and snapd does not let this client list changes to find out (connect snap-refresh-observe)", last: r.lastAct(), sent: st}
			}
			return "", true, r.awaitState()
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

// unknownOutcome is the end of a call, for err (the call's bound, or its
// context), while it was finding out what its request to act did (what):
// ErrOutcomeUnknown, with the request's last failure, and st, when set,
// the request whose outcome is unknown.
func (r *runner) unknownOutcome(what string, err error, st sent) error {
	if g := (*gaveUpError)(nil); errors.As(err, &g) {
		return &outcomeUnknownError{reason: g.reason + " " + what, last: r.lastAct(), sent: st}
	}
	return &outcomeUnknownError{reason: "interrupted " + what, last: interrupted(r.k.ctx, r.lastAct()), sent: st}
}

// lastAct is the failure of the last request to act.
func (r *runner) lastAct() error {
	if r.k.last != nil {
		return r.k.last
	}
	return ErrOutcomeUnknown
}

// awaitState waits, within the call's bounds, until the services the
// operation names are in the state it asks for.
func (r *runner) awaitState() error {
	k := r.k
	const what = "waiting for the services to reach the state asked for"
	for {
		svcs, err := r.c.services(k, r.o.t.names)
		if err == nil && r.o.reached(svcs) {
			return nil
		}
		if err != nil {
			k.log.Debug("cannot read service state", "error", err)
		}
		if perr := k.sleep(k.rt.ConflictPause()); perr != nil {
			return r.unknownOutcome(what, perr, sent{})
		}
	}
}

// adoptedMatches waits for change id, found for a start --enable or stop
// --disable whose answer was lost, and reports whether it was the
// request's: the services are now enabled (disabled) as the request asks,
// or another change has touched the snap since, so the state cannot tell.
// Only the startup is read: whether they run is the change's own outcome,
// and a foreign change (a restart, say) may be moving them at this moment.
func (r *runner) adoptedMatches(id string) (bool, []Service, error) {
	chg, err := r.c.waitChange(r.k, id, waitOpts{})
	if err != nil {
		return false, nil, adoptedWaitError(id, err)
	}
	svcs, err := r.c.services(r.k, r.o.t.names)
	if err != nil {
		return false, nil, &outcomeUnknownError{reason: fmt.Sprintf("change %s is done but the services' state cannot be read to tell whether it was this request's", id), last: err}
	}
	if r.o.flagsApplied(svcs) {
		return true, svcs, nil
	}
	// Not enabled (disabled) as asked: the change was not ours — unless
	// another change touched the snap since, which may have changed the
	// startup again; then the state says nothing and the change found
	// stands.
	later, err := r.c.touchedSince(r.k, r.o.t.snaps, chg)
	return later || err != nil, svcs, nil
}

// touchedSince reports whether a change other than chg, spawned after it,
// touches one of snaps.
func (c *Client) touchedSince(k *call, snaps []string, chg *snapd.Change) (bool, error) {
	chgs, err := c.listOnce(k, snapd.SelectAll)
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

// interruptedAt ends an operation whose call's time (its context, or the
// policy's) ran out, or was about to, during attempt a. If snapd's answer
// was pending, the request may have made a change, or snapd may still make
// it: what is left of the call's time (the look-up reserve) goes to
// looking the change up. Found, the error names it (not retryable:
// retrying would act twice) and the next operation on the snaps waits for
// it; otherwise the outcome is unknown (ErrOutcomeUnknown) and the look-up
// goes on in the background, bounded by interruptGrace and ended by Close,
// never on the caller's time.
func (r *runner) interruptedAt(a attempt) (*Result, bool, error) {
	c, k, o := r.c, r.k, r.o
	cause := &interruptedError{ctx: deadlineCause(k.ctx), last: a.err}
	if a.class != retry.Indeterminate {
		return r.fail("", cause)
	}
	if k.ctx.Err() == nil {
		id, err := c.findOpChange(k, o, a.sent, time.Time{}, r.known)
		if err == nil && id != "" {
			c.recordRestart(o)
			c.addPending(o, id)
			k.log.Info("the call's time ran out while snapd's answer was pending; the request made a change", "change", id)
			return r.fail(id, &inFlightError{id: id, ctx: cause.ctx})
		}
	}
	known, log := maps.Clone(r.known), k.log
	found := make(chan string, 1)
	started := c.bg.do(interruptGrace, func(bctx context.Context) {
		defer close(found)
		bk := c.newCall(bctx, callWait, o.action, o.t.names)
		defer bk.end()
		if id := c.lookFor(bk, o, a.sent, known); id != "" {
			c.recordRestart(o)
			c.addPending(o, id)
			log.Info("a request cut off in flight made a change; the next operation waits for it", "change", id)
			found <- id
		} else {
			log.Debug("no change found for a request cut off in flight", "within", interruptGrace)
		}
	})
	if !started {
		close(found)
	}
	return r.fail("", &outcomeUnknownError{reason: "ended while snapd's answer was pending; snapd may have acted on the request, or may still act on it", last: cause, sent: a.sent, found: found})
}

// lookFor looks, until k's context ends (interruptGrace, in the
// background), for the change of request o sent at st: snapd carries on
// with a request whose client left, and a handler stuck behind its state
// lock may make the change late. It returns "" when none was made by then.
func (c *Client) lookFor(k *call, o op, st sent, known map[string]bool) string {
	for {
		id, err := c.findOpChange(k, o, st, time.Time{}, known)
		if err == nil && id != "" {
			return id
		}
		if k.sleep(lostAnswerSettle) != nil {
			return ""
		}
	}
}

// adopted finishes an operation whose change was found after its answer
// was lost.
func (r *runner) adopted(id string, wait bool) (*Result, bool, error) {
	wo := waitOpts{found: true}
	if r.c.mode == ModeSnapctl {
		chg, err := r.c.waitChange(r.k.ownChange(), id, wo)
		if err != nil {
			return r.fail(id, adoptedWaitError(id, err))
		}
		r.res.Status = chg.Status
		return r.res, true, nil
	}
	return r.c.finish(r.k, r.o, r.res, wait, wo)
}

// ---- wait and verdict: the operation's own change ----

// accepted handles snapd's acceptance of the request: the change is
// queued (a configure hook), done already (snapctl answers once its change
// is ready), or waited for (REST).
func (r *runner) accepted(a attempt, wait bool) (*Result, bool, error) {
	c, k := r.c, r.k
	k.flog.end(k.log)
	c.recordRestart(r.o)
	if c.queuesInHook() {
		k.log.Info("queued by snapd until the hook ends", "hook", c.hook, "attempt", r.res.Attempts)
		r.res.Queued = true
		return r.res, true, nil
	}
	if c.mode == ModeSnapctl {
		return r.snapctlDone(a)
	}
	r.res.ChangeID = a.changeID
	c.sawID(a.changeID)
	c.rememberOwn(r.o, a.changeID)
	ev := k.event(EventAccepted)
	ev.ChangeID = a.changeID
	c.emit(ev)
	k.log.Info("change created", "change", a.changeID, "attempt", r.res.Attempts)
	return c.finish(k, r.o, r.res, wait, waitOpts{fresh: true, kind: r.o.key(), sentAt: a.sentAt, answeredAt: a.answeredAt})
}

// snapctlDone handles snapctl's answer to a service command: outside
// configure hooks snapctl answers once the change is ready and Done
// (ctlcmd runServiceCommand waits for chg.Ready and returns chg.Err).
// Where snapd lets us list changes, it finds the change, and notices a
// command queued by a hook snapsvc could not identify.
func (r *runner) snapctlDone(a attempt) (*Result, bool, error) {
	c, k := r.c, r.k
	all, err := c.wholeSnapServices(k, r.o)
	var chgs []snapd.Change
	if err == nil && !c.blind.noListing.Load() {
		chgs, err = c.listOnce(k, snapd.SelectAll)
		c.noteListing(err)
	}
	if err == nil {
		if id := queuedIn(chgs, r.o, all, c.pace.snapdTime(a.sentAt), c.pace.snapdTimeLate(a.answeredAt)); id != "" {
			k.log.Info("queued by snapd until the hook ends", "change", id, "attempt", r.res.Attempts)
			r.res.Queued, r.res.ChangeID = true, id
			return r.res, true, nil
		}
		r.res.ChangeID = c.claimOpChange(chgs, r.o, all, a.sent, a.answeredAt, r.known)
	}
	r.res.Status = snapd.StatusDone
	ev := k.event(EventAccepted)
	ev.ChangeID = r.res.ChangeID
	c.emit(ev)
	k.log.Info("done", "change", r.res.ChangeID, "attempt", r.res.Attempts)
	return r.res, true, nil
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
