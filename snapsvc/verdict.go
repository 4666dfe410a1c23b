package snapsvc

import (
	"errors"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// refused ends an operation snapd refused for good (an unknown service, a
// failed change reported by snapctl).
func (r *runner) refused(a attempt) (*Result, bool, error) {
	r.k.log.Info("failed", "attempt", r.res.Attempts, "error", a.err)
	err := a.err
	id := r.k.changeFailure(r.o, a.sentAt, &err)
	return r.fail(id, err)
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
	}
	r.res.Status = snapd.StatusDone
	ev := k.event(EventAccepted)
	ev.ChangeID = r.res.ChangeID
	c.events.emit(ev)
	k.log.Info("done", "change", r.res.ChangeID, "attempt", r.res.Attempts)
	return r.res, true, nil
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
