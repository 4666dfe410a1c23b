package main

import (
	"context"
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
