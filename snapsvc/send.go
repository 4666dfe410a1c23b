package snapsvc

import (
	"context"
	"errors"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

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

// try makes one attempt: under a restart budget it first confirms the
// slots are still held (budget.go, fence), then sends the request to act,
// leaving the last of the call's time to look up its change.
func (r *runner) try() (attempt, error) {
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
	a.sent = c.view.sending(c.clock.Now())
	a.sentAt = a.sent.at
	actx, cancel := k.actCtx()
	if k.hold != nil && !k.hold.sendBy.IsZero() {
		actx = snapd.WithSendBy(actx, k.hold.sendBy)
	}
	a.changeID, a.err = c.post(actx, r.o)
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

// post makes one request to act.
func (c *Client) post(ctx context.Context, o op) (string, error) {
	if c.mode == ModeSnapctl {
		_, err := c.ctl.RunSnapctl(ctx, snapd.SnapctlRequest{ContextID: c.cookie, Args: o.snapctlArgs()})
		return "", err
	}
	return c.main.PostApps(ctx, o.instruction())
}
