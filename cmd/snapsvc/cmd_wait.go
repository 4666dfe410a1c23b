package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/snapsvc/snapsvc/snapsvc"
)

func cmdWait(a *app, args []string) (action, error) {
	fs := a.flagSet("wait")
	pos, err := a.parseCommand(fs, "wait", args)
	if err != nil {
		return nil, err
	}
	id, err := changeIDArg("wait", pos)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		defer c.Close()
		// Fail fast, with exit code 4, on an unknown change.
		if _, err := c.Change(ctx, id); err != nil {
			return fmt.Errorf("reading change %s: %w", id, err)
		}
		a.prog.follow(a.followChange(ctx, func(ctx context.Context) (string, error) {
			chg, err := c.Change(ctx, id)
			if err != nil {
				return "", err
			}
			return describeChange(chg), nil
		}))
		chg, err := c.WaitChange(ctx, id)
		a.prog.clear()
		if err != nil {
			err = fmt.Errorf("waiting for change %s: %w", id, err)
		}
		switch {
		case a.json && err != nil && chg != nil:
			// One document: the error, with the change in it.
			return &detailError{err: err, detail: chg}
		case a.json && err == nil:
			a.printJSON(chg)
		case !a.json && chg != nil:
			fmt.Fprintf(a.stdout, "change %s (%s) %s: %s\n", chg.ID, chg.Kind, chg.Status, chg.Summary)
		}
		return err
	}, nil
}

// idleOutput is wait-idle's --json shape.
type idleOutput struct {
	Snap string `json:"snap"`
	Idle bool   `json:"idle"`
}

func cmdWaitIdle(a *app, args []string) (action, error) {
	fs := a.flagSet("wait-idle")
	pos, err := a.parseCommand(fs, "wait-idle", args)
	if err != nil {
		return nil, err
	}
	if len(pos) != 1 {
		return nil, usagef("wait-idle takes exactly one snap name, got %d arguments", len(pos))
	}
	snap, err := snapArg("wait-idle", pos[0])
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		defer c.Close()
		if err := checkSnapKnown(ctx, c, snap); err != nil {
			return err
		}
		a.prog.follow(a.followChange(ctx, func(ctx context.Context) (string, error) {
			chgs, err := c.Changes(ctx, snapsvc.ChangesOptions{Snap: snap})
			if err != nil || len(chgs) == 0 {
				return "", err
			}
			var parts []string
			for i := range chgs {
				parts = append(parts, describeChange(&chgs[i]))
			}
			return "waiting for " + strings.Join(parts, "; "), nil
		}))
		err = c.WaitIdle(ctx, snap)
		a.prog.clear()
		if err != nil {
			return err
		}
		if a.json {
			a.printJSON(idleOutput{Snap: snap, Idle: true})
		} else {
			fmt.Fprintf(a.stdout, "snap %q is idle: no change in progress holds it\n", snap)
		}
		return nil
	}, nil
}

// checkSnapKnown fails, matching snapsvc.ErrNotFound, when snapd knows no
// snap by that name and no change in progress touches one: waiting for
// such a snap to be idle would succeed whatever the name, typos included.
// A snap being installed is not listed by snapd until its install change
// links it, so a change in progress that touches the name counts as the
// snap being known (wait-idle then waits for that change); the services
// are read again after an empty listing, in case the install finished in
// between. Only snapd's own "snap-not-found" says a snap is unknown: a
// snap without services ("app-not-found") exists, and any other failure
// is left to the wait itself.
func checkSnapKnown(ctx context.Context, c *snapsvc.Client, snap string) error {
	unknown := func() (bool, error) {
		_, err := c.Services(ctx, snap)
		var ae *snapsvc.APIError
		if errors.As(err, &ae) && ae.Kind == "snap-not-found" {
			return true, err
		}
		return false, nil
	}
	if gone, _ := unknown(); !gone {
		return nil
	}
	chgs, err := c.Changes(ctx, snapsvc.ChangesOptions{Snap: snap})
	if err != nil || len(chgs) > 0 {
		return nil
	}
	if gone, err := unknown(); gone {
		return fmt.Errorf("snap %q is not installed and no change in progress touches it: %w", snap, err)
	}
	return nil
}
