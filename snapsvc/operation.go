package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// The life of one operation (Start, Stop, Restart), phase by phase. An
// operation (below) holds everything one Start, Stop or Restart takes
// while it runs: its call (call.go: every bound of it), the restart
// budget's slots, the snaps' locks, the identical restarts it leads, the
// snap's blocker it watches for the machine's processes, and its result.
// runSync and runAsync are its phase table; each phase is a method of
// operation, in the file that says how it works:
//
//	bound    newOperation: the call's deadline, MaxUnreachable, MaxAttempts
//	pace     pace: WithMinRestartInterval, before anything is held (lock.go)
//	budget   takeBudget: the restart budget's slots (budget_take.go)
//	merge    merge: identical restarts not sent yet share one (share.go)
//	lock     lock: the snaps' locks, in and across processes; paced again
//	         should a restart have gone ahead meanwhile (lock.go)
//	send     try: fence the slots, then one request to act
//	conflict conflict: someone else's change (conflict.go)
//	find     lost: the change of a request whose answer was lost
//	         (lostanswer.go, matching.go)
//	wait     finish: the operation's own change (changewait.go)
//	verdict  accepted, refused: what the change did
//	release  hold.end: the slots, given back only once the outcome is
//	         final and the services are ready (budget_lifecycle.go)
//
// act covers lock to verdict: it sends until snapd accepts the request
// (waiting out conflicts, finding the change of a lost answer, pausing
// while snapd is away), then waits for the change.

// operation is one Start, Stop or Restart while it runs. Operation (the
// exported type) is the handle an asynchronous one returns.
type operation struct {
	c   *Client
	k   *call   // its bounds (call.go)
	o   request // what it asks (request.go)
	res *Result // what it did so far

	// What it holds, each let go of by the phase that took it.
	hold     *hold           // the restart budget's slots (budget_lifecycle.go)
	locks    *snapLocks      // the snaps' locks; nil while not held (lock.go)
	flight   *flight         // the process's identical restarts it leads until it holds the locks (processflight.go)
	lead     *leadFlight     // the machine's identical restarts it leads (machineflight.go)
	watcher  *machineWatcher // while it watches its snap for the machine (machinewait.go)
	followed *peerRecord     // the machine's watcher of its snap, while it follows it (machinewait.go)

	// What it learned on the way.
	skip       string               // the running hook's own change, never a blocker
	known      map[string]bool      // changes it waited out or ruled out: never its own
	cad        *cadence             // blind waits (cadence.go), made at the first: see cadence
	unseen     int                  // conflicts in a row whose blocker was not seen
	held       *retry.ConflictError // the conflict being waited out, until its blocker is seen to end (countConflict)
	fresh      bool                 // an attempt is owed right after waiting out a blocker
	optimistic bool                 // the last conflict was retried at a state rewrite
	expired    int                  // fences in a row whose confirmation ran out before the write
	actErr     error                // the failure of the last request to act
	alone      bool                 // a budgeted restart that found an identical one it may not join

	// WithIntents (intent.go, replay.go).
	intent *intentRecord // its intent, held while it runs
	replay *replayState  // the intent it replays, for a replay
}

// newOperation is the bound phase: it validates the request and begins
// its call; op.k.end must be called once it returns.
func (c *Client) newOperation(ctx context.Context, action string, names []string, set func(*request)) (*operation, error) {
	o, err := c.prepare(action, names, set)
	if err != nil {
		return nil, err
	}
	if err := c.awaitStartup(ctx, o); err != nil {
		return nil, err
	}
	return c.operationOn(c.newCall(ctx, callOp, o.action, o.t.names), o), nil
}

// operationOn is the operation of request o on call k (EnsureRunning's
// read and operation share one call), its log lines naming it.
func (c *Client) operationOn(k *call, o request) *operation {
	k.ev.Names = o.t.names
	k.log = k.log.With("snap", strings.Join(o.t.snaps, ","), "action", o.action, "names", o.t.String())
	return &operation{c: c, k: k, o: o, res: &Result{}, known: map[string]bool{}}
}

