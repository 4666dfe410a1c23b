package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// controlIntro is each operator command's help.
var controlIntro = map[string]string{
	"status": `status shows who holds KEY's slots and since when, who waits (in the order
they will be served; a waiter kept out only by a vanished holder's
lock-delay says so), the holders that vanished (lease expired, not released)
with what they recorded, whether KEY is paused or halted (which machine's
restart of which change halted it, why, since when, and how to resume it),
and the machines taking part. A key nothing has used is shown empty, with
a note on stderr naming the keys it resembles. --watch prints it again each
time it changes (as kubectl get -w, only on a change: a write to etcd that
changes nothing shown prints nothing), until Ctrl-C or --timeout. -w json
prints the etcdbudget.KeyStatus document (--watch: one per line), -w table
the holders and waiters as a table.`,
	"list": `list shows every budget key that has anything in etcd under --prefix
(holders, waiters, a pause or halt, machines that joined, a history), with
how many hold and wait and whether it is paused or halted. -w table prints a table, -w json a document
per key status.`,
	"pause": `pause holds KEY cluster-wide: every machine that reaches the front of KEY's
queue keeps its place and its slot without restarting until resume; the
others stay queued. A restart already under way finishes. The pause stays
until resumed, and records who paused: $SUDO_USER (else $USER) @ the host,
unless --holder names someone. A pause of a snap (pause k8s) holds every key
of its services.

KEY must be in use (see list), or the snap or part of a key in use: a key
nothing has used is refused (exit 1) with the keys it resembles, as kubectl
refuses to change an object that does not exist, and nothing is written.
--create pauses such a key anyway, e.g. before its first rollout.`,
	"resume": `resume lifts KEY's pause, or its halt (a key halts itself when a restart
fails: --halt-after); the machines go on in queue order, and failures are
counted again from here. The history records who resumed ($SUDO_USER, else
$USER, @ the host, unless --holder names someone) and --reason. A resume
lifts only the pause or halt it read: retried after a lost answer, it never
lifts a later one. A key nothing has used is refused (exit 1) with the keys
it resembles.`,
	"history": `history shows KEY's history, oldest first: each restart under the budget
(its machine, services, snapd change, outcome, time waited and held), each
halt, pause and resume. --limit N shows the last N records. -w table prints
a table, -w json the records as one JSON array (budget.Record documents,
an act's durations in seconds: waited_seconds, held_seconds). A key nothing
has used shows nothing, with a note on stderr naming the keys it resembles.`,
}

// controlShort is each operator command's one-line summary.
var controlShort = map[string]string{
	"status":  "Show who holds KEY's slots, who waits, the pause and the machines taking part",
	"pause":   "Hold every machine at the front of KEY's queue until resume",
	"resume":  "Lift KEY's pause or halt",
	"list":    "List the budget's keys, with their holders, waiters and pause",
	"history": "Show KEY's restarts, halts, pauses and resumes, oldest first",
}

// controlExamples are each operator command's examples.
var controlExamples = map[string]string{
	"status": `  snapsvc-rollout status k8s.kube-apiserver
  snapsvc-rollout status --watch -w table k8s.kube-apiserver
  ETCDCTL_ENDPOINTS=https://10.0.0.1:2379 snapsvc-rollout status -w json k8s`,
	"pause": `  snapsvc-rollout pause --reason "CVE-2026-1234 rollback" k8s.kube-apiserver
  snapsvc-rollout pause --create --reason "not before the audit" k8s.kubelet`,
	"resume": `  snapsvc-rollout resume --reason "bad config reverted" k8s.kube-apiserver`,
	"history": `  snapsvc-rollout history k8s.kube-apiserver
  snapsvc-rollout history --limit 20 -w table k8s.kube-apiserver
  snapsvc-rollout history -w json k8s.kube-apiserver`,
	"list": `  snapsvc-rollout list
  snapsvc-rollout list -w table --endpoints https://10.0.0.1:2379 --cacert ca.crt`,
}

