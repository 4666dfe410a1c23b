package main

import (
	"github.com/spf13/cobra"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// watchEvent is one line of watch: a change appeared or changed status,
// or one of its tasks did, or a task logged something. Under --json each
// event is one JSON object per line.
type watchEvent struct {
	Time    time.Time  `json:"time"`
	Change  string     `json:"change"`
	Kind    string     `json:"kind"`
	Status  string     `json:"status"`
	Summary string     `json:"summary"`
	Err     string     `json:"err,omitempty"`
	Task    *watchTask `json:"task,omitempty"`
}

type watchTask struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Status  string `json:"status"`
	Summary string `json:"summary"`
	Log     string `json:"log,omitempty"`
}

// watchState remembers what was last seen of each change.
type watchState struct {
	changes map[string]string // change id -> status
	tasks   map[string]string // task id -> status
	logs    map[string]int    // task id -> log lines seen
}

// followFlags are follow's flags (also on watch, hidden, for v0.1's
// "watch [SNAP]").
type followFlags struct {
	interval  time.Duration
	untilIdle bool
}

func (f *followFlags) add(c *cobra.Command, hidden bool) {
	f.interval = 500 * time.Millisecond
	c.Flags().Var(&durationFlag{&f.interval}, "interval", "read snapd's changes every `D`")
	c.Flags().BoolVar(&f.untilIdle, "until-idle", false, "exit once no change (touching SNAP) is in progress")
	if hidden {
		c.Flags().MarkHidden("interval")
		c.Flags().MarkHidden("until-idle")
	}
}

