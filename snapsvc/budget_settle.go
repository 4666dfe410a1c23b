package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// Settling: a hold that outlives its operation (its change may still run,
// or whether it made one is unknown, or its services were not ready within
// the caller's time) follows snapd's own records in the background until
// the slot rule lets it go (budget_lifecycle.go). Its calls never give up on
// their own; Close, a lost slot and BudgetOptions.MaxHold end them.

// settleInBackground keeps h after its operation's call k returned (err:
// the operation's outcome, nil when its change is Done) until the slot
// rule lets it go: snapd's records show the change ready (or that the
// request made none), then the services pass their checks. It runs on a
// hold call (newHoldCall), which never gives up on its own; Close, a lost
// slot and BudgetOptions.MaxHold end it, the first and the last by
// abandoning the slots (the change may still run). MaxHold counts only
// while the hold cannot see its change: each time it runs out, the change
// is read once, and while snapd shows it the hold keeps on. A Start that took the slots a Stop kept and did not start its
// services keeps them. a, when set, learns the end (an asynchronous
// operation's Wait).
func (h *hold) settleInBackground(k *call, o request, err error, a *asyncHold) {
	b := h.b
	log := k.log
	if err != nil {
		h.move(holdSettling)
		b.emitAll(h, BudgetEvent{Kind: BudgetSettling, Err: err})
	}
	b.c.bg.run(func() {
		var aerr error
		if a != nil {
			defer func() { a.err = aerr; close(a.done) }()
		}
		hctx, cancel := context.WithCancel(context.WithoutCancel(k.ctx))
		defer cancel()
		stopClose := context.AfterFunc(b.base, cancel)
		defer stopClose()
		stopLost := h.onLost(cancel)
		defer stopLost()
		var expired <-chan struct{}
		timerDone := make(chan struct{})
		if b.opts.MaxHold > 0 {
			ch := make(chan struct{})
			expired = ch
			// scoped: ends with the hold's context, and is joined before
			// the hold lets go of its slots (it reads them to emit).
			go func() {
				defer close(timerDone)
				for {
					t := b.c.clock.NewTimer(b.opts.MaxHold)
					select {
					case <-t.C():
					case <-hctx.Done():
						t.Stop()
						return
					}
					if id := h.changeID(); id != "" && b.c.changeSeen(hctx, id) {
						b.emitAll(h, BudgetEvent{Kind: BudgetHoldRunning, Err: fmt.Errorf("held past BudgetOptions.MaxHold (%s): snapd shows change %s", b.opts.MaxHold, id)})
						log.Info("held past BudgetOptions.MaxHold: snapd shows the change, which the hold follows to its end", "change", id, "max_hold", b.opts.MaxHold)
						continue
					}
					if hctx.Err() != nil {
						return // the hold ended while the change was read
					}
					close(ch)
					cancel()
					return
				}
			}()
		}
		bk := b.c.newHoldCall(hctx, o)
		defer bk.end()
		seen, ferr := settleRan, error(nil)
		switch {
		case err != nil:
			seen, ferr = h.awaitOutcome(bk, o, err)
		case h.checked:
			seen = settleChecked
		}
		late := false
		if seen != settleEnded && h.lost() == nil && hctx.Err() == nil {
			late = h.quiet(bk)
		}
		abandon := false
		switch {
		case h.lost() != nil:
			// The others' change may still run: they are abandoned, not
			// released (schedule seed 976 under load: a lost slot of one
			// key gave back the other's while its change ran).
			log.Info("a restart budget slot was lost while settling; the others are abandoned, their change may still run", "error", h.lost())
			abandon = true
		case isClosed(expired):
			why := fmt.Errorf("held for BudgetOptions.MaxHold (%s) without snapd's records showing the change's end", b.opts.MaxHold)
			b.emitAll(h, BudgetEvent{Kind: BudgetHoldExpired, Err: why})
			h.judge(budget.OutcomeFailed, why.Error(), "")
			abandon = true
		case hctx.Err() != nil: // Close: the change may still run
			abandon = true
		case seen == settleRan || late:
			rctx, rcancel := context.WithCancel(context.WithoutCancel(hctx))
			stop := context.AfterFunc(b.base, rcancel)
			aerr = h.ready(rctx, o)
			stop()
			rcancel()
			switch {
			case aerr != nil && b.base.Err() != nil:
				abandon = true // Close while the services were not ready yet
			case aerr != nil:
				log.Info("services not ready; giving the restart budget slots back", "error", aerr)
				h.judge(budget.OutcomeFailed, "not ready after the change: "+aerr.Error(), "")
			}
		}
		if seen == settleFailed && aerr == nil {
			aerr = b.c.opError(o, changeIDOf(err), 0, ferr)
			h.judge(budget.OutcomeFailed, failureReason(ferr), changeIDOf(err))
		}
		rctx := context.WithoutCancel(hctx)
		cancel()
		if expired != nil {
			<-timerDone
		}
		switch {
		case abandon:
			h.abandon(rctx)
		case h.fromStop && o.action == "start" && (seen == settleFailed || seen == settleNone || aerr != nil):
			b.keep(rctx, h) // its services are still down
		default:
			h.release(rctx)
		}
	})
}