// controlExits are the operator commands' exit codes.
var controlExits = clistyle.ExitCodes{
	{Code: exitOK, Text: "done"},
	{Code: exitNotFound, Text: "pause or resume of a KEY nothing has used (a typo?): nothing was written"},
	{Code: exitUsage, Text: "usage error (a malformed endpoint included), or etcd refused the client or the request (certificates, credentials, permission, an endpoint's scheme that does not match the server's: http:// to a TLS etcd)"},
	{Code: exitRetryable, Text: "etcd unreachable within --dial-timeout, or no answer within --command-timeout: retryable"},
}

// controlCmd is the operator command name (status, pause, resume, list):
// the etcd flags, --timeout, for pause --reason and for status --watch.
func (r *runner) controlCmd(name string) *cobra.Command {
	o := &options{}
	use := name + " KEY [flags]"
	switch name {
	case "pause":
		use = "pause KEY [--reason TEXT] [--create] [flags]"
	case "status":
		use = "status KEY [--watch] [-w simple|table|json] [flags]"
	case "list":
		use = "list [-w simple|table|json] [flags]"
	case "resume":
		use = "resume KEY [--reason TEXT] [flags]"
	case "history":
		use = "history KEY [--limit N] [-w simple|table|json] [flags]"
	}
	c := &cobra.Command{
		Use:               use,
		Short:             controlShort[name],
		Long:              controlExits.Help(controlIntro[name]),
		Example:           controlExamples[name],
		Annotations:       map[string]string{clistyle.ManLong: controlExits.Man(controlIntro[name])},
		ValidArgsFunction: completeKeys(o, name == "pause", true),
		// The key may come before, between or after the flags.
		RunE: func(c *cobra.Command, args []string) error {
			err := fromEnv(c.Flags(), o)
			switch {
			case err != nil:
			case name == "list" && len(args) > 0:
				err = fmt.Errorf("list: unexpected arguments %q", args)
			case name != "list" && len(args) == 0:
				err = fmt.Errorf("%s: name the budget KEY, e.g. k8s.kube-apiserver", name)
			case len(args) > 1:
				err = fmt.Errorf("%s: unexpected arguments %q", name, args[1:])
			case o.timeout < 0 || o.unreachable < 0:
				err = errors.New("--timeout and --unreachable must not be negative")
			case o.writeOut == "table" && name != "status" && name != "list" && name != "history":
				err = fmt.Errorf("--write-out table: for status, list and history; %s writes simple or json", name)
			case o.limit < 0:
				err = fmt.Errorf("--limit %d: must not be negative", o.limit)
			}
			if err == nil && len(args) > 0 {
				o.key = args[0]
				err = etcdbudget.CheckKey(o.key) // before anything is sent
			}
			if err != nil {
				return &clistyle.UsageError{Msg: err.Error(), Cmd: c.CommandPath()}
			}
			return r.do(c, name, o)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	etcdFlags(fs, o)
	switch name {
	case "pause":
		fs.StringVar(&o.reason, "reason", "", "why, shown by status and to the machines held back")
		fs.BoolVar(&o.create, "create", false, "pause KEY even if nothing has used it yet (else refused: a typo?)")
	case "resume":
		fs.StringVar(&o.reason, "reason", "", "why, recorded in the key's history")
	case "history":
		fs.IntVar(&o.limit, "limit", 0, "show the last `N` records (0: all that are kept)")
	case "status":
		fs.BoolVar(&o.watch, "watch", false, "print the status again each time it changes, until Ctrl-C or --timeout")
	}
	fs.DurationVar(&o.timeout, "timeout", 0, "bound on the whole command (0: none; each request is bound by --command-timeout)")
	return c
}

// control runs an operator command (status, pause, resume or list) and
// returns its exit code. Connecting is bound by --dial-timeout (an
// unreachable etcd fails then, as etcdctl does), each request by
// --command-timeout, the whole command by --timeout when set.
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
	if holder == "" && (cmd == "pause" || cmd == "resume") {
		holder = operator() // the pause and the resume record who, not a process
	}
	unreachable := o.dialTimeout
	if o.unreachable != etcdbudget.DefaultUnreachable && o.unreachable > 0 {
		unreachable = o.unreachable // given: how long to keep trying
	}
	// Each attempt of a request is bound as etcdctl bounds a dial: an
	// unreachable etcd fails after --dial-timeout, not etcdbudget's 2s.
	b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Prefix: o.prefix, Holder: holder, Unreachable: unreachable,
		Attempt: min(o.dialTimeout, o.commandTimeout)})
	if err != nil {
		return fail(err, exitUsage)
	}
	request := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, o.commandTimeout) }
	// A key nothing has used (known.go): a write is refused before it is
	// sent (unless pause --create); a read, once it succeeded (a watch:
	// before it starts), notes it on stderr.
	known := func() (unknown error, err error) {
		rctx, cancel := request()
		defer cancel()
		keys, scopes, err := keysInUse(rctx, b)
		if err != nil {
			return nil, err
		}
		what := ""
		if cmd == "pause" || cmd == "resume" {
			what = cmd
		}
		return unknownKey(key, o.prefix, what, keys, scopes), nil
	}
	note := func() bool {
		unknown, err := known()
		if err == nil && unknown != nil {
			fmt.Fprintf(stderr, "note: %v\n", unknown)
		}
		return unknown != nil
	}
	if (cmd == "pause" && !o.create) || cmd == "resume" || o.watch {
		unknown, kerr := known()
		switch {
		case kerr != nil:
			return fail(endpointHint(o, kerr), controlExit(kerr))
		case unknown != nil && o.watch:
			fmt.Fprintf(stderr, "note: %v\n", unknown)
		case unknown != nil:
			return fail(unknown, exitNotFound)
		}
	}
	var out any
	switch cmd {
	case "status":
		if o.watch {
			err = watchStatus(ctx, cli, b, o, request, stdout)
			break
		}
		rctx, cancel := request()
		st, serr := b.Status(rctx, key)
		cancel()
		if err = serr; err == nil {
			out = st
			writeStatus(stdout, o.writeOut, st, time.Now())
			note()
		}
	case "list":
		out, err = list(ctx, b, o, request, stdout, stderr)
	case "pause":
		rctx, cancel := request()
		rec, perr := b.Pause(rctx, key, o.reason)
		cancel()
		if err = perr; err == nil {
			out = map[string]any{"key": key, "paused": rec}
			if !o.jsonOut {
				fmt.Fprintf(stdout, "%s paused by %s since %s%s\n", key, rec.By, rec.Since.Format(time.RFC3339), reasonSuffix(rec.Reason))
			}
		}
	case "resume":
		rctx, cancel := request()
		st, serr := b.Status(rctx, key)
		var was bool
		if err = serr; err == nil {
			was, err = b.ResumeWith(rctx, key, o.reason)
		}
		cancel()
		if err == nil {
			m := map[string]any{"key": key, "was_paused": was}
			if st.Halt != nil && was {
				m["was_halted"] = st.Halt
			}
			out = m
			if !o.jsonOut {
				switch {
				case was && st.Halt != nil:
					fmt.Fprintf(stdout, "%s resumed (it was halted: %s)\n", key, etcdbudget.HaltSummary(*st.Halt))
				case was:
					fmt.Fprintf(stdout, "%s resumed\n", key)
				default:
					fmt.Fprintf(stdout, "%s was not paused\n", key)
				}
			}
		}
	case "history":
		rctx, cancel := request()
		recs, herr := b.History(rctx, key, o.limit)
		cancel()
		if err = herr; err == nil {
			out = recordDocs(recs)
			switch o.writeOut {
			case "json":
			case "table":
				historyTable(stdout, recs)
			default:
				printHistory(stdout, recs)
			}
			if len(recs) == 0 && !note() && o.writeOut == "simple" {
				fmt.Fprintf(stderr, "no history of %s under %s\n", etcdbudget.Key(key), o.prefix)
			}
		}
	}
	switch {
	case err != nil && o.watch && ctx.Err() != nil && !errors.Is(err, snapsvc.ErrBudgetRefused):
		return exitOK // a watch ends when interrupted or at --timeout
	case err != nil:
		return fail(endpointHint(o, err), controlExit(err))
	}
	if o.jsonOut && !o.watch && cmd != "status" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	}
	return exitOK
}

