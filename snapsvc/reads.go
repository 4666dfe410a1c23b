package snapsvc

import (
	"context"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// Reads ride out a snapd restart as actions do.
//
// Services, Changes, Change and AbortChange (and WaitChange and WaitIdle,
// whose waits already did) retry a request that failed because snapd
// could not be reached or answered that it is restarting (retry.Transient:
// no socket, nobody listening, kind daemon-restart or system-restart, a
// garbled answer to a GET) for as long as the policy allows: while snapd
// stays unreachable for less than MaxUnreachable, and within
// MaxElapsedTime. The observer gets EventUnreachable and EventReachable
// for them with Op "read". Any other failure (an unknown change, a bad
// name) returns at once. A request to act whose answer was lost is never
// resent (retry.Indeterminate is not Transient).

// retryRead runs f until it succeeds, fails for another reason than an
// unreachable or restarting snapd, or the policy gives up.
func (c *Client) retryRead(ctx context.Context, what string, f func(ctx context.Context) error) error {
	rt := c.policy.NewRetrier()
	x := &reach{c: c, rt: rt}
	ev := Event{Op: "read"}
	for {
		rt.Attempt()
		err := f(ctx)
		x.observe(ctx, ev, err)
		if err == nil || ctx.Err() != nil || retry.Classify(err) != retry.Transient {
			return err
		}
		if reason := rt.Exhausted(); reason != "" {
			return &gaveUpError{reason: reason, last: err}
		}
		c.log(ctx).Debug("read failed; retrying", "what", what, "error", err)
		if perr := rt.Pause(ctx); perr != nil {
			return interrupted(ctx, err)
		}
	}
}

// readApps is c.main.Apps under retryRead.
func (c *Client) readApps(ctx context.Context, names []string, services bool) (apps []snapd.AppInfo, err error) {
	err = c.retryRead(ctx, "reading services", func(ctx context.Context) (err error) {
		apps, err = c.main.Apps(ctx, names, services)
		return err
	})
	return apps, err
}

// readChanges is c.main.Changes under retryRead.
func (c *Client) readChanges(ctx context.Context, sel, snap string) (chgs []snapd.Change, err error) {
	err = c.retryRead(ctx, "listing changes", func(ctx context.Context) (err error) {
		chgs, err = c.main.Changes(ctx, sel, snap)
		return err
	})
	return chgs, err
}

// readChange is c.main.Change under retryRead.
func (c *Client) readChange(ctx context.Context, id string) (chg *snapd.Change, err error) {
	err = c.retryRead(ctx, "reading change "+id, func(ctx context.Context) (err error) {
		chg, err = c.main.Change(ctx, id)
		return err
	})
	return chg, err
}

// AbortChange asks snapd to abort the change, as "snap abort ID" does:
// tasks not started yet are held, a running one is undone once it ends
// (overlord/state Change.Abort). It returns the change as snapd answered.
// A change with nothing pending fails with snapd's error (HTTP 400, "cannot
// abort change ID with nothing pending"); an unknown one matches
// ErrNotFound. Only a request that never reached snapd is retried (an
// abort sent twice fails the second time).
func (c *Client) AbortChange(ctx context.Context, id string) (*Change, error) {
	var chg *snapd.Change
	err := c.retryRead(ctx, "aborting change "+id, func(ctx context.Context) (err error) {
		chg, err = c.main.Abort(ctx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return changeOf(chg), nil
}