// changeSeen reports whether snapd shows change id, with one read bounded
// by ctx and a few seconds: a hold past MaxHold that can see its change
// (running, or ready and about to be followed to its end) keeps on.
func (c *Client) changeSeen(ctx context.Context, id string) bool {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.main.Change(rctx, id)
	return err == nil
}

// settleSeen is what snapd's records showed of an operation's change.
type settleSeen int

const (
	settleRan     settleSeen = iota // the change ran its course (Done, or gone)
	settleFailed                    // the change failed for good: nothing of it runs
	settleNone                      // the request made no change
	settleEnded                     // the hold's call ended first (Close, lost, MaxHold)
	settleChecked                   // the change ran its course and its services were checked on the caller's time
)

// awaitOutcome waits, on the hold call bk, until snapd's records show the change
// of operation o, which ended with err (verdictRunning or verdictUnknown),
// ready: the change err names, or the one a look-up finds. Where the
// records cannot be read (snapd refuses this client its changes, or is
// away), it keeps the hold until bk ends: a refused look-up is not "no
// change was made".
func (h *hold) awaitOutcome(bk *call, o request, err error) (settleSeen, error) {
	id := ""
	var oe *OpError
	if errors.As(err, &oe) {
		id = oe.ChangeID
		h.setChange(id)
	}
	if id == "" {
		var ue *outcomeUnknownError
		if !errors.As(err, &ue) {
			return settleNone, nil
		}
		res := ue.lookedUp(bk, o)
		for res.id == "" && !res.listed && !res.refused && bk.ctx.Err() == nil {
			// snapd could not be asked within the look-up's grace: ask
			// until it answers (it handles nothing while away).
			if bk.pause(errNotListed) != nil {
				break
			}
			res = lookOnce(bk, o, ue)
		}
		switch {
		case res.id != "":
			id = res.id
			h.setChange(id)
		case res.listed:
			return settleNone, nil // snapd's records show no change made for the request
		case bk.ctx.Err() != nil:
			return settleEnded, nil
		default:
			bk.log.Info("cannot see whether the request made a change; the restart budget slots stay held", "max_hold", h.b.opts.MaxHold)
			<-bk.ctx.Done()
			return settleEnded, nil
		}
	}
	return h.awaitReady(bk, id)
}

// awaitReady waits, on the hold call bk, until snapd's records show
// change id ready (or gone). Only bk's end stops it: a wait's own failure
// never ends a hold, and a change snapd refuses to show keeps it until
// then.
func (h *hold) awaitReady(bk *call, id string) (settleSeen, error) {
	for {
		_, werr := processWaits.change(bk, id)
		var ce *ChangeError
		switch {
		case werr == nil:
			return settleRan, nil
		case errors.As(werr, &ce) && ce.ChangeFailed():
			return settleFailed, werr
		case errors.As(werr, &ce):
			return settleRan, nil // gone (pruned): its end has passed
		case bk.ctx.Err() != nil:
			return settleEnded, nil
		case isForbidden(werr):
			bk.log.Info("snapd refuses to show the change; the restart budget slots stay held", "change", id, "max_hold", h.b.opts.MaxHold)
			<-bk.ctx.Done()
			return settleEnded, nil
		}
		// The wait's own failure never ends a hold: look again.
		bk.log.Debug("cannot see the change end yet; still holding the restart budget slots", "change", id, "error", werr)
		if bk.pause(werr) != nil {
			return settleEnded, nil
		}
	}
}