// controlExit is the exit code of an operator command's failed request:
// usage when etcd refused it, retryable otherwise.
func controlExit(err error) int {
	if errors.Is(err, snapsvc.ErrBudgetRefused) {
		return exitUsage
	}
	return exitRetryable
}

// writeStatus writes st in format: simple (printStatus), table, or json
// (one indented document).
func writeStatus(w io.Writer, format string, st *etcdbudget.KeyStatus, now time.Time) {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(st)
	case "table":
		statusTable(w, st, now)
	default:
		printStatus(w, st, now)
	}
}

// watchStatus prints key's status, then again each time anything of the
// key changes in etcd (its entries, guards, pause, pin, participants),
// until ctx ends. Under -w json each status is one line.
func watchStatus(ctx context.Context, cli *clientv3.Client, b *etcdbudget.Budget, o *options, request func() (context.Context, context.CancelFunc), w io.Writer) error {
	key := etcdbudget.Key(o.key)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	changes := cli.Watch(wctx, o.prefix+key, clientv3.WithPrefix())
	var shown *etcdbudget.KeyStatus // the status last printed
	for {
		rctx, rcancel := request()
		st, err := b.Status(rctx, key)
		rcancel()
		if err != nil {
			return err
		}
		// Only a change prints, as kubectl get -w: a write that changes
		// nothing this format shows (a record put again, a lock-delay
		// guard beside its entry) prints nothing.
		if now := time.Now(); shown == nil || !sameStatus(o.writeOut, shown, st, now) {
			switch {
			case o.writeOut == "json":
				json.NewEncoder(w).Encode(st)
			default:
				if shown != nil {
					fmt.Fprintln(w)
				}
				fmt.Fprintf(w, "-- %s (revision %d)\n", now.Format(time.RFC3339), st.Revision)
				writeStatus(w, o.writeOut, st, now)
			}
			shown = st
		}
		for relevant := false; !relevant; {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case wr, ok := <-changes:
				if !ok || wr.Err() != nil {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					return fmt.Errorf("%w: watching %s: %v", snapsvc.ErrBudgetUnavailable, key, wr.Err())
				}
				for _, ev := range wr.Events {
					// The prefix also matches longer keys ("k8s" and
					// "k8s.kubelet"): only this key's own records count.
					rest := strings.TrimPrefix(string(ev.Kv.Key), o.prefix+key)
					// Its history is not its status.
					if rest == "" || rest[0] == '/' || (rest[0] == '#' && !strings.HasPrefix(rest, "#history")) {
						relevant = true
					}
				}
			}
		}
	}
}

