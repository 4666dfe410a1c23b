package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/snapsvc"
)

func (a *app) changesCmd() *cobra.Command {
	var absTime, inProgress, all bool
	c := &cobra.Command{
		Use: "changes [SNAP]",
		Example: `  snapsvc changes                  # every change snapd keeps
  snapsvc changes --in-progress k8s   # what a service command on k8s would wait for`,
		Short: "List system changes",
		Long: `The changes command displays a summary of the recent system changes performed:
every change snapd still keeps (it prunes ready ones after a day), oldest
first, with snap's columns ID, Status, Spawn, Ready and Summary. SNAP keeps
those that touch the snap, changes made through snapctl included.

--in-progress lists only the changes not ready yet: those a service command
would wait for.`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: a.completeSnaps,
		RunE: func(c *cobra.Command, pos []string) error {
			if all {
				a.deprecated("changes --all", `"snapsvc changes" (it lists every change now, as snap does)`)
			}
			opts := snapsvc.ChangesOptions{Select: "all"}
			if inProgress {
				opts.Select = "in-progress"
			}
			if len(pos) == 1 {
				if isChangeID(pos[0]) {
					return usagef("changes takes a snap name, not a change id: try 'snapsvc tasks %s'", pos[0])
				}
				snap, err := snapArg("changes", pos[0])
				if err != nil {
					return err
				}
				opts.Snap = snap
			}
			return a.withClient(c, func(ctx context.Context, cl *snapsvc.Client) error {
				chgs, err := cl.Changes(ctx, opts)
				if err != nil {
					return err
				}
				sort.SliceStable(chgs, func(i, j int) bool { return chgs[i].SpawnTime.Before(chgs[j].SpawnTime) })
				if chgs == nil {
					chgs = []snapsvc.Change{}
				}
				if a.json {
					a.printJSON(chgs)
					return nil
				}
				if len(chgs) == 0 {
					// As snap: "no changes found" on stderr, exit 0
					// (cmd/snap/cmd_changes.go), with or without SNAP.
					what := "no changes found"
					if inProgress {
						what = "no changes in progress"
					}
					fmt.Fprintln(a.stderr, what)
					return nil
				}
				tw := a.table()
				fmt.Fprintln(tw, "ID\tStatus\tSpawn\tReady\tSummary")
				for i := range chgs {
					chg := &chgs[i]
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", chg.ID, chg.Status, fmtTime(&chg.SpawnTime, absTime), fmtTime(chg.ReadyTime, absTime), chg.Summary)
				}
				tw.Flush()
				fmt.Fprintln(a.stdout)
				return nil
			})
		},
	}
	c.Flags().BoolVar(&absTime, "abs-time", false, "display absolute times (in RFC 3339 format); otherwise relative times up to 60 days, then YYYY-MM-DD")
	c.Flags().BoolVar(&inProgress, "in-progress", false, "list only the changes in progress")
	c.Flags().BoolVar(&all, "all", false, "deprecated: every change is listed now")
	c.Flags().MarkHidden("all")
	return c
}

