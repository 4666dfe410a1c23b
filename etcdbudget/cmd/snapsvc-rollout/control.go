package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"runtime"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/snapsvc"
)

const controlUsage = `usage: snapsvc-rollout status KEY [flags]
       snapsvc-rollout pause KEY [--reason TEXT] [flags]
       snapsvc-rollout resume KEY [flags]

status: who holds KEY's slots and since when, who waits (in the order they
will be served), whether KEY is paused, the machines taking part.
pause: every machine that reaches the front of KEY's queue keeps its place
and its slot without restarting until resume; the others stay queued. A
restart already under way finishes. The pause stays until resumed.
resume: lifts the pause; the machines go on in queue order.

Exit codes: 0 done, 2 usage, 3 etcd unreachable (retryable).

Flags (--name value or --name=value; after KEY or before it):
`

// version is the module version the binary was built from.
func version() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, d := range bi.Deps {
			if d.Path == "github.com/snapsvc/snapsvc/etcdbudget" {
				v = d.Version
			}
		}
	}
	// The style every binary of the project prints (cmd/snapsvc's
	// --version): NAME VERSION (MODULE, GO).
	return fmt.Sprintf("%s (github.com/snapsvc/snapsvc/etcdbudget, %s)", v, runtime.Version())
}

// runControl runs an operator command: status, pause or resume.
func runControl(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) int {
	o := &options{}
	fs := newFlagSet("snapsvc-rollout "+cmd, controlUsage, stderr)
	etcdFlags(fs, o)
	var reason string
	if cmd == "pause" {
		fs.StringVar(&reason, "reason", "", "why, shown by status and to the machines held back")
	}
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound on the command")
	// The key may come before, between or after the flags.
	rest, err := parseFlags(fs, args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var key string
	fromEnv(o)
	switch {
	case err != nil:
	case len(rest) == 0:
		err = fmt.Errorf("%s: name the budget KEY, e.g. k8s.kube-apiserver", cmd)
	case len(rest) > 1:
		err = fmt.Errorf("%s: unexpected arguments %q", cmd, rest[1:])
	case o.endpoints == "":
		err = errors.New("--endpoints (or $ETCDCTL_ENDPOINTS) is required")
	}
	if err != nil {
		fmt.Fprintln(stderr, "snapsvc-rollout:", err)
		return exitUsage
	}
	key = rest[0]
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	cli, err := etcdClient(o)
	if err != nil {
		fmt.Fprintln(stderr, "snapsvc-rollout:", err)
		return clientExit(err)
	}
	defer cli.Close()
	holder := o.holder
	if holder == "" && cmd == "pause" {
		holder = operator() // the pause records who paused, not a process
	}
	b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Prefix: o.prefix, Holder: holder, Unreachable: o.unreachable})
	if err != nil {
		fmt.Fprintln(stderr, "snapsvc-rollout:", err)
		return exitUsage
	}
	var out any
	switch cmd {
	case "status":
		var st *etcdbudget.KeyStatus
		if st, err = b.Status(ctx, key); err == nil {
			out = st
			if !o.jsonOut {
				printStatus(stdout, st, time.Now())
			}
		}
	case "pause":
		var rec *etcdbudget.PauseRecord
		if rec, err = b.Pause(ctx, key, reason); err == nil {
			out = map[string]any{"key": key, "paused": rec}
			if !o.jsonOut {
				fmt.Fprintf(stdout, "%s paused by %s since %s%s\n", key, rec.By, rec.Since.Format(time.RFC3339), reasonSuffix(rec.Reason))
			}
		}
	case "resume":
		var was bool
		if was, err = b.Resume(ctx, key); err == nil {
			out = map[string]any{"key": key, "was_paused": was}
			if !o.jsonOut {
				if was {
					fmt.Fprintf(stdout, "%s resumed\n", key)
				} else {
					fmt.Fprintf(stdout, "%s was not paused\n", key)
				}
			}
		}
	}
	if err != nil {
		if o.jsonOut {
			json.NewEncoder(stdout).Encode(map[string]any{"error": map[string]any{"message": err.Error(), "retryable": errors.Is(err, snapsvc.ErrBudgetUnavailable)}})
		}
		fmt.Fprintln(stderr, "snapsvc-rollout:", err)
		if errors.Is(err, snapsvc.ErrBudgetRefused) {
			return exitUsage
		}
		return exitRetryable
	}
	if o.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	}
	return exitOK
}

// operator names who runs the command: the user who ran sudo
// ($SUDO_USER), else $USER (else the account's name), at this host.
func operator() string {
	who := os.Getenv("SUDO_USER")
	if who == "" {
		who = os.Getenv("USER")
	}
	if who == "" {
		if u, err := user.Current(); err == nil {
			who = u.Username
		}
	}
	if who == "" {
		who = "unknown"
	}
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return who + "@" + host
}

func reasonSuffix(r string) string {
	if r == "" {
		return ""
	}
	return " (" + r + ")"
}

// printStatus writes st for people.
func printStatus(w io.Writer, st *etcdbudget.KeyStatus, now time.Time) {
	fmt.Fprintf(w, "key:      %s\n", st.Key)
	fmt.Fprintf(w, "max:      %d", st.Max)
	if st.Pinned != nil {
		fmt.Fprintf(w, " (max-unavailable %s of %d machines, resolved by %s)", st.Pinned.Spec, st.Pinned.Participants, st.Pinned.By)
	}
	fmt.Fprintln(w)
	if st.Paused != nil {
		fmt.Fprintf(w, "paused:   by %s since %s%s\n", st.Paused.By, st.Paused.Since.Format(time.RFC3339), reasonSuffix(st.Paused.Reason))
	} else {
		fmt.Fprintln(w, "paused:   no")
	}
	if len(st.Participants) > 0 {
		fmt.Fprintf(w, "machines: %d taking part\n", len(st.Participants))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	section := func(title string, es []etcdbudget.Entry) {
		fmt.Fprintf(tw, "%s (%d)\n", title, len(es))
		for i, e := range es {
			since := e.Since // queued at
			if !e.Acquired.IsZero() {
				since = e.Acquired // held since
			}
			fmt.Fprintf(tw, "  %d\t%s\tsince %s\t(%s)\tlease %x%s\n", i+1, e.Holder, since.Format(time.RFC3339), now.Sub(since).Round(time.Second), e.Lease, entryNote(e, now))
		}
	}
	section("holders", st.Holders)
	section("waiters", st.Waiters)
	if len(st.Vanished) > 0 {
		section("vanished holders (lease expired, not released), slot held back by their lock-delay", st.Vanished)
	}
	tw.Flush()
}

// entryNote says what a holder recorded (its acts, its readiness) and
// what blocks a waiter.
func entryNote(e etcdbudget.Entry, now time.Time) string {
	var notes []string
	if len(e.BlockedBy) > 0 {
		notes = append(notes, "blocked by the lock-delay of "+strings.Join(e.BlockedBy, ", "))
	}
	if e.Acts > 0 && e.Acted.IsZero() {
		notes = append(notes, "may have acted (no act record: an earlier version)")
	} else if e.Acts > 0 {
		n := fmt.Sprintf("acted %s ago", now.Sub(e.Acted).Round(time.Second))
		if !e.ReadyAt.IsZero() {
			n += ", ready since " + e.ReadyAt.Format(time.RFC3339)
		} else {
			n += ", not ready since"
		}
		notes = append(notes, n)
	}
	if len(notes) == 0 {
		return ""
	}
	return "\t" + strings.Join(notes, "; ")
}