// sameStatus reports whether a and b print the same in format at now:
// the same document but for its revision (json), the same text (simple,
// table).
func sameStatus(format string, a, b *etcdbudget.KeyStatus, now time.Time) bool {
	var x, y bytes.Buffer
	if format == "json" {
		ac, bc := *a, *b
		ac.Revision, bc.Revision = 0, 0
		json.NewEncoder(&x).Encode(ac)
		json.NewEncoder(&y).Encode(bc)
	} else {
		writeStatus(&x, format, a, now)
		writeStatus(&y, format, b, now)
	}
	return bytes.Equal(x.Bytes(), y.Bytes())
}

// keySummary is one key of list.
type keySummary struct {
	Key     string                  `json:"key"`
	Max     int                     `json:"max"`
	Holders int                     `json:"holders"`
	Waiters int                     `json:"waiters"`
	Paused  *etcdbudget.PauseRecord `json:"paused,omitempty"`
	Halt    *budget.Halt            `json:"halt,omitempty"`
}

// list prints every key of the budget and returns them (for -w json).
func list(ctx context.Context, b *etcdbudget.Budget, o *options, request func() (context.Context, context.CancelFunc), w, stderr io.Writer) ([]keySummary, error) {
	rctx, cancel := request()
	keys, err := b.Keys(rctx)
	cancel()
	if err != nil {
		return nil, err
	}
	out := []keySummary{}
	for _, k := range keys {
		rctx, cancel := request()
		st, err := b.Status(rctx, k)
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, keySummary{Key: st.Key, Max: st.Max, Holders: len(st.Holders), Waiters: len(st.Waiters), Paused: st.Paused, Halt: st.Halt})
	}
	switch o.writeOut {
	case "json":
	case "table":
		rows := [][]string{{"KEY", "MAX", "HOLDERS", "WAITERS", "PAUSED"}}
		for _, s := range out {
			rows = append(rows, []string{s.Key, strconv.Itoa(s.Max), strconv.Itoa(s.Holders), strconv.Itoa(s.Waiters), pausedCell(s.Key, s.Paused)})
		}
		asciiTable(w, rows)
	default:
		// etcdctl's simple: one line per item, fields comma-separated.
		for _, s := range out {
			fmt.Fprintf(w, "%s, max %d, %d holding, %d waiting, %s\n", s.Key, s.Max, s.Holders, s.Waiters, pausedCell(s.Key, s.Paused))
		}
		if len(out) == 0 {
			fmt.Fprintf(stderr, "no budget keys under %s\n", o.prefix)
		}
	}
	return out, nil
}