func (a *app) tasksCmd() *cobra.Command {
	var absTime bool
	var last string
	c := &cobra.Command{
		Use: "tasks [--abs-time] (ID | --last=KIND)",
		Example: `  snapsvc tasks 42
  snapsvc tasks --last=configure   # the latest configure-snap change`,
		Aliases:           []string{"change"},
		Short:             "List a change's tasks",
		ValidArgsFunction: a.completeChanges(),
		Long: `The tasks command displays a summary of tasks associated with an individual
change, then each task's log, as snap tasks does: the change ID given, or
with --last=KIND the latest change of that kind. --json prints snapd's
change object (null for --last=KIND? without such a change).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, pos []string) error {
			if err := checkChangeArgs(c.CalledAs(), pos, last); err != nil {
				return err
			}
			return a.withClient(c, func(ctx context.Context, cl *snapsvc.Client) error {
				id, ok, err := a.resolveChange(ctx, cl, pos, last)
				if !ok {
					return err
				}
				chg, err := cl.Change(ctx, id)
				if err != nil {
					return err
				}
				if a.json {
					a.printJSON(chg)
					return nil
				}
				a.printTasks(chg, absTime)
				return nil
			})
		},
	}
	c.Flags().BoolVar(&absTime, "abs-time", false, "display absolute times (in RFC 3339 format); otherwise relative times up to 60 days, then YYYY-MM-DD")
	a.addLast(c, &last)
	return c
}

// taskLogRule separates task logs, as snap tasks prints them.
const taskLogRule = "......................................................................"

// printTasks prints a change as snap tasks does: Status, Spawn, Ready and
// Summary of each task, then each task's log; snapsvc adds the change's
// error at the end.
func (a *app) printTasks(chg *snapsvc.Change, abs bool) {
	tw := a.table()
	fmt.Fprintln(tw, "Status\tSpawn\tReady\tSummary")
	for _, t := range chg.Tasks {
		summary := t.Summary
		if t.Status == "Doing" && t.Progress.Total > 1 {
			summary = fmt.Sprintf("%s (%.2f%%)", summary, float64(t.Progress.Done)/float64(t.Progress.Total)*100)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Status, fmtTime(&t.SpawnTime, abs), fmtTime(t.ReadyTime, abs), summary)
	}
	tw.Flush()
	for _, t := range chg.Tasks {
		if len(t.Log) == 0 {
			continue
		}
		fmt.Fprintf(a.stdout, "\n%s\n%s\n\n", taskLogRule, t.Summary)
		for _, l := range t.Log {
			fmt.Fprintln(a.stdout, l)
		}
	}
	if chg.Err != "" {
		fmt.Fprintf(a.stdout, "\n%s\n", chg.Err)
	}
	fmt.Fprintln(a.stdout)
}

// fmtTime prints a time as snap does: RFC 3339 in UTC with --abs-time,
// else relative to today in local time with the zone ("today at 10:17
// UTC", "yesterday at ...", "3 days ago, at ...", then YYYY-MM-DD beyond
// 60 days; snapd's timeutil.Human); "-" when unset.
func fmtTime(t *time.Time, abs bool) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	if abs {
		return t.UTC().Format(time.RFC3339)
	}
	return humanTime(t.Local(), time.Now().Local())
}

// humanTime is then relative to now, in whole calendar days.
func humanTime(then, now time.Time) string {
	d := dayDelta(then, now)
	switch {
	case d < -60 || d > 60:
		return then.Format("2006-01-02")
	case d < -1:
		return fmt.Sprintf("%d days ago, at %s", -d, then.Format("15:04 MST"))
	case d == -1:
		return then.Format("yesterday at 15:04 MST")
	case d == 0:
		return then.Format("today at 15:04 MST")
	case d == 1:
		return then.Format("tomorrow at 15:04 MST")
	}
	return fmt.Sprintf("in %d days, at %s", d, then.Format("15:04 MST"))
}

// dayDelta is the number of calendar days from now's day to then's.
func dayDelta(then, now time.Time) int {
	y1, m1, d1 := then.Date()
	y2, m2, d2 := now.Date()
	a := time.Date(y1, m1, d1, 12, 0, 0, 0, time.UTC)
	b := time.Date(y2, m2, d2, 12, 0, 0, 0, time.UTC)
	return int(a.Sub(b).Round(24*time.Hour) / (24 * time.Hour))
}

// isChangeID reports whether s is all digits: a change id (a snap name has
// at least one letter).
func isChangeID(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// changeIDArg checks that args is exactly one change id.
func changeIDArg(cmd string, args []string) (string, error) {
	if len(args) != 1 {
		return "", usagef("%s takes exactly one change id, got %d arguments", cmd, len(args))
	}
	if !isChangeID(args[0]) {
		return "", usagef("%s: change id %q is not a number", cmd, args[0])
	}
	return args[0], nil
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

// completeChanges completes change ids from snapd, every change it keeps
// as snap does (cmd/snap/complete.go changeID), each with its status and
// summary, when snapd answers within a second.
func (a *app) completeChanges() cobra.CompletionFunc {
	return func(c *cobra.Command, args []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		chgs, _ := completionRead(c, a, func(ctx context.Context, cl *snapsvc.Client) ([]snapsvc.Change, error) {
			return cl.Changes(ctx, snapsvc.ChangesOptions{Select: "all"})
		})
		for _, chg := range chgs {
			if strings.HasPrefix(chg.ID, prefix) {
				out = append(out, cobra.CompletionWithDesc(chg.ID, chg.Status+" "+chg.Summary))
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
