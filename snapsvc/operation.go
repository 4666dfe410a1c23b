package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// The life of one operation (Start, Stop, Restart), top to bottom. Every
// step runs on the operation's call (call.go), which holds all of its
// bounds; each phase is a function, and the detours and mechanisms have
// files of their own:
//
//	bound    newOpCall: the call's deadline, MaxUnreachable, MaxAttempts
//	budget   takeBudget: the restart budget's slots (budget_take.go)
//	pace     call.keepInterval: WithMinRestartInterval (lock.go)
//	lock     runner.lock: the snaps' locks, in and across processes; an
//	         identical restart not sent yet may merge (lock.go, merge.go)
//	send     runner.try: fence the slots, then one request to act
//	conflict runner.conflict: someone else's change (conflict.go)
//	find     runner.lost: the change of a request whose answer was lost
//	         (lostanswer.go, matching.go)
//	wait     finish: the operation's own change (changewait.go)
//	verdict  runner.accepted, runner.refused: what the change did
//	release  hold.end: the slots, given back only once the outcome is
//	         final and the services are ready (budget_lifecycle.go)
//
// run covers lock to verdict: it sends until snapd accepts the request
// (waiting out conflicts, finding the change of a lost answer, pausing
// while snapd is away), then waits for the change.

// runSync is the life of one synchronous operation: bound, pace and
// budget, lock to verdict (identical restarts merged), release; its
// events (EventStarted, then EventDone or EventFailed) around it.
func (c *Client) runSync(ctx context.Context, action string, names []string, set func(*op)) (*Result, error) {
	started := c.events.opStarted(action, names)
	res, err := func() (*Result, error) {
		o, err := c.prepare(action, names, set)
		if err != nil {
			return nil, err
		}
		k := c.newOpCall(ctx, o)
		defer k.end()
		return c.operate(k, o)
	}()
	c.events.opEnded(action, names, started, res, err)
	return res, err
}

