package snapsvc

import (
	"errors"
	"fmt"
	"slices"
)

// Flights in process scope (share.go says the rule): a restart waiting
// for its snap's lock leads the identical restarts of the process that
// come while it waits; once it holds the lock (flight.close), those that
// come lead their own.

// flight is a restart waiting for its snap's lock that identical requests
// may join.
type flight struct {
	l        *snapLock // the snap's entry, where it waits (l.waiting)
	key      string
	budgeted bool // the leader holds restart budget slots (share.go: who may join)
	done     chan struct{}
	res      *Result
	err      error
	started  bool
}

// testHookMerge is called as a restart joins an identical restart of the
// process (true), or goes on without joining one: it leads them, or may
// not join the one under way (false) (export_test.go).
var testHookMerge = func(joined bool) {}

// errLeaderGone tells joiners that the request they joined ended before
// it acted (its caller gave up), so they must act themselves.
var errLeaderGone = errors.New("the identical restart joined ended before acting")

// merge is the merge phase of an operation: a restart of one snap joins
// an identical restart of the process waiting for the snap's lock, or
// leads one; a leader in turn merges with the identical restarts of the
// machine's other processes (mergeMachine, machineflight.go). A joiner
// waits on its own bounds, so joining never shortens or lengthens a
// caller's bound. Anything else acts at once.
func (op *operation) merge() (*Result, error) {
	c, k, o := op.c, op.k, op.o
	ctx := k.ctx
	if o.action != "restart" || len(o.t.snaps) != 1 || c.queuesInHook() {
		res, _, err := op.act(true)
		return res, err
	}
	l := c.snaps.of(o.t.snaps[0])
	// Only requests made the same way merge: same mode, context and hook.
	key := fmt.Sprintf("%s|%s|%s|%s", c.mode, c.cookie, c.hook, o.key())
	for {
		l.mu.Lock()
		if l.waiting == nil {
			l.waiting = map[string]*flight{}
		}
		f := l.waiting[key]
		if f == nil {
			break // lead, with l.mu held
		}
		l.mu.Unlock()
		if !op.mayJoin(f.budgeted) {
			k.log.Debug("an identical restart runs unbudgeted: this budgeted one acts on its own slot")
			testHookMerge(false)
			res, _, err := op.act(true)
			return res, err
		}
		k.log.Debug("joining an identical restart waiting for the snap's lock")
		testHookMerge(true)
		c.events.emit(k.event(EventJoined))
		select {
		case <-ctx.Done():
			return nil, c.opError(o, "", 0, ctxErr(ctx, "waiting for an identical restart"))
		case <-f.done:
		}
		if errors.Is(f.err, errLeaderGone) || !sharedOutcome(f.err) {
			// The leader ended without the change's outcome (it gave up
			// within its own policy or deadline, or cannot tell): that
			// says nothing about this caller's bounds, so it acts itself.
			continue
		}
		k.log.Debug("restart merged into an identical request", "change", resultChange(f.res))
		if f.err != nil {
			return nil, f.err
		}
		if op.hold != nil {
			op.hold.joinedAct() // the change restarted the services under this slot too (fenced before joining)
		}
		res := *f.res
		res.WaitedFor = slices.Clone(res.WaitedFor)
		res.Shared = true
		return &res, nil
	}
	f := &flight{done: make(chan struct{}), l: l, key: key, budgeted: op.hold != nil}
	l.waiting[key] = f
	l.mu.Unlock()
	k.log.Debug("leading identical restarts until the snap's lock is taken")
	testHookMerge(false)
	op.flight = f
	res, err := op.mergeMachine(key)
	op.flight = nil
	l.mu.Lock()
	if l.waiting[key] == f {
		delete(l.waiting, key)
	}
	started := f.started
	l.mu.Unlock()
	f.res, f.err = res, err
	if !started || (err != nil && ctx.Err() != nil) { // leader gave up: joiners act themselves
		f.err = errLeaderGone
	}
	close(f.done)
	return res, err
}

// mayJoin reports whether the operation may join an identical restart,
// budgeted or not (share.go's rule for budgets): one without a restart
// budget joins any; a budgeted one only a budgeted one (whose leader
// fences its own slot before its request), once its own slot is fenced
// too, and its admission check admits, so that the budget's pause,
// window, record of the act and the application's check hold for the
// restart it reports as its own. A fence that fails leaves it to act on
// its own, where the fence fails again and says why.
func (op *operation) mayJoin(budgeted bool) bool {
	if op.hold == nil {
		return true
	}
	if !budgeted {
		return false
	}
	if op.hold.fence(op.k.ctx) != nil {
		return false
	}
	// Its own admission check too: a restart it reports as its own is
	// one its application agreed to. While the check refuses, it does
	// not join (and acting alone, asks again).
	_, err := op.hold.admit(op.k.ctx, op.o)
	return err == nil
}

// close closes the flight of this process's identical restarts an
// operation leads, if any (f nil: none): it holds the snaps' locks now (or
// joins another process's restart), so those that come from now on lead
// their own.
func (f *flight) close() {
	if f == nil {
		return
	}
	f.l.mu.Lock()
	if f.l.waiting[f.key] == f {
		delete(f.l.waiting, f.key)
	}
	f.started = true
	f.l.mu.Unlock()
}

// sharedOutcome reports whether a leader's error is its change's own
// outcome (the change ran and failed), which every joiner shares; any
// other failure is the leader's alone.
func sharedOutcome(err error) bool {
	var ce *ChangeError
	return err == nil || errors.As(err, &ce)
}

func resultChange(r *Result) string {
	if r == nil {
		return ""
	}
	return r.ChangeID
}
