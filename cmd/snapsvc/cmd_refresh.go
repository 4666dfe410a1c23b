package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// refreshOutput is the --json shape of refresh.
type refreshOutput struct {
	Action    string            `json:"action"` // "refresh", "hold" or "unhold"
	Snap      string            `json:"snap"`
	Change    string            `json:"change,omitempty"`
	Status    string            `json:"status,omitempty"`
	NoUpdate  bool              `json:"no-update,omitempty"`
	Waited    bool              `json:"waited"`
	Attempts  int               `json:"attempts,omitempty"`
	Conflicts int               `json:"conflicts,omitempty"`
	WaitedFor []string          `json:"waited-for,omitempty"`
	Before    *refreshedSnap    `json:"before,omitempty"`
	After     *refreshedSnap    `json:"after,omitempty"`
	Hold      *refreshHoldState `json:"hold,omitempty"`
}

// refreshedSnap is a snap's revision in refresh's --json.
type refreshedSnap struct {
	Version  string `json:"version"`
	Revision string `json:"revision"`
	Channel  string `json:"channel,omitempty"`
}

// refreshHoldState is a snap's holds in refresh's --json.
type refreshHoldState struct {
	Held        bool      `json:"held"`
	Until       time.Time `json:"until,omitzero"`
	Forever     bool      `json:"forever,omitempty"`
	GatingUntil time.Time `json:"gating-until,omitzero"`
}

// refreshFlags are refresh's own flags.
type refreshFlags struct {
	channel, revision string
	amend, classic    bool
	hold              string // "" (not given), "forever" or a duration
	holdLevel         string
	unhold            bool
}

func (a *app) refreshCmd() *cobra.Command {
	f := &refreshFlags{holdLevel: string(snapsvc.HoldGeneral)}
	c := &cobra.Command{
		Use: "refresh [--channel C] [--revision R] [--amend] [--classic] [--no-wait] SNAP [FILE]\n  snapsvc refresh --hold[=DURATION] [--hold-level general|auto-refresh] SNAP\n  snapsvc refresh --unhold SNAP",
		Example: `  snapsvc refresh svcdemo                        # to the tracked channel's latest
  snapsvc refresh --channel 1.31/stable k8s       # and track that channel
  snapsvc refresh --revision 42 svcdemo
  snapsvc refresh svcdemo ./svcdemo_1.1_amd64.snap # a local file, as snap install --dangerous
  snapsvc refresh --hold svcdemo                  # hold its refreshes forever
  snapsvc refresh --hold=72h --hold-level auto-refresh svcdemo
  snapsvc refresh --unhold svcdemo`,
		Short: "Refresh a snap, or hold and unhold its refreshes",
		Long: `The refresh command refreshes one snap, as snap refresh does: to the latest
revision of the channel it tracks, of --channel, or to --revision; or, given a
FILE, to that local snap file, as snap install --dangerous FILE does. Another
change that holds the snap is waited out first; then snapsvc waits for its own
change and prints, as snap does, "NAME VERSION refreshed", or, on stderr,
'snap "NAME" has no updates available' (not an error: exit 0).

--hold holds the snap's refreshes for DURATION (forever when none is given),
at --hold-level general (auto-refreshes and refreshes of all snaps, as snap
refresh --hold NAME) or auto-refresh (auto-refreshes only); --unhold removes
the hold. A refresh that names the snap goes ahead whatever its hold: hold a
fleet's auto-refreshes, then refresh each machine when its turn comes. Holds
need snapd 2.58 or later.

A fleet refreshes at most N machines at a time under a restart budget
(docs/refresh.md): the library's Client.Refresh with WithRestartBudget, or a
snap's gate-auto-refresh hook with Client.GateAutoRefresh.`,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("refresh needs a snap name")
			}
			if len(args) > 2 {
				return usagef("refresh takes one snap, and optionally one snap file (got %d arguments)", len(args))
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			if err := f.check(c, args); err != nil {
				return err
			}
			return a.do(c, func(ctx context.Context) error {
				switch {
				case c.Flags().Changed("hold"):
					return a.holdRefresh(ctx, args[0], f)
				case f.unhold:
					return a.unholdRefresh(ctx, args[0])
				}
				file := ""
				if len(args) == 2 {
					file = args[1]
				}
				return a.refresh(ctx, args[0], snapsvc.RefreshOptions{Channel: f.channel, Revision: f.revision, File: file, Amend: f.amend, Classic: f.classic})
			})
		},
		ValidArgsFunction: func(c *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
			if len(args) == 1 {
				return []string{"snap"}, cobra.ShellCompDirectiveFilterFileExt
			}
			return a.completeSnaps(c, args, prefix)
		},
	}
	fs := c.Flags()
	fs.StringVar(&f.channel, "channel", "", "refresh from this `CHANNEL` (track/risk/branch), and track it from now on")
	fs.StringVar(&f.revision, "revision", "", "refresh to this `REVISION`")
	fs.BoolVar(&f.amend, "amend", false, "allow refreshing a snap installed from a file from the store")
	fs.BoolVar(&f.classic, "classic", false, "the snap (or FILE) is classically confined")
	fs.BoolVar(&a.noWait, "no-wait", false, "do not wait for the change: print its id and return")
	fs.StringVar(&f.hold, "hold", "", "hold the snap's refreshes for `DURATION` (e.g. 72h), forever when none is given")
	fs.Lookup("hold").NoOptDefVal = "forever"
	fs.Var(&choiceFlag{v: &f.holdLevel, choices: []string{string(snapsvc.HoldGeneral), string(snapsvc.HoldAutoRefresh)}}, "hold-level", "with --hold: the refreshes held, `LEVEL` general or auto-refresh")
	fs.BoolVar(&f.unhold, "unhold", false, "remove the hold on the snap's refreshes")
	return c
}