// quiet keeps h until no request written under it can still act. A
// request whose answer the client never read (lost, cut, or cut off by the
// call's end) may still be carried out: snapd's handler waits for the
// state lock and carries on whether or not its client is still there.
// The change the operation followed was found by a look-up, not named by
// snapd, and may be someone else's identical change, the request's own
// coming later. So the hold stays until interruptGrace after the last such
// request was given up (the look-ups' own horizon, lostanswer.go), then
// the changes are listed once more and every one made since such a
// request that does what it asked and is not ready is followed until it
// is. It reports whether any such change other than the operation's own
// (h.change) was made: the services must then be checked again. Where
// snapd refuses the listing (snapctl without snap-refresh-observe), nothing
// more can be seen once the horizon has passed (nor where a listing fails
// for good): it reports true, so the services are checked again before the
// slots go.
func (h *hold) quiet(bk *call) bool {
	reqs := h.takeUnanswered()
	if len(reqs) == 0 {
		return false
	}
	last := reqs[0].gaveUp
	for _, r := range reqs[1:] {
		if r.gaveUp.After(last) {
			last = r.gaveUp
		}
	}
	clock := bk.c.clock
	bk.log.Debug("holding the restart budget slots while a request that got no answer may still act", "until", last.Add(interruptGrace))
	if d := last.Add(interruptGrace).Sub(clock.Now()); d > 0 {
		if retry.Sleep(bk.ctx, clock, d) != nil {
			return false
		}
	}
	var running []string
	var other bool
	for {
		var err error
		if running, other, err = lateChanges(bk, reqs, h.changeID()); err == nil {
			break
		}
		if readRefused(err) {
			bk.log.Info("snapd refuses the listing, so whether a request that got no answer acted late cannot be seen; its horizon has passed, the services are checked once more", "error", err)
			return true
		}
		if bk.pause(err) != nil {
			return false
		}
	}
	for _, id := range running {
		bk.log.Info("a change doing what an unanswered request asked is in progress; the restart budget slots stay held until it is ready", "change", id)
		if seen, _ := h.awaitReady(bk, id); seen == settleEnded {
			return false
		}
	}
	return other
}

// lateChanges lists the changes once and returns those in progress that
// do what one of reqs asked, made since it was sent, and whether any such
// change, ready or not, is another than own.
func lateChanges(k *call, reqs []unansweredRequest, own string) (running []string, other bool, err error) {
	chgs, err := k.listOnce(snapd.SelectAll)
	if err != nil {
		return nil, false, err
	}
	for _, r := range reqs {
		all, err := wholeSnapServices(k, r.o)
		if err != nil {
			return nil, false, err
		}
		from, sure, _ := k.c.view.clock.spawnWindow(r.sent.at, time.Time{}, k.c.clock.Now())
		for _, id := range opCandidates(chgs, r.o, all, r.sent.seen, from, sure, time.Time{}, nil) {
			other = other || id != own
			i := slices.IndexFunc(chgs, func(c snapd.Change) bool { return c.ID == id })
			if i >= 0 && !chgs[i].Ready && !slices.Contains(running, id) {
				running = append(running, id)
			}
		}
	}
	slices.SortFunc(running, func(a, b string) int {
		if lessID(a, b) {
			return -1
		}
		return 1
	})
	return running, other, nil
}

// errNotListed is the pause's cause while a hold waits for snapd to list
// its changes.
var errNotListed = errors.New("snapd could not list its changes yet")

// lookedUp returns what the look-up for the change of e's request found:
// the background look-up begun when the call ended, or one of its own,
// interruptGrace long, on bk. Without a request to look for, nothing can
// be found (refused).
func (e *outcomeUnknownError) lookedUp(bk *call, o request) lookupResult {
	switch {
	case e.found != nil:
		select {
		case res, ok := <-e.found:
			if ok {
				return res
			}
			return lookupResult{} // the Client closed before it looked
		case <-bk.ctx.Done():
			return lookupResult{}
		}
	case !e.sent.at.IsZero():
		lctx, cancel := context.WithTimeout(bk.ctx, interruptGrace)
		defer cancel()
		lk := bk.c.newHoldCall(lctx, o)
		defer lk.end()
		return lookFor(lk, o, e.sent, e.known)
	}
	return lookupResult{refused: true}
}

// lookOnce is one look-up, on k, for the change of e's request.
func lookOnce(k *call, o request, e *outcomeUnknownError) lookupResult {
	id, err := findOpChange(k, o, e.sent, time.Time{}, e.known)
	switch {
	case err == nil:
		return lookupResult{id: id, listed: true}
	case readRefused(err):
		return lookupResult{refused: true}
	}
	return lookupResult{}
}

// changeIDOf returns the change an operation's error names, or "".
func changeIDOf(err error) string {
	var oe *OpError
	if errors.As(err, &oe) {
		return oe.ChangeID
	}
	return ""
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

// isClosed reports whether ch is closed (false for nil).
func isClosed(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
