package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/snapsvc"
)

func (a *app) watchCmd() *cobra.Command {
	f := &followFlags{}
	var last string
	c := &cobra.Command{
		Use: "watch (ID | --last=KIND)",
		Example: `  snapsvc watch 42
  snapsvc watch --last=auto-refresh?   # nothing to wait for is no error`,
		Short:             "Watch a change in progress",
		ValidArgsFunction: a.completeChanges(),
		Long: `The watch command waits for the change to be ready (the change ID given, or
with --last=KIND the latest change of that kind), showing its progress on
a terminal as a self-erasing line, as snap watch does. It prints nothing
more when the change is Done and fails (exit 1) with snapd's error when
the change is not.

Ctrl-C stops waiting, not the change: exit 130 (SIGTERM: 143) with the
command that waits again.

Deprecated: "watch [SNAP]" without a change id follows every change as
it happens; that is "snapsvc follow [SNAP]" now.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, pos []string) error {
			if last == "" && (len(pos) == 0 || !isChangeID(pos[0])) {
				// v0.1's "watch [SNAP]": a snap name is never all digits.
				a.deprecated("watch [SNAP]", `"snapsvc follow [SNAP]" ("watch ID" waits for a change, as in snap)`)
				a.followMode = true
				return a.runFollow(c, f, pos)
			}
			if c.Flags().Changed("interval") || c.Flags().Changed("until-idle") {
				return usagef("watch ID takes no --interval or --until-idle (those are follow's)")
			}
			if err := checkChangeArgs("watch", pos, last); err != nil {
				return err
			}
			return a.do(c, a.waitChange(pos, last, false))
		},
	}
	f.add(c, true)
	a.addLast(c, &last)
	return c
}

// waitCmd is v0.1's "wait ID", kept for one minor release: snap's own
// "wait" is "snap wait SNAP KEY" (a configuration key), so snapsvc's
// name for waiting for a change is watch, as snap's.
func (a *app) waitCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "wait ID",
		Short:  "Deprecated: use watch ID",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, pos []string) error {
			a.deprecated("wait ID", `"snapsvc watch ID", as in snap`)
			id, err := changeIDArg("wait", pos)
			if err != nil {
				return err
			}
			return a.do(c, a.waitChange([]string{id}, "", true))
		},
	}
}

// waitChange waits for the change (pos's id, or --last's) with progress.
// summary: print the change's final line on stdout (v0.1's wait did; snap
// watch does not).
func (a *app) waitChange(pos []string, last string, summary bool) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		defer c.Close()
		id, ok, err := a.resolveChange(ctx, c, pos, last)
		if !ok {
			return err
		}
		// Fail fast, with exit code 4, on an unknown change.
		first, err := c.Change(ctx, id)
		if err != nil {
			return err
		}
		if !first.Ready {
			a.prog.begin("watch " + id)
			a.prog.lookup(c)
			a.prog.waitFor(id, first.Kind)
		}
		chg, err := c.WaitChange(ctx, id)
		a.prog.end()
		if err != nil && errors.Is(ctx.Err(), context.Canceled) {
			err = &interruptedError{change: id, err: err, sig: terminatedBy(ctx)}
		}
		switch {
		case a.json && err != nil && chg != nil:
			// One document: the error, with the change in it.
			return &detailError{err: err, detail: chg}
		case a.json && err == nil:
			a.printJSON(chg)
		case !a.json && chg != nil && summary:
			fmt.Fprintf(a.stdout, "change %s (%s) %s: %s\n", chg.ID, chg.Kind, chg.Status, chg.Summary)
		}
		return err
	}
}

func (a *app) abortCmd() *cobra.Command {
	var last string
	c := &cobra.Command{
		Use:               "abort (ID | --last=KIND)",
		Example:           `  snapsvc abort 42 && snapsvc watch 42`,
		Short:             "Abort a pending change",
		ValidArgsFunction: a.completeChanges(),
		Long: `The abort command attempts to abort a change that still has pending tasks
(the change ID given, or with --last=KIND the latest change of that kind),
as snap abort does: tasks not started are held, a running one is undone
when it ends. It prints nothing (--json: the change as snapd returned it);
"snapsvc watch ID" waits for the change to settle.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, pos []string) error {
			if err := checkChangeArgs("abort", pos, last); err != nil {
				return err
			}
			return a.withClient(c, func(ctx context.Context, cl *snapsvc.Client) error {
				id, ok, err := a.resolveChange(ctx, cl, pos, last)
				if !ok {
					return err
				}
				chg, err := cl.AbortChange(ctx, id)
				if err != nil {
					return err
				}
				if a.json {
					a.printJSON(chg)
				}
				return nil
			})
		},
	}
	a.addLast(c, &last)
	return c
}

// idleOutput is wait-idle's --json shape.
type idleOutput struct {
	Snap string `json:"snap"`
	Idle bool   `json:"idle"`
}

func (a *app) waitIdleCmd() *cobra.Command {
	return &cobra.Command{
		Use: "wait-idle SNAP",
		Example: `  snapsvc wait-idle k8s && snap refresh k8s
  snapsvc wait-idle --timeout 5m k8s`,
		Short: "Wait until no change in progress holds SNAP",
		Long: `The wait-idle command returns once no change in progress touches SNAP
(changes made through snapctl included): what a service command on SNAP
would wait for first. Like snap watch it prints nothing on stdout when
done (--json: {"snap": SNAP, "idle": true}); on a terminal, or with -v,
stderr says so.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeSnaps,
		RunE: func(c *cobra.Command, pos []string) error {
			snap, err := snapArg("wait-idle", pos[0])
			if err != nil {
				return err
			}
			return a.do(c, func(ctx context.Context) error {
				c, err := a.client()
				if err != nil {
					return err
				}
				defer c.Close()
				if err := checkSnapKnown(ctx, c, snap); err != nil {
					return err
				}
				a.prog.begin("wait-idle " + snap)
				a.prog.lookup(c)
				a.prog.waitForSnap(snap)
				err = c.WaitIdle(ctx, snap)
				a.prog.end()
				if err != nil {
					return err
				}
				switch {
				case a.json:
					a.printJSON(idleOutput{Snap: snap, Idle: true})
				case a.chatty():
					// Not data: stdout stays empty, as snap watch's.
					a.note("snap %q is idle: no change in progress holds it", snap)
				}
				return nil
			})
		},
	}
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
		return &unknownSnapError{snap: snap, err: err}
	}
	return nil
}

// unknownSnapError is wait-idle's refusal of a snap snapd does not know.
// It says so once, in its own words: snapd's answer ("snap "nope" not
// found", kind snap-not-found) is wrapped, for errors.Is(err,
// snapsvc.ErrNotFound) and --json's kind, but not repeated.
type unknownSnapError struct {
	snap string
	err  error
}

func (e *unknownSnapError) Error() string {
	return fmt.Sprintf("snap %q is not installed and no change in progress touches it", e.snap)
}

func (e *unknownSnapError) Unwrap() error { return e.err }
