package main

import (
	"github.com/spf13/cobra"

	"context"
	"fmt"
	"sort"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// statusOutput is status's --json shape.
type statusOutput struct {
	Services []snapsvc.Service `json:"services"`
	// Changes are the changes in progress that hold the services' snaps.
	Changes []snapsvc.Change `json:"changes"`
}

func (a *app) statusCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "status [NAME...]",
		Example: `  snapsvc status k8s   # its services, and what holds the snap`,
		Short:   "Show services and the changes in progress that hold their snaps",
		Long: `The status command lists the services, like services, then the changes in
progress that hold their snaps (which a start, stop or restart would wait
for), with the task each is on and its last log line.`,
		ValidArgsFunction: a.completeNames,
		RunE: func(c *cobra.Command, names []string) error {
			if err := checkNames(names); err != nil {
				return err
			}
			return a.do(c, a.status(names))
		},
	}
}

func (a *app) status(names []string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		defer c.Close()
		svcs, err := c.Services(ctx, names...)
		if err != nil {
			return err
		}
		snaps := map[string]bool{}
		for _, n := range names {
			snap, _, _ := snapsvc.ValidateName(n)
			snaps[snap] = true
		}
		for _, s := range svcs {
			snaps[s.Snap] = true
		}
		out := statusOutput{Services: svcs, Changes: []snapsvc.Change{}}
		seen := map[string]bool{}
		// Without names every service is listed: show every change in
		// progress (one request) rather than filtering per snap.
		filters := sortedKeys(snaps)
		if len(names) == 0 {
			filters = []string{""}
		}
		for _, snap := range filters {
			chgs, err := c.Changes(ctx, snapsvc.ChangesOptions{Snap: snap})
			if err != nil {
				return err
			}
			for _, chg := range chgs {
				if !seen[chg.ID] {
					seen[chg.ID] = true
					out.Changes = append(out.Changes, chg)
				}
			}
		}
		sort.Slice(out.Changes, func(i, j int) bool { return lessID(out.Changes[i].ID, out.Changes[j].ID) })
		if a.json {
			a.printJSON(out)
			return nil
		}
		tw := a.table()
		fmt.Fprintln(tw, "Service\tStartup\tCurrent")
		for _, s := range svcs {
			startup, current := serviceState(s)
			fmt.Fprintf(tw, "%s\t%s\t%s\n", s.FullName(), startup, current)
		}
		tw.Flush()
		if len(out.Changes) == 0 {
			fmt.Fprintln(a.stdout, "\nNo change in progress holds these snaps.")
			return nil
		}
		fmt.Fprintln(a.stdout, "\nChanges in progress (service commands on these snaps wait for them):")
		for i := range out.Changes {
			chg := &out.Changes[i]
			fmt.Fprintf(a.stdout, "  %s %s %s: %s\n", chg.ID, chg.Status, chg.Kind, chg.Summary)
			if t := currentTask(chg); t != nil {
				fmt.Fprintf(a.stdout, "      now: task %s %s: %s\n", t.ID, t.Status, t.Summary)
				if n := len(t.Log); n > 0 {
					fmt.Fprintf(a.stdout, "      log: %s\n", logText(t.Log[n-1]))
				}
			}
		}
		return nil
	}
}

// lessID orders change ids numerically (they are decimal counters).
func lessID(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}