func (a *app) followCmd() *cobra.Command {
	f := &followFlags{}
	c := &cobra.Command{
		Use: "follow [--interval D] [--until-idle] [SNAP]",
		Example: `  snapsvc follow k8s                # until Ctrl-C
  snapsvc follow --until-idle k8s   # until no change holds k8s`,
		Short: "Follow changes, their tasks and logs as they happen",
		Long: `The follow command prints a line whenever a change (touching SNAP) appears or
changes status, one of its tasks does, or a task logs something; with --json
one object per line. It runs until interrupted (exit 130; SIGTERM: 143)
or, with --until-idle, until no change is in progress. It was "watch
[SNAP]" in v0.1.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, pos []string) error {
			a.followMode = true
			return a.runFollow(c, f, pos)
		},
	}
	f.add(c, false)
	return c
}

func (a *app) runFollow(c *cobra.Command, f *followFlags, pos []string) error {
	if f.interval <= 0 {
		return usagef("--interval must be positive")
	}
	interval, untilIdle := &f.interval, &f.untilIdle
	opts := snapsvc.ChangesOptions{Select: "all"}
	if len(pos) == 1 {
		snap, err := snapArg(c.CalledAs(), pos[0])
		if err != nil {
			return err
		}
		opts.Snap = snap
	}
	return a.do(c, func(ctx context.Context) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		defer c.Close()
		st := &watchState{changes: map[string]string{}, tasks: map[string]string{}, logs: map[string]int{}}
		first := true
		tick := time.NewTicker(*interval)
		defer tick.Stop()
		useNotices := true
		lastNotice, err := c.WaitChangeUpdate(ctx, time.Time{}, 0) // the newest notice so far
		if errors.Is(err, snapsvc.ErrNoNotices) {
			useNotices = false
		}
		for {
			chgs, err := c.Changes(ctx, opts)
			if a.watchPolled != nil {
				a.watchPolled(err)
			}
			switch {
			case err == nil:
			case ctx.Err() != nil:
				return watchEnd(ctx)
			default:
				// The library rode out an unreachable or restarting snapd
				// for --wait-snapd (the observer said so on stderr); past
				// that, follow gives up like every command.
				return err
			}
			busy := false
			for i := range chgs {
				chg := &chgs[i]
				if !chg.Ready {
					busy = true
				}
				if first && chg.Ready {
					a.rememberChange(st, chg) // history: not news
					continue
				}
				a.diffChange(st, chg)
			}
			if first && !busy && !a.json && !*untilIdle {
				fmt.Fprintln(a.stdout, "No change in progress; watching for new ones.")
			}
			first = false
			if *untilIdle && !busy {
				return nil
			}
			// Where snapd has notices (>= 2.62), wake as soon as a change
			// is spawned or changes status; read again every interval all
			// the same, for task progress and logs, which have no notices.
			if useNotices {
				next, err := c.WaitChangeUpdate(ctx, lastNotice, *interval)
				switch {
				case err == nil:
					lastNotice = next
					tick.Reset(*interval)
					continue
				case ctx.Err() != nil:
					return watchEnd(ctx)
				case errors.Is(err, snapsvc.ErrNoNotices):
					useNotices = false
				}
			}
			select {
			case <-ctx.Done():
				return watchEnd(ctx)
			case <-tick.C:
			}
		}
	})
}

// watchEnd is how follow ends once ctx is done: interrupted (exit 130)
// or --timeout (exit 3).
func watchEnd(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return &interruptedError{err: context.Canceled, sig: terminatedBy(ctx)}
	}
	return fmt.Errorf("following changes: %w", context.Cause(ctx))
}

func (a *app) rememberChange(st *watchState, chg *snapsvc.Change) {
	st.changes[chg.ID] = chg.Status
	for _, t := range chg.Tasks {
		st.tasks[t.ID] = t.Status
		st.logs[t.ID] = len(t.Log)
	}
}

// diffChange prints what changed in chg since the last poll.
func (a *app) diffChange(st *watchState, chg *snapsvc.Change) {
	now := time.Now()
	base := watchEvent{Time: now, Change: chg.ID, Kind: chg.Kind, Status: chg.Status, Summary: chg.Summary}
	prev, known := st.changes[chg.ID]
	if !known || prev != chg.Status {
		ev := base
		if chg.Ready {
			ev.Err = chg.Err
		}
		// A change's final line comes after its tasks' lines.
		if !chg.Ready {
			a.emit(ev)
		}
		defer func() {
			if chg.Ready {
				a.emit(ev)
			}
		}()
	}
	st.changes[chg.ID] = chg.Status
	for _, t := range chg.Tasks {
		wt := &watchTask{ID: t.ID, Kind: t.Kind, Status: t.Status, Summary: t.Summary}
		if old, ok := st.tasks[t.ID]; !ok || old != t.Status {
			// Tasks still waiting to run are only shown once they start.
			if ok || (t.Status != "Do" && t.Status != "Wait") {
				ev := base
				ev.Task = wt
				a.emit(ev)
			}
			st.tasks[t.ID] = t.Status
		}
		for _, l := range t.Log[min(st.logs[t.ID], len(t.Log)):] {
			ev := base
			lt := *wt
			lt.Log = logText(l)
			ev.Task = &lt
			a.emit(ev)
		}
		st.logs[t.ID] = len(t.Log)
	}
}

func (a *app) emit(ev watchEvent) {
	if a.json {
		b, _ := json.Marshal(ev)
		fmt.Fprintf(a.stdout, "%s\n", b)
		return
	}
	ts := ev.Time.Format("15:04:05.000")
	switch {
	case ev.Task != nil && ev.Task.Log != "":
		fmt.Fprintf(a.stdout, "%s change %s   task %s log: %s\n", ts, ev.Change, ev.Task.ID, ev.Task.Log)
	case ev.Task != nil:
		fmt.Fprintf(a.stdout, "%s change %s   task %s %s: %s\n", ts, ev.Change, ev.Task.ID, ev.Task.Status, ev.Task.Summary)
	case ev.Err != "":
		fmt.Fprintf(a.stdout, "%s change %s %s %s: %s\n%s   error: %s\n", ts, ev.Change, ev.Kind, ev.Status, ev.Summary, ts, ev.Err)
	default:
		fmt.Fprintf(a.stdout, "%s change %s %s %s: %s\n", ts, ev.Change, ev.Kind, ev.Status, ev.Summary)
	}
}
