package snapsvc

import (
	"context"
	"errors"
	"strings"

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

// runner is the state of one operation while it runs.
type runner struct {
	c     *Client
	k     *call
	o     op
	locks *snapLocks // nil while the locks are not held
	res   *Result
	skip  string // the running hook's own change, never a blocker
	known map[string]bool
	cad   *cadence // blind waits (cadence.go), made at the first: see cadence
	// onLocked, when set, is called once the operation holds its snaps'
	// locks (merge.go: identical restarts may join it until then).
	onLocked func()

	unseen     int  // conflicts in a row whose blocker was not seen
	fresh      bool // an attempt is owed right after waiting out a blocker
	optimistic bool // the last conflict was retried at a state rewrite
}

// next says what an operation does after an attempt that did not end it.
type next int

const (
	tryAgain  next = iota // at once
	tryFresh              // at once: a blocker just ended (owed even out of time)
	tryPaused             // after the policy's pause
)

// cadence is the operation's blind wait (cadence.go), made at its first
// use: most operations never wait blind.
func (r *runner) cadence() *cadence {
	if r.cad == nil {
		r.cad = newCadence(r.c.clock, r.k.rt.Policy().MaxConflictInterval)
	}
	return r.cad
}

// run carries out one operation on its call: lock, send until snapd
// accepts, wait for the change, judge it. done reports whether the outcome
// is final.
func (c *Client) run(k *call, o op, wait bool, onLocked func()) (*Result, bool, error) {
	r := &runner{c: c, k: k, o: o, res: &Result{}, known: map[string]bool{}, onLocked: onLocked}
	if err := r.lock(); err != nil {
		return r.fail("", err)
	}
	defer r.unlock()
	for {
		if err := r.mayTry(); err != nil {
			return r.fail("", err)
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

func (r *runner) fail(changeID string, err error) (*Result, bool, error) {
	r.k.flog.gaveUp(r.k.log)
	return nil, false, r.c.opError(r.o, changeID, r.res.Attempts, err)
}

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
	h, err := c.takeBudget(k, o)
	if err != nil {
		return nil, err
	}
	k.hold = h
	res, err := c.coalesce(k, o)
	if h != nil {
		err = c.releaseBudget(k, o, h, res, err)
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// runAsync is runSync up to snapd's acceptance; the wait, and the release
// of the budget's slots, go on in the background (budget_rule.go,
// holdAsync). EventDone or EventFailed comes from the first
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
	h, err := c.takeBudget(k, o)
	if err != nil {
		return nil, err
	}
	k.hold = h
	res, done, err := c.run(k, o, false, nil)
	if err != nil {
		if h != nil {
			err = c.releaseBudget(k, o, h, nil, err)
		}
		return nil, err
	}
	op := &Operation{c: c, op: o, result: *res, done: done}
	if h != nil {
		c.holdAsync(k, op, h, done)
	}
	return op, nil
}

// newOpCall begins the call of operation o, its log lines naming it.
func (c *Client) newOpCall(ctx context.Context, o op) *call {
	k := c.newCall(ctx, callOp, o.action, o.t.names)
	k.log = k.log.With("snap", strings.Join(o.t.snaps, ","), "action", o.action, "names", o.t.String())
	return k
}