// pausedCell says whether key is paused, by whom, or halted, by which
// restart, and how to resume it.
func pausedCell(key string, p *etcdbudget.PauseRecord) string {
	switch {
	case p == nil:
		return "not paused"
	case p.Halt != nil:
		return fmt.Sprintf("HALTED since %s: %s; resume with: %s", p.Halt.Since.Format(time.RFC3339), etcdbudget.HaltSummary(*p.Halt), etcdbudget.ResumeCommand(key))
	}
	return "paused by " + p.By
}

// statusTable writes st's holders, waiters and vanished holders as one
// table (etcdctl's -w table).
func statusTable(w io.Writer, st *etcdbudget.KeyStatus, now time.Time) {
	rows := [][]string{{"KEY", "ROLE", "#", "HOLDER", "SINCE", "FOR", "LEASE", "NOTE"}}
	add := func(role string, es []etcdbudget.Entry) {
		for i, e := range es {
			since := e.Since
			if !e.Acquired.IsZero() {
				since = e.Acquired
			}
			rows = append(rows, []string{st.Key, role, strconv.Itoa(i + 1), e.Holder, since.Format(time.RFC3339), age(now, since),
				fmt.Sprintf("%x", e.Lease), strings.TrimPrefix(entryNote(e, now), "\t")})
		}
	}
	add("holder", st.Holders)
	add("waiter", st.Waiters)
	add("vanished", st.Vanished)
	asciiTable(w, rows)
	fmt.Fprintf(w, "max %d, %s\n", st.Max, pausedCell(st.Key, st.Paused))
}

// asciiTable writes rows (the first the header) as etcdctl's -w table
// does: +---+ borders, cells left-aligned.
func asciiTable(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	sep := "+"
	for _, n := range widths {
		sep += strings.Repeat("-", n+2) + "+"
	}
	line := func(r []string) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range r {
			b.WriteString(" " + c + strings.Repeat(" ", widths[i]-len([]rune(c))) + " |")
		}
		fmt.Fprintln(w, b.String())
	}
	fmt.Fprintln(w, sep)
	line(rows[0])
	fmt.Fprintln(w, sep)
	for _, r := range rows[1:] {
		line(r)
	}
	fmt.Fprintln(w, sep)
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
	if h := st.Halt; h != nil {
		fmt.Fprintf(w, "HALTED:   since %s, after %d failed restart(s): %s\n", h.Since.Format(time.RFC3339), h.Failures, etcdbudget.HaltSummary(*h))
		fmt.Fprintf(w, "          halted by %s; no machine restarts under this key until it is resumed\n", h.Holder)
		fmt.Fprintf(w, "          resume with: %s\n", etcdbudget.ResumeCommand(st.Key))
	} else if st.Paused != nil {
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
			fmt.Fprintf(tw, "  %d\t%s\tsince %s\t(%s)\tlease %x%s\n", i+1, e.Holder, since.Format(time.RFC3339), age(now, since), e.Lease, entryNote(e, now))
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
	switch {
	case e.Acts > 0 && e.Acted.IsZero():
		notes = append(notes, "may have acted (no act record: an earlier version)")
	case e.Acts > 0 && e.ReadyAt.IsZero():
		notes = append(notes, "acted "+ago(now, e.Acted)+", not marked ready since")
	case e.Acts > 0:
		notes = append(notes, "acted "+ago(now, e.Acted)+", marked ready "+ago(now, e.ReadyAt))
	}
	if len(notes) == 0 {
		return ""
	}
	return "\t" + strings.Join(notes, "; ")
}