// check refuses flags that do not go together, before any request, as
// snap refresh does ("cannot use --hold with other flags").
func (f *refreshFlags) check(c *cobra.Command, args []string) error {
	hold := c.Flags().Changed("hold")
	refreshing := f.channel != "" || f.revision != "" || f.amend || f.classic || c.Flags().Changed("no-wait") || len(args) == 2
	switch {
	case hold && f.unhold:
		return usagef("cannot use --hold and --unhold together")
	case (hold || f.unhold) && refreshing:
		return usagef("cannot use --hold or --unhold with refresh flags or a FILE")
	case c.Flags().Changed("hold-level") && !hold:
		return usagef("--hold-level goes with --hold")
	case len(args) == 2 && (f.channel != "" || f.revision != "" || f.amend):
		return usagef("a snap FILE takes no --channel, --revision or --amend")
	}
	if strings.Contains(args[0], ".") {
		return usagef("refresh takes a snap, not a service: %q", args[0])
	}
	if hold && f.hold != "forever" {
		d, err := time.ParseDuration(f.hold)
		switch {
		case err != nil:
			return usagef("hold value must be a number of hours, minutes or seconds, or \"forever\": %v", err)
		case d < time.Second:
			return usagef("cannot hold refreshes for less than a second: %s", f.hold)
		}
	}
	return nil
}

// refresh refreshes snap and says what it did, as snap refresh does.
func (a *app) refresh(ctx context.Context, snap string, opts snapsvc.RefreshOptions) error {
	noWait := a.noWait
	kind := "refresh-snap"
	if opts.File != "" {
		kind = "install-snap"
	}
	// The refresh's change is of its own kind: said before the service
	// commands' observer says service-control (the first wait set wins).
	// A refresh takes as long as its download and the snap's hooks and
	// services take: like snap, it waits for its change as long as it
	// takes (--timeout bounds it).
	p := a.policy()
	p.ChangeWait = -1
	copts := []snapsvc.Option{snapsvc.WithObserver(func(ev snapsvc.Event) {
		if ev.Kind == snapsvc.EventAccepted && ev.ChangeID != "" {
			a.prog.waitFor(ev.ChangeID, kind)
		}
	})}
	if a.socket != "" {
		copts = append(copts, snapsvc.WithSocket(a.socket))
	}
	if a.snapdRoot != "" {
		copts = append(copts, snapsvc.WithSnapdRoot(a.snapdRoot))
	}
	// a.client's options, with this policy (the last WithPolicy wins).
	c, err := snapsvc.New(append(copts, snapsvc.WithLogger(a.logger()), snapsvc.WithPolicy(p), snapsvc.WithObserver(a.observe))...)
	if err != nil {
		return err
	}
	defer c.Close()
	a.prog.begin("refresh " + snap)
	a.prog.lookup(c)
	op, err := c.RefreshAsync(ctx, snap, opts)
	if err != nil {
		return err
	}
	res := op.Result()
	if !noWait {
		final, err := op.Wait(ctx)
		a.prog.end()
		if err != nil {
			return err
		}
		res = *final
	} else if final, err := op.Wait(doneContext(ctx)); err == nil {
		res = *final // a refresh with no update is final when submitted
	}
	a.prog.end()
	out := refreshOutput{Action: "refresh", Snap: snap, Change: res.ChangeID, Status: res.Status, NoUpdate: res.NoUpdate,
		Waited: !noWait, Attempts: res.Attempts, Conflicts: res.Conflicts, WaitedFor: res.WaitedFor}
	var after *snapsvc.SnapInfo
	if !noWait && !res.NoUpdate {
		// What it is now, for the "refreshed" line; the refresh is done
		// whatever this read meets.
		if after, err = c.Snap(ctx, snap); err == nil {
			out.After = &refreshedSnap{Version: after.Version, Revision: after.Revision, Channel: after.Channel}
		}
	}
	if a.json {
		a.printJSON(out)
		return nil
	}
	if len(out.WaitedFor) > 0 && a.chatty() {
		a.note("waited for change %s holding the snap (%d conflict(s) absorbed)", strings.Join(out.WaitedFor, ", "), out.Conflicts)
	}
	switch {
	case res.NoUpdate:
		fmt.Fprintf(a.stderr, "snap %q has no updates available\n", snap)
	case noWait:
		fmt.Fprintln(a.stdout, out.Change)
	case after != nil:
		fmt.Fprintln(a.stdout, refreshedLine(after))
	default:
		fmt.Fprintf(a.stdout, "%s refreshed\n", snap)
	}
	return nil
}

