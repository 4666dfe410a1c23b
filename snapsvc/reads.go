package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Reads ride out a snapd restart as actions do, in every mode.
//
// Services, Changes, Change and AbortChange are calls of their own
// (call.go): each retries a request that failed because snapd could not
// be reached or answered that it is restarting (retry.Transient: no
// socket, nobody listening, kind daemon-restart or system-restart, a
// garbled answer; a read whose answer was lost, as a snapctl listing sent
// by POST can be) within the call's bounds: the context, the
// policy's MaxElapsedTime (a deadline on every request, so a snapd that
// accepts and never answers cannot hold a read), MaxUnreachable and
// MaxAttempts. The observer gets EventUnreachable and EventReachable for
// them with Op "read". Any other failure (an unknown change, a bad name)
// returns at once. AbortChange, a request to act, is never resent once its
// answer was lost: it fails matching ErrOutcomeUnknown (and ErrGaveUp or
// the context's error when the call's bound cut it). The same reads inside an
// operation run on the operation's call, within its bounds.

// readApps is c.main.Apps on call k.
func (k *call) readApps(names []string, services bool) (apps []snapd.AppInfo, err error) {
	c := k.c
	err = k.read("reading services", func(ctx context.Context) (err error) {
		apps, err = c.main.Apps(ctx, names, services)
		return err
	})
	return apps, err
}

// readChanges is c.main.Changes on call k.
func (k *call) readChanges(sel, snap string) (chgs []snapd.Change, err error) {
	c := k.c
	err = k.read("listing changes", func(ctx context.Context) (err error) {
		chgs, err = c.main.Changes(ctx, sel, snap)
		return err
	})
	c.view.sawChanges(chgs...)
	return chgs, err
}

// listOnce is one listing of snapd's changes (sel: snapd.SelectAll or
// SelectInProgress) on call k, not retried: the caller decides what a
// failure means. What it lists is seen (saw).
func (k *call) listOnce(sel string) ([]snapd.Change, error) {
	c := k.c
	chgs, err := c.main.Changes(k.ctx, sel, "")
	k.note(err)
	c.view.sawChanges(chgs...)
	return chgs, err
}

// readChange is c.main.Change on call k.
func (k *call) readChange(id string) (chg *snapd.Change, err error) {
	c := k.c
	err = k.read("reading change "+id, func(ctx context.Context) (err error) {
		chg, err = c.main.Change(ctx, id)
		return err
	})
	if chg != nil {
		c.view.saw(chg.ID)
	}
	return chg, err
}

// readSnapctl runs a snapctl command that only reads (services) on call
// k.
func (k *call) readSnapctl(args []string) (out *snapd.SnapctlResult, err error) {
	c := k.c
	err = k.read("snapctl "+args[0], func(ctx context.Context) (err error) {
		out, err = c.ctl.RunSnapctl(ctx, snapd.SnapctlRequest{ContextID: c.cookie, Args: args})
		return err
	})
	return out, err
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
	err := c.callOf(ctx, callRead, "read", nil, func(k *call) error {
		return k.act("aborting change "+id, func(ctx context.Context) (err error) {
			chg, err = c.main.Abort(ctx, id)
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	return changeOf(chg), nil
}

// Change returns the change with the given id.
func (c *Client) Change(ctx context.Context, id string) (*Change, error) {
	var chg *snapd.Change
	err := c.callOf(ctx, callRead, "read", nil, func(k *call) (err error) {
		chg, err = k.readChange(id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return changeOf(chg), nil
}

// readRefused reports whether snapd answered a read with a refusal that
// stays true (a 4xx: no access, a request it does not serve): asking again
// cannot help. Anything else a read meets (a 500, a garbled answer, snapd
// away) may pass; the retry rule's "give up" also covers failures it does
// not recognise, which is right for a caller's read, and wrong for a
// look-up whose "nothing found" would decide what snapd did.
func readRefused(err error) bool {
	var e *snapd.Error
	return errors.As(err, &e) && e.StatusCode >= 400 && e.StatusCode < 500
}

// isForbidden reports whether snapd refused a read for lack of access.
func isForbidden(err error) bool {
	var apiErr *snapd.Error
	return errors.As(err, &apiErr) && (apiErr.StatusCode == 401 || apiErr.StatusCode == 403)
}

// ChangesOptions select changes for Changes.
type ChangesOptions struct {
	// Select is "in-progress" (default), "ready" or "all".
	Select string
	// Snap keeps only changes that touch the snap, found by their tasks
	// (snapd's own for= filter misses changes made through snapctl).
	Snap string
}

// Changes lists snapd's changes.
func (c *Client) Changes(ctx context.Context, opts ChangesOptions) ([]Change, error) {
	sel := opts.Select
	if sel == "" {
		sel = snapd.SelectInProgress
	}
	var chgs []snapd.Change
	err := c.callOf(ctx, callRead, "read", nil, func(k *call) (err error) {
		chgs, err = k.readChanges(sel, "")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("snapsvc: listing changes: %w", err)
	}
	out := make([]Change, 0, len(chgs))
	var re *regexp.Regexp
	if opts.Snap != "" {
		re = summaryPattern(opts.Snap)
	}
	for i := range chgs {
		if re == nil || touches(&chgs[i], opts.Snap, re) {
			out = append(out, *changeOf(&chgs[i]))
		}
	}
	return out, nil
}
