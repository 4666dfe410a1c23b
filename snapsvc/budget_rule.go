package snapsvc

import (
	"context"
	"errors"
	"slices"
	"strings"
)

// The slot rule. An operation's slots are given back only once its
// outcome is final and its services are ready again, on every path:
//
//   - nothing was done (the request was never sent, or snapd refused it,
//     or the operation gave up before snapd accepted anything): at once;
//   - the change failed for good (a *ChangeError: Error, Undone, Hold):
//     at once — nothing of it runs any more;
//   - the change is Done: once the readiness checks pass (then Settle);
//   - the change may still run (the call ended while waiting for it, or
//     found it after a lost answer and did not see it end), or the
//     outcome is unknown (snapd may have made a change, or may still make
//     one): held in the background until the change is ready (found
//     first, by a bounded look-up, when its id is not known), then until
//     the services are ready — exactly as an asynchronous operation's
//     slots are held.
//
// What is held in the background ends only that way, at the readiness
// checks' own bound (BudgetOptions.Probe.MaxWait), or at Close. A Stop
// under StopsAndStarts keeps its slots for the Start that follows (keep),
// unless nothing was done or its change failed.

// budgetKeys returns the budget keys of names: each "snap.app" name's key,
// and for a whole-snap name the keys of every one of its services (from
// snapd's apps listing, svcs when the caller read it already), so that a
// restart of "k8s" on one machine and of "k8s.kube-apiserver" on another
// take the same slot. A snap without services keeps its own name's key.
// It reads snapd only when a whole-snap name is given and svcs is nil.
func (k *call) budgetKeys(names []string, svcs []Service) ([]string, error) {
	c := k.c
	var snaps []string
	for _, n := range names {
		if !strings.Contains(n, ".") && !slices.Contains(snaps, n) {
			snaps = append(snaps, n)
		}
	}
	if len(snaps) > 0 && svcs == nil {
		var err error
		if svcs, err = k.services(snaps); err != nil {
			return nil, err
		}
	}
	var expanded []string
	for _, n := range names {
		if strings.Contains(n, ".") {
			expanded = append(expanded, n)
			continue
		}
		found := false
		for _, s := range svcs {
			if s.Snap == n {
				expanded, found = append(expanded, s.FullName()), true
			}
		}
		if !found {
			expanded = append(expanded, n)
		}
	}
	return c.budget.keysOf(expanded), nil
}

// applies reports whether o takes slots.
func (b *budgetRunner) applies(o op) bool {
	if b.c.queuesInHook() {
		return false
	}
	switch o.action {
	case "restart":
		return true
	case "stop", "start":
		return b.opts.StopsAndStarts
	}
	return false
}

