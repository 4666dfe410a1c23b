package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/snapsvc/snapsvc/snapsvc"
)

func cmdChanges(a *app, args []string) (action, error) {
	fs := a.flagSet("changes")
	all := fs.Bool("all", false, "also list changes that are ready (done or failed)")
	pos, err := a.parseCommand(fs, "changes", args)
	if err != nil {
		return nil, err
	}
	if len(pos) > 1 {
		return nil, usagef("changes takes at most one snap name, got %d", len(pos))
	}
	opts := snapsvc.ChangesOptions{Select: "in-progress"}
	if *all {
		opts.Select = "all"
	}
	if len(pos) == 1 {
		snap, err := snapArg("changes", pos[0])
		if err != nil {
			return nil, err
		}
		opts.Snap = snap
	}
	return func(ctx context.Context) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		defer c.Close()
		chgs, err := c.Changes(ctx, opts)
		if err != nil {
			return err
		}
		if chgs == nil {
			chgs = []snapsvc.Change{}
		}
		if a.json {
			a.printJSON(chgs)
			return nil
		}
		if len(chgs) == 0 {
			what := "in progress"
			if *all {
				what = "known to snapd"
			}
			if opts.Snap != "" {
				what += fmt.Sprintf(" touching snap %q", opts.Snap)
			}
			fmt.Fprintf(a.stdout, "No changes %s.\n", what)
			return nil
		}
		writeChangeTable(a.stdout, chgs)
		return nil
	}, nil
}

func cmdChange(a *app, args []string) (action, error) {
	fs := a.flagSet("change")
	pos, err := a.parseCommand(fs, "change", args)
	if err != nil {
		return nil, err
	}
	id, err := changeIDArg("change", pos)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		defer c.Close()
		chg, err := c.Change(ctx, id)
		if err != nil {
			return fmt.Errorf("reading change %s: %w", id, err)
		}
		if a.json {
			a.printJSON(chg)
			return nil
		}
		a.printChange(chg)
		return nil
	}, nil
}

// printChange prints a change like "snap tasks": a header, then each task
// with its status, times, summary and log.
func (a *app) printChange(chg *snapsvc.Change) {
	fmt.Fprintf(a.stdout, "Change %s (%s) %s: %s\n", chg.ID, chg.Kind, chg.Status, chg.Summary)
	fmt.Fprintf(a.stdout, "Spawned %s, ready %s\n\n", formatTime(&chg.SpawnTime), formatTime(chg.ReadyTime))
	tw := a.table()
	fmt.Fprintln(tw, "Task\tStatus\tSpawn\tReady\tSummary")
	for _, t := range chg.Tasks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Status, formatTime(&t.SpawnTime), formatTime(t.ReadyTime), t.Summary)
	}
	tw.Flush()
	for _, t := range chg.Tasks {
		if len(t.Log) == 0 {
			continue
		}
		fmt.Fprintf(a.stdout, "\nLog of task %s (%s):\n", t.ID, t.Summary)
		for _, l := range t.Log {
			fmt.Fprintf(a.stdout, "  %s\n", strings.ReplaceAll(l, "\n", "\n  "))
		}
	}
	if chg.Err != "" {
		fmt.Fprintf(a.stdout, "\nError: %s\n", chg.Err)
	}
}

// changeIDArg checks that args is exactly one change id.
func changeIDArg(cmd string, args []string) (string, error) {
	if len(args) != 1 {
		return "", usagef("%s takes exactly one change id, got %d arguments", cmd, len(args))
	}
	id := args[0]
	for _, r := range id {
		if r < '0' || r > '9' {
			return "", usagef("change id %q is not a number", id)
		}
	}
	if id == "" {
		return "", usagef("empty change id")
	}
	return id, nil
}

// snapArg validates a command's SNAP argument: a snap name, not a service.
func snapArg(cmd, arg string) (string, error) {
	snap, app, err := snapsvc.ValidateName(arg)
	if err != nil {
		return "", err
	}
	if app != "" {
		return "", usagef("%s takes a snap name, not a service (%q)", cmd, arg)
	}
	return snap, nil
}
