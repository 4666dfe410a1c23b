package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// WaitChange waits until the change is ready and returns it. A change that
// ends in Error, Undone or Hold is returned together with a *ChangeError
// carrying snapd's err text.
func (c *Client) WaitChange(ctx context.Context, id string) (*Change, error) {
	var chg *snapd.Change
	err := c.callOf(ctx, callWait, "wait", nil, func(k *call) (err error) {
		chg, err = processWaits.change(k, id)
		return err
	})
	return changeOf(chg), err
}

// WaitIdle returns once no change that touches snap is in progress,
// including changes made through snapctl, which carry no snap-names and so
// are found by their tasks.
func (c *Client) WaitIdle(ctx context.Context, snap string) error {
	if err := validateSnapName(snap); err != nil {
		return fmt.Errorf("snapsvc: waiting for snap to be idle: %w %q: %v", ErrInvalidName, snap, err)
	}
	return c.callOf(ctx, callWait, "wait", []string{snap}, func(k *call) error {
		return processWaits.idle(k, snap)
	})
}

// waitIdle is WaitIdle on call k, not shared (processwait.go). read, when not
// nil, is told when each listing was sent: the last one said the snap is
// idle.
func waitIdle(k *call, snap string, read func(time.Time)) error {
	c := k.c
	skip := ""
	if c.hook != "" {
		// From inside a hook, the hook's own change cannot end first.
		skip = ownHookChange(k, []string{snap})
	}
	for {
		at := c.clock.Now()
		ids, err := findBlockers(k, []string{snap}, nil, skip)
		if err != nil {
			if nextStep(reading, err) == askAgain && k.ctx.Err() == nil {
				if perr := k.pause(err); perr != nil {
					return fmt.Errorf("snapsvc: waiting for snap %q to be idle: %w", snap, perr)
				}
				continue
			}
			return fmt.Errorf("snapsvc: waiting for snap %q to be idle: %w", snap, err)
		}
		if read != nil {
			read(at)
		}
		if len(ids) == 0 {
			return nil
		}
		k.log.Debug("waiting for changes on snap", "snap", snap, "changes", ids)
		if _, err := waitChanges(k, ids, waitOpts{}); err != nil {
			return fmt.Errorf("snapsvc: waiting for snap %q to be idle: %w", snap, err)
		}
	}
}

// ErrNoNotices is returned by WaitChangeUpdate when snapd has no notices
// API (before 2.62) or does not let this client read it.
var ErrNoNotices = errors.New("snapd offers no change notices here")

// WaitChangeUpdate blocks until snapd records a change-update notice (a
// change was spawned or changed status) later than after, or until
// timeout passes, and returns the last-repeated time of the newest such
// notice (after itself when none came). With a zero after it returns at
// once with the newest existing notice's time, a starting point for the
// next call. It uses snapd's notices long-poll (snapd >= 2.62) and
// returns ErrNoNotices where there is none; callers then poll Changes.
func (c *Client) WaitChangeUpdate(ctx context.Context, after time.Time, timeout time.Duration) (time.Time, error) {
	if c.view.notices() == noticesNo {
		return after, ErrNoNotices
	}
	opts := snapd.NoticesOptions{Types: []string{snapd.NoticeChangeUpdate}, After: after}
	if !after.IsZero() {
		opts.Timeout = timeout
	}
	var ns []snapd.Notice
	err := c.callOf(ctx, callWait, "wait", nil, func(k *call) (err error) {
		ns, err = c.main.Notices(k.ctx, opts)
		return err
	})
	switch {
	case snapd.IsNotFound(err) || isForbidden(err):
		c.view.setNotices(noticesNo)
		return after, ErrNoNotices
	case err != nil:
		return after, fmt.Errorf("snapsvc: waiting for change notices: %w", err)
	}
	c.view.setNotices(noticesYes)
	for _, n := range ns {
		if n.LastRepeated.After(after) {
			after = n.LastRepeated
		}
	}
	return after, nil
}