// takeBudget is the budget phase of an operation: it takes (or, for a
// Start, finds) the slots o needs. A nil hold means o runs unbudgeted. A
// restart paced by WithMinRestartInterval waits out its interval first, so
// no slot is held while pacing.
func (c *Client) takeBudget(k *call, o op) (*hold, error) {
	b := c.budget
	if b == nil || !b.applies(o) {
		return nil, nil
	}
	if o.action == "start" {
		keys, err := k.budgetKeys(o.t.names, nil)
		if err != nil {
			return nil, c.opError(o, "", 0, err)
		}
		h := b.kept(keys)
		if h != nil {
			h.watch()
		}
		return h, nil
	}
	names := o.t.names
	var svcs []Service
	if o.action == "stop" {
		running, all, err := k.running(o)
		if err != nil {
			return nil, c.opError(o, "", 0, err)
		}
		names, svcs = running, all
	}
	keys, err := k.budgetKeys(names, svcs)
	if err != nil {
		return nil, c.opError(o, "", 0, err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	if err := k.keepInterval(o); err != nil { // a no-op unless a restart must be paced
		return nil, c.opError(o, "", 0, err)
	}
	h, err := b.takeAll(k.ctx, keys)
	if err != nil {
		return nil, c.opError(o, "", 0, err)
	}
	return h, nil
}

// releaseBudget is the release phase of a synchronous operation that
// took h: res and err are the operation's outcome, which it returns,
// joined with what the readiness checks met. The caller's time bounds
// only the wait for readiness here; past it the slots stay held in the
// background (see the slot rule).
func (c *Client) releaseBudget(k *call, o op, h *hold, res *Result, err error) error {
	b := c.budget
	switch v := budgetVerdictOf(err); {
	case v == verdictNothingDone || v == verdictFailed:
		h.release(k.ctx)
		return err
	case o.action == "stop":
		b.keep(k.ctx, h)
		return err
	case v == verdictRunning || v == verdictUnknown:
		k.log.Info("the operation's outcome is not final; its restart budget slots stay held until its change is ready and its services are ready", "error", err)
		b.holdInBackground(k, o, h, func(bk *call) (bool, error) { return settleChange(bk, o, err) })
		return err
	}
	// Done: ready on the caller's time (the bound of the wait for its own
	// change: Policy.ChangeWait), or, past it, in the background.
	rk := k.ownChange()
	rerr := h.ready(rk.ctx, o)
	if rerr != nil && rk.ctx.Err() != nil {
		k.log.Info("services not ready within the call's time; the restart budget slots stay held until they are", "error", rerr)
		b.holdInBackground(k, o, h, func(*call) (bool, error) { return true, nil })
		return c.opError(o, res.ChangeID, res.Attempts, rerr)
	}
	if rerr == nil {
		rerr = h.lost()
	}
	h.release(rk.ctx)
	if rerr != nil {
		return c.opError(o, res.ChangeID, res.Attempts, rerr)
	}
	return nil
}

// budgetVerdict sorts an operation's outcome for the slot rule.
type budgetVerdict int

const (
	verdictDone        budgetVerdict = iota // the change is Done
	verdictNothingDone                      // nothing was done: no change made, none can be
	verdictFailed                           // the change failed for good
	verdictRunning                          // a change was made and may still run
	verdictUnknown                          // snapd may have made a change, or may still make one
)

func budgetVerdictOf(err error) budgetVerdict {
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

// settleChange waits, on the background call bk, until the change of an
// operation that ended with err (verdictRunning or verdictUnknown) is
// ready: the change it names, or the one a look-up finds (the look-up
// that ran when the call ended, or a new one, each looking for
// interruptGrace: snapd may make the change late). It reports whether a change was found and ran its
// course: the services must then be ready before the slots go.
func settleChange(bk *call, o op, err error) (bool, error) {
	c := bk.c
	id := ""
	var oe *OpError
	if errors.As(err, &oe) {
		id = oe.ChangeID
	}
	if id == "" {
		var ue *outcomeUnknownError
		if !errors.As(err, &ue) {
			return false, nil
		}
		switch {
		case ue.found != nil:
			select {
			case id = <-ue.found:
			case <-bk.ctx.Done():
				return false, bk.ctx.Err()
			}
		case !ue.sent.at.IsZero():
			lctx, cancel := context.WithTimeout(bk.ctx, interruptGrace)
			lk := c.newCall(lctx, callWait, o.action, o.t.names)
			id = lk.lookFor(o, ue.sent, nil)
			lk.end()
			cancel()
		}
		if id == "" {
			return false, nil // no change was made: nothing to wait for
		}
	}
	_, werr := bk.sharedWaitChange(id)
	var ce *ChangeError
	if errors.As(werr, &ce) {
		return !ce.ChangeFailed(), nil
	}
	return werr == nil, werr
}

// holdInBackground keeps h after its operation returned, until settle
// says the change ran its course (then the services must be ready) or that
// there was none, and gives the slots back. It stops at Close (the slots
// are given back then too).
func (b *budgetRunner) holdInBackground(k *call, o op, h *hold, settle func(bk *call) (bool, error)) {
	log := k.log
	b.goCall(k, o, func(bctx context.Context, bk *call) {
		ran, err := settle(bk)
		switch {
		case err != nil:
			log.Info("could not see the change end; giving the restart budget slots back", "error", err)
		case ran:
			if rerr := h.ready(bctx, o); rerr != nil {
				log.Info("services not ready; giving the restart budget slots back", "error", rerr)
			}
		}
		h.release(bctx)
	})
}

// asyncHold finishes a budgeted asynchronous operation in the background:
// it waits for the change and the services' readiness, then gives the
// slots back, whether or not anyone calls Operation.Wait.
type asyncHold struct {
	done chan struct{}
	err  error
}

// wait returns the background's outcome, or ctx's end.
func (a *asyncHold) wait(ctx context.Context) error {
	select {
	case <-a.done:
		return a.err
	case <-ctx.Done():
		return ctxErr(ctx, "waiting for the services to be ready before giving back the restart budget slot")
	}
}

// budgetWait waits, under WithRestartBudget, until the operation's
// services are ready and its slots given back (nil without a budget).
func (o *Operation) budgetWait(ctx context.Context) error {
	if o.budget == nil {
		return nil
	}
	return o.budget.wait(ctx)
}

// holdAsync is the release phase of an asynchronous operation that snapd
// accepted: a Stop keeps its slots for the Start that follows; anything
// else waits in the background for its change and its services, then gives
// the slots back (the slot rule).
func (c *Client) holdAsync(k *call, op *Operation, h *hold, done bool) {
	b, o, res := c.budget, op.op, op.result
	if o.action == "stop" {
		b.keep(k.ctx, h)
		return
	}
	a := &asyncHold{done: make(chan struct{})}
	op.budget = a
	b.goCall(k, o, func(bctx context.Context, bk *call) {
		defer close(a.done)
		var werr error
		if !done && res.ChangeID != "" {
			if _, err := bk.sharedWaitChange(res.ChangeID); err != nil {
				werr = c.opError(o, res.ChangeID, res.Attempts, err)
			}
		}
		a.err = c.releaseBudget(bk, o, h, &res, werr)
	})
}

// running returns the names of o that name a running service (or a snap
// with one), and the services it read.
func (k *call) running(o op) ([]string, []Service, error) {
	svcs, err := k.services(o.t.names)
	if err != nil {
		return nil, nil, err
	}
	var out []string
	for _, n := range o.t.names {
		for _, s := range svcs {
			if s.Active && (s.FullName() == n || s.Snap == n) {
				out = append(out, n)
				break
			}
		}
	}
	return out, svcs, nil
}