// operate is budget, lock to verdict, and release of operation o on its
// call k.
func (c *Client) operate(k *call, o op) (*Result, error) {
	var h *hold
	if c.budget != nil {
		var err error
		if h, err = c.takeBudget(k, o); err != nil {
			return nil, err
		}
	}
	k.hold = h
	res, err := c.coalesce(k, o)
	if h != nil {
		err = h.end(k, o, res, err)
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// runAsync is runSync up to snapd's acceptance; the wait, and the release
// of the budget's slots, go on in the background (budget_lifecycle.go,
// hold.endAsync). EventDone or EventFailed comes from the first
// Operation.Wait that sees the end, or now if snapd did not accept.
func (c *Client) runAsync(ctx context.Context, action string, names []string, set func(*op)) (*Operation, error) {
	started := c.events.opStarted(action, names)
	op, err := c.accept(ctx, action, names, set)
	if err != nil {
		c.events.opEnded(action, names, started, nil, err)
		return nil, err
	}
	op.mu.Lock()
	op.obs.started = started
	op.mu.Unlock()
	return op, nil
}

// accept is runAsync without its events.
func (c *Client) accept(ctx context.Context, action string, names []string, set func(*op)) (*Operation, error) {
	o, err := c.prepare(action, names, set)
	if err != nil {
		return nil, err
	}
	k := c.newOpCall(ctx, o)
	defer k.end()
	var h *hold
	if c.budget != nil {
		if h, err = c.takeBudget(k, o); err != nil {
			return nil, err
		}
	}
	k.hold = h
	res, done, err := c.run(k, o, false, nil)
	if err != nil {
		if h != nil {
			err = h.end(k, o, nil, err)
		}
		return nil, err
	}
	op := &Operation{c: c, op: o, result: *res, done: done}
	if h != nil {
		h.endAsync(k, op, done)
	}
	return op, nil
}

// newOpCall begins the call of operation o, its log lines naming it.
func (c *Client) newOpCall(ctx context.Context, o op) *call {
	k := c.newCall(ctx, callOp, o.action, o.t.names)
	k.log = k.log.With("snap", strings.Join(o.t.snaps, ","), "action", o.action, "names", o.t.String())
	return k
}

// runner is the state of one operation while it runs.
type runner struct {
	c     *Client
	k     *call
	o     op
	locks *snapLocks // nil while the locks are not held
	res   *Result
	skip  string // the running hook's own change, never a blocker
	known map[string]bool
	cad   *cadence  // blind waits (cadence.go), made at the first: see cadence
	obs   *observer // while it observes its snap for the machine (machinewait.go)
	// onLocked, when set, is called once the operation holds its snaps'
	// locks (merge.go: identical restarts may join it until then).
	onLocked func()

	unseen     int   // conflicts in a row whose blocker was not seen
	fresh      bool  // an attempt is owed right after waiting out a blocker
	optimistic bool  // the last conflict was retried at a state rewrite
	expired    int   // fences in a row whose confirmation ran out before the write
	actErr     error // the failure of the last request to act
}

// cadence is the operation's blind wait (cadence.go), made at its first
// use: most operations never wait blind.
func (r *runner) cadence() *cadence {
	if r.cad == nil {
		r.cad = newCadence(r.c.clock, r.k.rt.policy().MaxConflictInterval)
	}
	return r.cad
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
func (c *Client) run(k *call, o op, wait bool, onLocked func()) (*Result, bool, error) {
	r := &runner{c: c, k: k, o: o, res: &Result{}, known: map[string]bool{}, onLocked: onLocked}
	if err := r.lock(); err != nil {
		return r.fail("", err)
	}
	defer r.unlock()
	defer r.stopObserving() // machinewait.go: before the snap's file lock goes
	for {
		if err := r.mayTry(); err != nil {
			return r.fail("", err)
		}
		if ce, joined, busy := r.busyElsewhere(); busy {
			// Another process of the machine waits the snap's blocker out:
			// follow what it sees instead of asking snapd (machinewait.go).
			r.res.Conflicts++
			then, err := r.follow(ce, joined)
			if err != nil {
				return r.fail("", err)
			}
			r.fresh = then == tryFresh
			continue
		}
		a, err := r.try()
		if err != nil {
			return r.fail("", err)
		}
		if a.err == nil {
			return r.accepted(a, wait)
		}
		if errors.Is(a.err, snapd.ErrSendDeadline) {
			// The fence's confirmation ran out before the request's first
			// byte was written: snapd saw nothing. Fence again, a few
			// times: a budget whose confirmations always run out first
			// must not spin.
			if r.expired++; r.expired >= maxExpiredFences {
				return r.fail("", &BudgetError{Key: k.hold.keys(), Err: fmt.Errorf("%w: %d fences in a row confirmed the slot for less time than it took to write the request (nothing was sent)", ErrBudgetUnavailable, r.expired)})
			}
			k.log.Info("the restart budget's confirmation ran out before the request was written; fencing again", "attempt", r.res.Attempts)
			continue
		}
		r.expired = 0
		if a.step == giveUp && !a.cutOff {
			// snapd's answer is final (the request refused for good, or,
			// from snapctl, its change failed): that the call's time ran
			// out as it came changes nothing, and it is never retryable.
			return r.refused(a)
		}
		if a.cutOff || k.ctx.Err() != nil {
			return r.interruptedAt(a)
		}
		// The retry rule (retryrule.go) says what the failure calls for.
		var then next
		switch a.step {
		case giveUp:
			return r.refused(a)
		case waitOut:
			if r.k.rt.outOfAttempts() {
				// No attempt may follow: waiting the blocker out would only
				// end in giving up (MaxAttempts 1 means one attempt).
				ce, _ := retry.AsConflict(a.err)
				r.res.Conflicts++
				return r.fail("", r.k.exhausted(ce))
			}
			then, err = r.conflict(a)
		case lookUp:
			var res *Result
			var done bool
			res, done, then, err = r.lost(a, wait)
			if res != nil || err != nil {
				return res, done, err
			}
		case askAgain:
			r.k.flog.log(r.k.log, "unable to reach snapd", "snapd unavailable; backing off", "attempt", r.res.Attempts, "error", a.err)
			then = tryPaused
		}
		if err != nil {
			return r.fail("", err)
		}
		r.fresh = then == tryFresh
		if then == tryPaused {
			if err := r.k.pause(a.err); err != nil {
				return r.fail("", err)
			}
		}
	}
}

func (r *runner) fail(changeID string, err error) (*Result, bool, error) {
	r.k.flog.gaveUp(r.k.log)
	return nil, false, r.c.opError(r.o, changeID, r.res.Attempts, err)
}

// attempt is what one request to act met.
type attempt struct {
	sent       sent
	sentAt     time.Time
	answeredAt time.Time
	changeID   string
	err        error
	step       step   // what the failure calls for (retryrule.go)
	cutOff     bool   // ended by the call's time, or the look-up reserve
	watched    bool   // the state file was watched when it was sent
	mark       uint64 // the state watch's mark before it was sent
}

// mayTry returns the error that ends the operation before another attempt:
// its attempts or time ran out. Right after a blocker is done one attempt
// is owed even if the call's time ran out while waiting for it; its
// attempt count still holds.
func (r *runner) mayTry() error {
	if r.k.rt.attempts() == 0 || (r.fresh && !r.k.rt.outOfAttempts()) {
		return nil
	}
	return r.k.exhausted(r.k.last)
}

// try makes one attempt: under a restart budget it first confirms the
// slots are still held (budget.go, fence), then sends the request to act,
// leaving the last of the call's time to look up its change.
func (r *runner) try() (attempt, error) {
	c, k := r.c, r.k
	if k.hold != nil {
		if err := k.hold.fence(k.ctx); err != nil {
			return attempt{}, err
		}
	}
	r.fresh = false
	r.res.Attempts = k.rt.attempt()
	var a attempt
	// Marked before the request, the state watch cannot miss the end of
	// a change that refuses it.
	if a.watched = c.state.open(); a.watched {
		a.mark = c.state.mark()
	}
	k.flight.set(flightSent) // machinemerge.go: no process joins from now on
	a.sent = c.view.sending(c.clock.Now())
	a.sentAt = a.sent.at
	actx, cancel := k.actCtx()
	if k.hold != nil && !k.hold.sendBy.IsZero() {
		actx = snapd.WithSendBy(actx, k.hold.sendBy)
	}
	a.changeID, a.err = c.post(actx, r.o)
	// Cut off: the request failed because its time ran out. An answer
	// snapd gave (an error response) is an answer, even one that arrived
	// as the time ran out.
	var answer *snapd.Error
	a.cutOff = actx.Err() != nil && a.err != nil && !errors.As(a.err, &answer)
	cancel()
	a.answeredAt = c.clock.Now()
	if !a.cutOff && !errors.Is(a.err, snapd.ErrSendDeadline) { // neither says anything about snapd
		k.observe(a.err)
	}
	if k.hold != nil && mayHaveWritten(a.err) {
		k.hold.acted()
		if a.err != nil && !errors.As(a.err, &answer) {
			k.hold.noAnswer(r.o, a.sent, a.answeredAt)
		}
	}
	if a.err != nil {
		k.last, r.actErr = a.err, a.err
		a.step = nextStep(acting, a.err)
		if a.step == waitOut || !mayHaveWritten(a.err) {
			k.flight.set(flightOpen) // it did nothing: other processes may join again
		}
	}
	return a, nil
}

// mayHaveWritten reports whether a request that ended with err may have
// reached snapd: it was answered, or it failed after its first byte could
// be written.
func mayHaveWritten(err error) bool {
	if err == nil {
		return true
	}
	if errors.Is(err, snapd.ErrSendDeadline) {
		return false
	}
	var ce *snapd.ConnectionError
	if errors.As(err, &ce) {
		return ce.Written
	}
	return true
}

// post makes one request to act.
func (c *Client) post(ctx context.Context, o op) (string, error) {
	if c.mode == ModeSnapctl {
		_, err := c.ctl.RunSnapctl(ctx, snapd.SnapctlRequest{ContextID: c.cookie, Args: o.snapctlArgs()})
		return "", err
	}
	return c.main.PostApps(ctx, o.instruction())
}

// accepted handles snapd's acceptance of the request: the change is
// queued (a configure hook), done already (snapctl answers once its change
// is ready), or waited for (REST).
func (r *runner) accepted(a attempt, wait bool) (*Result, bool, error) {
	c, k := r.c, r.k
	k.flog.end(k.log)
	c.interval.record(r.o)
	if c.queuesInHook() {
		k.log.Info("queued by snapd until the hook ends", "hook", c.hook, "attempt", r.res.Attempts)
		r.res.Queued = true
		return r.res, true, nil
	}
	if c.mode == ModeSnapctl {
		return r.snapctlDone(a)
	}
	r.res.ChangeID = a.changeID
	c.view.saw(a.changeID)
	c.snaps.claim(r.o, a.changeID)
	ev := k.event(EventAccepted)
	ev.ChangeID = a.changeID
	c.events.emit(ev)
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
	all, err := k.wholeSnapServices(r.o)
	var chgs []snapd.Change
	if err == nil && !c.view.listingRefused() {
		chgs, err = k.listOnce(snapd.SelectAll)
		c.view.noteListing(err, c.mode)
	}
	if err == nil {
		if id := queuedIn(chgs, r.o, all, c.view.clock.snapdTime(a.sentAt), c.view.clock.snapdTimeLate(a.answeredAt)); id != "" {
			k.log.Info("queued by snapd until the hook ends", "change", id, "attempt", r.res.Attempts)
			r.res.Queued, r.res.ChangeID = true, id
			return r.res, true, nil
		}
		r.res.ChangeID = r.k.claimOpChange(chgs, r.o, all, a.sent, a.answeredAt, r.known)
		if r.res.ChangeID == "" {
			// snapd's clock may not read the client's (it has not been
			// learned in this mode yet): find the change by snapd's
			// counter instead, where the client had listed the changes
			// before sending (any earlier operation's listing here did).
			r.res.ChangeID = r.k.claimBySequence(chgs, r.o, all, a, r.known)
		}
		c.learnClock(chgs, r.res.ChangeID, a)
	}
	r.res.Status = snapd.StatusDone
	ev := k.event(EventAccepted)
	ev.ChangeID = r.res.ChangeID
	c.events.emit(ev)
	k.log.Info("done", "change", r.res.ChangeID, "attempt", r.res.Attempts)
	return r.res, true, nil
}

// learnClock narrows what the Client knows of snapd's clock with change
// id, found in chgs, made by attempt a: snapd spawned it between the
// request's send and its answer. In REST mode the wait for the change does
// this (owntiming.go); in snapctl mode, where snapd names no change, it is
// the only way the client learns snapd's clock, on which finding the
// change of a lost answer depends.
func (c *Client) learnClock(chgs []snapd.Change, id string, a attempt) {
	if id == "" {
		return
	}
	for i := range chgs {
		if chgs[i].ID == id {
			c.view.clock.noteOffset(chgs[i].SpawnTime, a.sentAt, a.answeredAt)
			return
		}
	}
}

// finish waits for the operation's change (wait) or records it as pending
// for the next operation on these snaps (async).
func (c *Client) finish(k *call, o op, res *Result, wait bool, wo waitOpts) (*Result, bool, error) {
	if !wait {
		c.snaps.addPending(o, res.ChangeID)
		return res, false, nil
	}
	chg, err := k.ownChange().waitChange(res.ChangeID, wo)
	if err != nil {
		var ce *ChangeError
		if !errors.As(err, &ce) {
			// Could not see the end; let the next operation wait for it.
			c.snaps.addPending(o, res.ChangeID)
			if wo.found {
				err = adoptedWaitError(res.ChangeID, err)
			}
		}
		k.log.Info("change failed", "change", res.ChangeID, "error", err)
		return nil, false, c.opError(o, res.ChangeID, res.Attempts, err)
	}
	res.Status = chg.Status
	k.log.Info("change done", "change", res.ChangeID, "attempt", res.Attempts)
	return res, true, nil
}

// refused ends an operation snapd refused for good (an unknown service, a
// failed change reported by snapctl).
func (r *runner) refused(a attempt) (*Result, bool, error) {
	r.k.log.Info("failed", "attempt", r.res.Attempts, "error", a.err)
	err := a.err
	id := r.k.changeFailure(r.o, a.sentAt, &err)
	return r.fail(id, err)
}