// refreshedLine is snap's "NAME (CHANNEL) VERSION from PUBLISHER
// refreshed" (cmd_snap_op.go showDoneSnap): the channel, as snap's
// channel.Parse names it, unless it is "stable"; the publisher only for a
// store snap, marked ✓ when verified and ✪ when starred, as snap marks
// them on a UTF-8 terminal.
func refreshedLine(s *snapsvc.SnapInfo) string {
	var b strings.Builder
	b.WriteString(s.Name)
	if ch := channelName(s.Channel); ch != "" && ch != "stable" {
		fmt.Fprintf(&b, " (%s)", ch)
	}
	b.WriteString(" " + s.Version)
	if s.Publisher != "" {
		mark := map[string]string{"verified": "✓", "starred": "✪"}[s.PublisherValidation]
		fmt.Fprintf(&b, " from %s%s", s.Publisher, mark)
	}
	b.WriteString(" refreshed")
	return b.String()
}

// channelName is a channel's name as snap's channel.Parse cleans it: the
// track "latest" left out, the risk stable when none is given
// ("latest/beta" is "beta", "1.31" is "1.31/stable"); "" for none.
func channelName(ch string) string {
	if ch == "" {
		return ""
	}
	risks := map[string]bool{"stable": true, "candidate": true, "beta": true, "edge": true}
	parts := strings.Split(ch, "/")
	var track, risk, branch string
	switch {
	case len(parts) == 1 && risks[parts[0]]:
		risk = parts[0]
	case len(parts) == 1:
		track = parts[0]
	case len(parts) == 2 && risks[parts[0]]:
		risk, branch = parts[0], parts[1]
	case len(parts) == 2:
		track, risk = parts[0], parts[1]
	default:
		track, risk, branch = parts[0], parts[1], strings.Join(parts[2:], "/")
	}
	if track == "latest" {
		track = ""
	}
	if risk == "" {
		risk = "stable"
	}
	name := risk
	if track != "" {
		name = track + "/" + name
	}
	if branch != "" {
		name += "/" + branch
	}
	return name
}

// holdRefresh holds snap's refreshes, as snap refresh --hold does.
func (a *app) holdRefresh(ctx context.Context, snap string, f *refreshFlags) error {
	opts := snapsvc.HoldOptions{Level: snapsvc.HoldLevel(f.holdLevel)}
	if f.hold != "forever" {
		opts.For, _ = time.ParseDuration(f.hold) // checked
	}
	c, err := a.client()
	if err != nil {
		return err
	}
	defer c.Close()
	h, err := c.HoldRefresh(ctx, snap, opts)
	if err != nil {
		return err
	}
	if a.json {
		a.printJSON(refreshOutput{Action: "hold", Snap: snap, Change: h.ChangeID, Status: "Done", Waited: true, Hold: holdState(h)})
		return nil
	}
	until := "indefinitely"
	if !h.Forever {
		until = "until " + h.Until.Format(time.RFC3339)
	}
	what := "General refreshes"
	if opts.Level == snapsvc.HoldAutoRefresh {
		what = "Auto-refreshes"
	}
	fmt.Fprintf(a.stdout, "%s of %q held %s\n", what, snap, until)
	return nil
}

// unholdRefresh removes snap's hold, as snap refresh --unhold does.
func (a *app) unholdRefresh(ctx context.Context, snap string) error {
	c, err := a.client()
	if err != nil {
		return err
	}
	defer c.Close()
	h, err := c.UnholdRefresh(ctx, snap)
	if err != nil {
		return err
	}
	if a.json {
		a.printJSON(refreshOutput{Action: "unhold", Snap: snap, Change: h.ChangeID, Status: "Done", Waited: true, Hold: holdState(h)})
		return nil
	}
	fmt.Fprintf(a.stdout, "Removed general refresh hold of %q\n", snap)
	return nil
}

func holdState(h *snapsvc.RefreshHold) *refreshHoldState {
	return &refreshHoldState{Held: h.Held(), Until: h.Until, Forever: h.Forever, GatingUntil: h.GatingUntil}
}