// ago says when t was, seen from now, in words: "7s ago", "just now"
// (under a second), or how far ahead of this machine's clock it is (t is
// another machine's clock).
func ago(now, t time.Time) string {
	switch d := now.Sub(t); {
	case d > -time.Second && d < time.Second:
		return "just now"
	case d < 0:
		return fmt.Sprintf("%s ahead of this machine's clock", (-d).Round(time.Second))
	default:
		return d.Round(time.Second).String() + " ago"
	}
}

// age is how long ago t was, in whole seconds, as kubectl's AGE column:
// "0s" under a second, and so for a time ahead of this machine's clock.
func age(now, t time.Time) string {
	return max(now.Sub(t), 0).Round(time.Second).String()
}

// printHistory writes records for people, one line each.
func printHistory(w io.Writer, recs []budget.Record) {
	for _, r := range recs {
		fmt.Fprintf(w, "#%d %s %s\n", r.Seq, r.Time.Format(time.RFC3339), describeRecord(r))
	}
}

// describeRecord is a history record in words.
func describeRecord(r budget.Record) string {
	switch {
	case r.Kind == budget.RecordAct && r.Act != nil:
		a := r.Act
		who := a.Machine
		if who == "" {
			who = a.Holder
		}
		msg := fmt.Sprintf("%s: %s's %s of %s", a.Outcome, who, a.Action, strings.Join(a.Services, ", "))
		if a.Change != "" {
			msg += " (change " + a.Change + ")"
		}
		msg += fmt.Sprintf(", waited %s, held %s", a.Waited.Round(time.Millisecond), a.Held.Round(time.Millisecond))
		if a.Reason != "" {
			msg += ": " + a.Reason
		}
		return msg
	case r.Kind == budget.RecordHalted && r.Halt != nil:
		return fmt.Sprintf("HALTED after %d failed restart(s): %s", r.Halt.Failures, etcdbudget.HaltSummary(*r.Halt))
	case r.Kind == budget.RecordPaused, r.Kind == budget.RecordResumed:
		return string(r.Kind) + " by " + r.By + reasonSuffix(r.Reason)
	}
	return fmt.Sprintf("%s %s", r.Kind, r.Reason)
}

// historyTable writes records as a table (etcdctl's -w table).
func historyTable(w io.Writer, recs []budget.Record) {
	rows := [][]string{{"SEQ", "TIME", "KIND", "MACHINE", "SERVICES", "CHANGE", "OUTCOME", "WAITED", "HELD", "NOTE"}}
	for _, r := range recs {
		row := []string{strconv.FormatInt(r.Seq, 10), r.Time.Format(time.RFC3339), string(r.Kind), "", "", "", "", "", "", ""}
		switch {
		case r.Act != nil:
			a := r.Act
			row[3], row[4], row[5], row[6] = a.Machine, strings.Join(a.Services, ","), a.Change, string(a.Outcome)
			row[7], row[8], row[9] = a.Waited.Round(time.Millisecond).String(), a.Held.Round(time.Millisecond).String(), a.Reason
		case r.Halt != nil:
			row[3], row[4], row[5] = r.Halt.Machine, strings.Join(r.Halt.Services, ","), r.Halt.Change
			row[9] = fmt.Sprintf("after %d failed restart(s): %s", r.Halt.Failures, r.Halt.Reason)
		default:
			row[9] = "by " + r.By + reasonSuffix(r.Reason)
		}
		rows = append(rows, row)
	}
	asciiTable(w, rows)
}