// runSync is the life of one synchronous operation, its events
// (EventStarted, then EventDone or EventFailed) around it.
func (c *Client) runSync(ctx context.Context, action string, names []string, set func(*request)) (*Result, error) {
	started := c.events.opStarted(action, names)
	res, err := func() (*Result, error) {
		op, err := c.newOperation(ctx, action, names, set)
		if err != nil {
			return nil, err
		}
		defer op.k.end()
		if err := op.recordIntent(); err != nil {
			return nil, err
		}
		res, err := op.run()
		op.intent.end(ctx, res, err)
		return res, err
	}()
	c.events.opEnded(action, names, started, res, err)
	return res, err
}

// run is the phase table of a synchronous operation.
func (op *operation) run() (*Result, error) {
	if err := op.pace(); err != nil {
		return nil, op.c.opError(op.o, "", 0, err)
	}
	if op.c.budget != nil {
		if err := op.takeBudget(); err != nil {
			return nil, err
		}
	}
	res, err := op.merge()
	if op.hold != nil {
		err = op.hold.end(op.k, op.o, res, err)
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
func (c *Client) runAsync(ctx context.Context, action string, names []string, set func(*request)) (*Operation, error) {
	started := c.events.opStarted(action, names)
	handle, err := c.accept(ctx, action, names, set)
	if err != nil {
		c.events.opEnded(action, names, started, nil, err)
		return nil, err
	}
	handle.mu.Lock()
	handle.obs.started = started
	handle.mu.Unlock()
	return handle, nil
}

// accept is the phase table of an asynchronous operation, up to snapd's
// acceptance.
func (c *Client) accept(ctx context.Context, action string, names []string, set func(*request)) (*Operation, error) {
	op, err := c.newOperation(ctx, action, names, set)
	if err != nil {
		return nil, err
	}
	defer op.k.end()
	if err := op.recordIntent(); err != nil {
		return nil, err
	}
	handle, err := op.accept()
	if err != nil {
		op.intent.end(ctx, nil, err)
		return nil, err
	}
	op.intent.handedOver() // snapd's change is its own record from now on
	return handle, nil
}

// accept is the phase table of an asynchronous operation on its call,
// up to snapd's acceptance.
func (op *operation) accept() (*Operation, error) {
	c := op.c
	if err := op.pace(); err != nil {
		return nil, op.c.opError(op.o, "", 0, err)
	}
	if op.c.budget != nil {
		if err := op.takeBudget(); err != nil {
			return nil, err
		}
	}
	res, done, err := op.act(false)
	if err != nil {
		if op.hold != nil {
			err = op.hold.end(op.k, op.o, nil, err)
		}
		return nil, err
	}
	handle := &Operation{c: c, op: op.o, result: *res, done: done}
	if op.hold != nil {
		op.hold.endAsync(op.k, handle, done)
	}
	return handle, nil
}

// cadence is the operation's blind wait (cadence.go), made at its first
// use: most operations never wait blind.
func (op *operation) cadence() *cadence {
	if op.cad == nil {
		op.cad = newCadence(op.c.clock, op.k.rt.policy().MaxConflictInterval)
	}
	return op.cad
}

// next says what an operation does after an attempt that did not end it.
type next int

const (
	tryAgain  next = iota // at once
	tryFresh              // at once: a blocker just ended (owed even out of time)
	tryPaused             // after the policy's pause
)

// act carries out the operation from lock to verdict: lock, send until
// snapd accepts, wait for the change (wait) or leave it pending, judge
// it. done reports whether the outcome is final.
func (op *operation) act(wait bool) (*Result, bool, error) {
	k := op.k
	if err := op.lock(); err != nil {
		return op.fail("", err)
	}
	defer op.unlock()
	defer func() {
		if op.watcher != nil || op.followed != nil {
			op.stopWatching() // machinewait.go: before the snap's file lock goes
		}
	}()
	if op.replay != nil {
		// A replay decides first what is left of its intent (replay.go).
		if res, done, err, ended := op.resume(wait); ended {
			return res, done, err // its errors are the operation's already
		}
	}
	for {
		if err := op.mayTry(); err != nil {
			return op.fail("", err)
		}
		if ce, joined, busy := op.busyElsewhere(); busy {
			// Another process of the machine waits the snap's blocker out:
			// follow what it sees instead of asking snapd (machinewait.go).
			if err := op.aboutToWait(); err != nil {
				return op.fail("", err)
			}
			op.countConflict(ce)
			then, err := op.follow(ce, joined)
			if err != nil {
				return op.fail("", err)
			}
			op.fresh = then == tryFresh
			continue
		}
		a, err := op.try()
		if err != nil {
			return op.fail("", err)
		}
		if a.err == nil {
			return op.accepted(a, wait)
		}
		if errors.Is(a.err, snapd.ErrSendDeadline) {
			// The fence's confirmation ran out before the request's first
			// byte was written: snapd saw nothing. Fence again, a few
			// times: a budget whose confirmations always run out first
			// must not spin.
			if op.expired++; op.expired >= maxExpiredFences {
				return op.fail("", &BudgetError{Key: op.hold.keys(), Err: fmt.Errorf("%w: %d fences in a row confirmed the slot for less time than it took to write the request (nothing was sent)", ErrBudgetUnavailable, op.expired)})
			}
			k.log.Info("the restart budget's confirmation ran out before the request was written; fencing again", "attempt", op.res.Attempts)
			continue
		}
		op.expired = 0
		if o := op.o; o.refresh != nil && isNoUpdate(a.err) && !a.cutOff {
			// Not a failure: snapd has nothing newer and made no change
			// (refresh_request.go).
			return op.noUpdate()
		}
		if a.step == giveUp && !a.cutOff {
			// snapd's answer is final (the request refused for good, or,
			// from snapctl, its change failed): that the call's time ran
			// out as it came changes nothing, and it is never retryable.
			return op.refused(a)
		}
		if a.cutOff || k.ctx.Err() != nil {
			return op.interruptedAt(a)
		}
		// The retry rule (retryrule.go) says what the failure calls for.
		var then next
		switch a.step {
		case giveUp:
			return op.refused(a)
		case waitOut:
			if op.k.rt.outOfAttempts() {
				// No attempt may follow: waiting the blocker out would only
				// end in giving up (MaxAttempts 1 means one attempt).
				ce, _ := retry.AsConflict(a.err)
				op.res.Refused++
				op.countConflict(ce)
				return op.fail("", op.k.exhausted(ce))
			}
			then, err = op.conflict(a)
		case lookUp:
			var res *Result
			var done bool
			res, done, then, err = op.lost(a, wait)
			if res != nil || err != nil {
				return res, done, err
			}
		case askAgain:
			if !op.k.unreachableNow() || op.k.redials() { // else the pause gives up at once: no back-off to announce
				op.k.flog.log(op.k.log, "unable to reach snapd", "snapd unavailable; backing off", "attempt", op.res.Attempts, "error", a.err)
			}
			then = tryPaused
		}
		if err != nil {
			return op.fail("", err)
		}
		op.fresh = then == tryFresh
		if then == tryPaused {
			if err := op.k.pause(a.err); err != nil {
				return op.fail("", err)
			}
		}
	}
}

func (op *operation) fail(changeID string, err error) (*Result, bool, error) {
	var ji *joinInstead
	if errors.As(err, &ji) {
		return nil, false, ji // not an end: it joins another flight (machineflight.go)
	}
	op.k.flog.gaveUp(op.k.log)
	return nil, false, op.c.opError(op.o, changeID, op.res.Attempts, err)
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
func (op *operation) mayTry() error {
	if op.k.rt.attempts() == 0 || (op.fresh && !op.k.rt.outOfAttempts()) {
		return nil
	}
	return op.k.exhausted(op.k.last)
}

// try makes one attempt: under a restart budget it first confirms the
// slots are still held (budget.go, fence) and, the first time, asks the
// admission check (budget_record.go), then sends the request to act,
// leaving the last of the call's time to look up its change.
func (op *operation) try() (attempt, error) {
	c, k := op.c, op.k
	if op.hold != nil {
		if err := op.hold.fence(k.ctx); err != nil {
			return attempt{}, err
		}
		// The application's admission check, once, on the fenced slots;
		// a wait for it is followed by a fresh fence.
		if waited, err := op.hold.admit(k.ctx, op.o); err != nil {
			return attempt{}, err
		} else if waited {
			if err := op.hold.fence(k.ctx); err != nil {
				return attempt{}, err
			}
		}
	}
	op.fresh = false
	op.res.Attempts = k.rt.attempt()
	var a attempt
	// Marked before the request, the state watch cannot miss the end of
	// a change that refuses it.
	if a.watched = c.state.open(); a.watched {
		a.mark = c.state.mark()
	}
	op.lead.set(flightSent) // machineflight.go: no process joins from now on
	a.sent = c.view.sending(c.clock.Now())
	a.sentAt = a.sent.at
	act := ""
	if op.hold != nil {
		act = op.hold.actID
	}
	if err := op.intent.sending(a.sent, c.view.clock.wallAt(a.sent.at), act); err != nil {
		return attempt{}, err // unrecorded, a send could not be told apart from none by a replay
	}
	actx, cancel := k.actCtx()
	if op.hold != nil && !op.hold.sendBy.IsZero() {
		actx = snapd.WithSendBy(actx, op.hold.sendBy)
	}
	a.changeID, a.err = c.post(actx, op.o)
	// Cut off: the request failed because its time ran out. An answer
	// snapd gave (an error response) is an answer, even one that arrived
	// as the time ran out.
	var answer *snapd.Error
	a.cutOff = actx.Err() != nil && a.err != nil && !errors.As(a.err, &answer)
	cancel()
	a.answeredAt = c.clock.Now()
	if _, refused := retry.AsConflict(a.err); refused || !mayHaveWritten(a.err) {
		// snapd refused it for a change in progress (no change made), or
		// it never left: nothing of it is in flight for a replay to find.
		op.intent.nothingSent()
	}
	if !a.cutOff && !errors.Is(a.err, snapd.ErrSendDeadline) { // neither says anything about snapd
		k.note(a.err)
	}
	if op.hold != nil && mayHaveWritten(a.err) {
		op.hold.acted()
		if a.err != nil && !errors.As(a.err, &answer) {
			op.hold.noAnswer(op.o, a.sent, a.answeredAt)
		}
	}
	if a.err != nil {
		k.last, op.actErr = a.err, a.err
		a.step = nextStep(acting, a.err)
		if a.step == waitOut || !mayHaveWritten(a.err) {
			op.lead.set(flightOpen) // it did nothing: other processes may join again
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
func (c *Client) post(ctx context.Context, o request) (string, error) {
	switch {
	case o.refresh != nil && o.refresh.file != "":
		return c.main.PostSideload(ctx, snapd.Sideload{Path: o.refresh.file, Name: o.t.snaps[0], Dangerous: true, Classic: o.refresh.classic})
	case o.refresh != nil:
		return c.main.PostSnap(ctx, o.t.snaps[0], o.refresh.instruction())
	case c.mode == ModeSnapctl:
		_, err := c.ctl.RunSnapctl(ctx, snapd.SnapctlRequest{ContextID: c.cookie, Args: o.snapctlArgs()})
		return "", err
	}
	return c.main.PostApps(ctx, o.instruction())
}

// accepted handles snapd's acceptance of the request: the change is
// queued (a configure hook), done already (snapctl answers once its change
// is ready), or waited for (REST).
func (op *operation) accepted(a attempt, wait bool) (*Result, bool, error) {
	c, k := op.c, op.k
	k.flog.end(k.log)
	c.interval.record(op.o)
	if c.queuesInHook() {
		k.log.Info("queued by snapd until the hook ends", "hook", c.hook, "attempt", op.res.Attempts)
		op.res.Queued = true
		return op.res, true, nil
	}
	if c.mode == ModeSnapctl {
		return op.snapctlDone(a)
	}
	op.res.ChangeID = a.changeID
	op.intent.accepted(a.changeID)
	c.view.saw(a.changeID)
	c.snaps.claim(op.o, a.changeID)
	ev := k.event(EventAccepted)
	ev.ChangeID = a.changeID
	c.events.emit(ev)
	k.log.Info("change created", "change", a.changeID, "attempt", op.res.Attempts)
	return c.finish(k, op.o, op.res, wait, waitOpts{fresh: true, kind: op.o.key(), sentAt: a.sentAt, answeredAt: a.answeredAt})
}

// snapctlDone handles snapctl's answer to a service command: outside
// configure hooks snapctl answers once the change is ready and Done
// (ctlcmd runServiceCommand waits for chg.Ready and returns chg.Err).
// Where snapd lets us list changes, it finds the change, and notices a
// command queued by a hook snapsvc could not identify.
func (op *operation) snapctlDone(a attempt) (*Result, bool, error) {
	c, k := op.c, op.k
	all, err := wholeSnapServices(k, op.o)
	var chgs []snapd.Change
	if err == nil && !c.view.listingRefused() {
		chgs, err = k.listOnce(snapd.SelectAll)
		c.view.noteListing(err, c.mode)
	}
	if err == nil {
		from, _, to := c.view.clock.spawnWindow(a.sentAt, a.answeredAt, c.clock.Now())
		if id := queuedIn(chgs, op.o, all, from, to); id != "" {
			k.log.Info("queued by snapd until the hook ends", "change", id, "attempt", op.res.Attempts)
			op.res.Queued, op.res.ChangeID = true, id
			return op.res, true, nil
		}
		// snapctl answered once its change was ready: a change not ready
		// now is someone else's, however alike (an identical restart
		// made since, where a look-up of another operation took this
		// one's change for its own). Claimed, it would be reported Done
		// while it runs.
		ready := slices.DeleteFunc(slices.Clone(chgs), func(c snapd.Change) bool { return !c.Ready })
		op.res.ChangeID = claimOpChange(op.k, ready, op.o, all, a.sent, a.answeredAt, op.known)
		if op.res.ChangeID == "" {
			// snapd's clock may not read the client's (it has not been
			// learned in this mode yet): find the change by snapd's
			// counter instead, where the client had listed the changes
			// before sending (any earlier operation's listing here did).
			op.res.ChangeID = op.claimBySequence(ready, all, a)
		}
		c.learnClock(ready, op.res.ChangeID, a)
		op.intent.accepted(op.res.ChangeID)
	}
	op.res.Status = snapd.StatusDone
	ev := k.event(EventAccepted)
	ev.ChangeID = op.res.ChangeID
	c.events.emit(ev)
	k.log.Info("done", "change", op.res.ChangeID, "attempt", op.res.Attempts)
	return op.res, true, nil
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
func (c *Client) finish(k *call, o request, res *Result, wait bool, wo waitOpts) (*Result, bool, error) {
	if !wait {
		c.snaps.addPending(o, res.ChangeID)
		return res, false, nil
	}
	chg, err := waitChange(k.ownChange(), res.ChangeID, wo)
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
func (op *operation) refused(a attempt) (*Result, bool, error) {
	op.k.log.Info("failed", "attempt", op.res.Attempts, "error", a.err)
	err := a.err
	id := op.changeFailure(a.sentAt, &err)
	return op.fail(id, err)
}
