package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// controlIntro is each operator command's help.
var controlIntro = map[string]string{
	"status": `status shows who holds KEY's slots and since when, who waits (in the order
they will be served; a waiter kept out only by a vanished holder's
lock-delay says so), the holders that vanished (lease expired, not released)
with what they recorded, whether KEY is paused, and the machines taking
part. --json prints the etcdbudget.KeyStatus document.`,
	"pause": `pause holds KEY cluster-wide: every machine that reaches the front of KEY's
queue keeps its place and its slot without restarting until resume; the
others stay queued. A restart already under way finishes. The pause stays
until resumed, and records who paused: $SUDO_USER (else $USER) @ the host,
unless --holder names someone. A pause of a snap (pause k8s) holds every key
of its services.`,
	"resume": `resume lifts KEY's pause; the machines go on in queue order.`,
}

// controlShort is each operator command's one-line summary.
var controlShort = map[string]string{
	"status": "Show who holds KEY's slots, who waits, the pause and the machines taking part",
	"pause":  "Hold every machine at the front of KEY's queue until resume",
	"resume": "Lift KEY's pause",
}

// controlExits are the operator commands' exit codes.
var controlExits = clistyle.ExitCodes{
	{Code: exitOK, Text: "done"},
	{Code: exitUsage, Text: "usage error, or etcd refused the client or the request (certificates, credentials, permission)"},
	{Code: exitRetryable, Text: "etcd unreachable within --timeout: retryable"},
}

// controlCmd is the operator command name (status, pause, resume): the
// etcd flags, --timeout (10s), and for pause --reason.
func (r *runner) controlCmd(name string) *cobra.Command {
	o := &options{}
	use := name + " KEY [flags]"
	if name == "pause" {
		use = "pause KEY [--reason TEXT] [flags]"
	}
	c := &cobra.Command{
		Use:               use,
		Short:             controlShort[name],
		Long:              controlExits.Help(controlIntro[name]),
		Annotations:       map[string]string{clistyle.ManLong: controlExits.Man(controlIntro[name])},
		ValidArgsFunction: cobra.NoFileCompletions,
		// The key may come before, between or after the flags.
		RunE: func(c *cobra.Command, args []string) error {
			fromEnv(o)
			var err error
			switch {
			case len(args) == 0:
				err = fmt.Errorf("%s: name the budget KEY, e.g. k8s.kube-apiserver", name)
			case len(args) > 1:
				err = fmt.Errorf("%s: unexpected arguments %q", name, args[1:])
			case o.endpoints == "":
				err = errors.New("--endpoints (or $ETCDCTL_ENDPOINTS) is required")
			case o.timeout < 0 || o.unreachable < 0:
				err = errors.New("--timeout and --unreachable must not be negative")
			}
			if err != nil {
				return &clistyle.UsageError{Msg: err.Error(), Cmd: c.CommandPath()}
			}
			o.key = args[0]
			return r.do(c, name, o)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	etcdFlags(fs, o)
	if name == "pause" {
		fs.StringVar(&o.reason, "reason", "", "why, shown by status and to the machines held back")
	}
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "bound on the command")
	return c
}

// control runs an operator command (status, pause or resume) and returns
// its exit code.
func control(ctx context.Context, cmd string, o *options, stdout, stderr io.Writer) int {
	key := o.key
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	fail := (&printer{json: o.jsonOut, stdout: stdout, stderr: stderr}).fail
	cli, err := etcdClient(o)
	if err != nil {
		return fail(err, clientExit(err))
	}
	defer cli.Close()
	holder := o.holder
	if holder == "" && cmd == "pause" {
		holder = operator() // the pause records who paused, not a process
	}
	b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Prefix: o.prefix, Holder: holder, Unreachable: o.unreachable})
	if err != nil {
		return fail(err, exitUsage)
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
		if rec, err = b.Pause(ctx, key, o.reason); err == nil {
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
		if errors.Is(err, snapsvc.ErrBudgetRefused) {
			return fail(err, exitUsage)
		}
		return fail(err, exitRetryable)
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
