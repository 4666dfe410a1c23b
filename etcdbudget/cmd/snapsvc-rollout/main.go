// Command snapsvc-rollout restarts snap services under a cluster-wide
// restart budget kept in etcd, so that the same command run on every
// machine gives a serial (or N-at-a-time) rollout: each machine waits for
// a slot, restarts, waits until the service is ready again (the readiness
// URL answers 2xx, then --settle), and only then gives the slot to the
// next machine.
//
//	snapsvc-rollout --endpoints https://10.0.0.1:2379,https://10.0.0.2:2379 \
//		--cacert ca.crt --cert client.crt --key client.key \
//		--budget-key k8s.kube-apiserver --max 1 \
//		--ready-url https://127.0.0.1:6443/readyz --ready-ca /etc/kubernetes/pki/ca.crt \
//		--settle 5s k8s.kube-apiserver
//
// Progress lines on stderr say who holds the slot and how many wait ahead;
// with --json, stdout carries one JSON object per event and a final
// {"result": ...} or {"error": ...} object. In every command's JSON, times
// are RFC 3339 strings and durations numbers of seconds in fields named
// *_seconds ("waited_seconds", "held_seconds").
//
// Flags: etcdctl's, with its defaults, --endpoints (default 127.0.0.1:2379,
// as etcdctl; each URL checked before anything is sent), --cacert, --cert, --key (etcd's client key file),
// --user, --password, --dial-timeout (2s), --command-timeout (5s),
// -w/--write-out simple|table|json, each also from its ETCDCTL_* variable
// ($ETCDCTL_USER as USER or USER:PASSWORD), as etcdctl reads them (a flag
// wins; v0.2's --etcd-ca, --etcd-cert, --etcd-key, --etcd-user and
// --etcd-password are deprecated aliases),
// --budget-key (one budget key for the whole restart; default: each service's
// own key, a snap name standing for every one of its services, so a
// restart of "k8s" on one machine and of "k8s.kube-apiserver" on another
// exclude each other while two different services do not),
// --legacy-key (during an upgrade from v0.1.1: the budget key machines
// still on v0.1.1 use for these services, verbatim as they were given it:
// their --key, else their names joined with "+" in the order given;
// repeatable), --legacy-snap-keys (default true: also count the holders
// of v0.1.1's whole-snap keys, a snap's name; set false once no machine
// runs v0.1.1),
// --max-unavailable (a count, or a percentage of the machines taking
// part, such as 25%: resolved once per rollout over the machines that
// joined within --join-period (default 10s) of the first, rounded down but
// at least 1, and pinned in etcd; default 1; every machine must use the
// same), --max (the same as a count), --window (a maintenance
// window such as "Mon-Fri 22:00-04:00 Europe/Berlin": outside it the
// command waits), --ttl (lease, default 10s), --unreachable (how long
// etcd may be unreachable before failing, default 15s), --fail-open
// (restart anyway when etcd stays unreachable), --bootstrap (no cluster
// exists yet: restart without a budget), --max-wait (bound on waiting for
// a slot), --holder (default "HOSTNAME pid PID"), --prefix, --ready-url,
// --ready-ca, --ready-cert, --ready-key, --ready-insecure,
// --ready-interval, --ready-timeout, --settle, --reload, --socket, --json,
// --timeout, --version, --help, --halt-after (failed restarts of a key,
// counted since its last good one or resume, that halt it: no machine
// restarts under it until `snapsvc-rollout resume KEY`; default 1,
// negative: never), --admit-command (a shell command asked, once the slot
// is held and right before restarting, whether the cluster may lose this
// machine's services now: exit 0 admits, otherwise its first output line
// says why not, and it is asked again with backoff, the slot kept),
// --admit-url (the same as a URL: 2xx admits; --admit-ca,
// --admit-insecure), --refresh (refresh the one snap named instead of
// restarting it, as snap refresh does: --channel, --revision, --amend,
// --classic, or --refresh-file FILE as snap install --dangerous; no
// updates available is done, exit 0).
//
// Operator commands, with the same etcd flags:
//
//	snapsvc-rollout list           every budget key: holders, waiters, pause
//	snapsvc-rollout status KEY [--watch]
//	                               who holds the key's slots (since when), who waits, in order
//	                               (--watch: again at each change)
//	snapsvc-rollout pause KEY [--reason TEXT] [--create]
//	                               hold every machine at the front of the queue until resumed
//	snapsvc-rollout resume KEY [--reason TEXT]
//	                               lift the key's pause or halt
//	snapsvc-rollout history KEY [--limit N]
//	                               the key's restarts, halts, pauses and resumes, oldest first
//
// pause and resume refuse a KEY nothing has used (exit 1: a typo?),
// naming the keys it resembles, and write nothing; pause --create pauses
// it anyway. status and history of such a key say so on stderr. KEY (and
// --budget-key) complete in the shell from the keys in etcd, read within
// a second.
//
// And, as every binary of the project (github.com/snapsvc/snapsvc/cmd/clistyle):
// GNU-style flags anywhere among the arguments ("--" ends them), help on
// stdout (--help, help COMMAND), --version (and version), completion
// bash|zsh|fish; man pages from a build with the manpages tag ("go run
// -tags manpages ./cmd/snapsvc-rollout man DIR"; the shipped binary has no
// man command). Errors are one line on stderr after "error: ";
// a usage error adds how to get the help.
//
// Exit codes: 0 done and ready, 1 failed (check the service before
// running again), 2 usage (a malformed endpoint, a CA file with no
// certificate) or etcd refused the client (an endpoint's scheme that does
// not match the server's included: said at once, not retried), 3
// retryable (nothing was restarted), 130 interrupted; --help and the man
// page list what each covers (rolloutExits, controlExits).
//
// The command is in the module github.com/snapsvc/snapsvc/etcdbudget/cmd,
// apart from the library etcdbudget, so that the CLI's dependencies
// (cobra) never reach a consumer of the library.
package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

func main() { os.Exit(realMain()) }

// realMain runs the command line of this process and returns its exit
// code (the tests' scripts run it as the snapsvc-rollout command).
func realMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, os.Args[1:], os.Stdout, os.Stderr)
}

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitRetryable   = 3
	exitInterrupted = 130
)

type options struct {
	endpoints, key, holder, prefix, socket      string
	endpointsFrom                               string // where --endpoints came from: the flag, $ETCDCTL_ENDPOINTS or etcdctl's default
	create                                      bool   // pause --create
	etcdCA, etcdCert, etcdKey                   string
	etcdUser, etcdPassword                      string
	dialTimeout, commandTimeout                 time.Duration
	writeOut                                    string
	watch                                       bool
	joinPeriod                                  time.Duration
	readyURL, readyCA, readyCert, readyKey      string
	readyInsecure, jsonOut, failOpen, bootstrap bool
	reload                                      bool
	legacyKeys                                  []string // --legacy-key, verbatim
	legacySnapKeys                              bool
	max                                         int
	maxUnavailable, window, reason              string
	ttl, unreachable, maxWait, settle, timeout  time.Duration
	readyInterval, readyTimeout                 time.Duration
	names                                       []string
	limit                                       int // history --limit
	haltAfter                                   int
	admitCommand, admitURL, admitCA             string
	admitInsecure                               bool
	refresh                                     refreshOptions // --refresh (refresh.go)
}

// defaultEndpoint is etcdctl's default --endpoints; defaultEndpointsFrom
// says the endpoints are that default (options.endpointsFrom).
const (
	defaultEndpoint      = "127.0.0.1:2379"
	defaultEndpointsFrom = "the default --endpoints (etcdctl's)"
)

// etcdFlags are the flags every command shares: etcdctl's, with its
// names and defaults (--endpoints 127.0.0.1:2379, --cacert, --cert, --key, --user,
// --password, --dial-timeout 2s, --command-timeout 5s, -w/--write-out),
// each also read from its ETCDCTL_* variable (fromEnv); v0.2's --etcd-*
// spellings stay as deprecated aliases.
func etcdFlags(fs *pflag.FlagSet, o *options) {
	fs.StringVar(&o.endpoints, "endpoints", defaultEndpoint, "etcd client `URLs`, comma-separated: http://HOST:PORT, https://HOST:PORT or HOST:PORT ($ETCDCTL_ENDPOINTS)")
	fs.StringVar(&o.etcdCA, "cacert", "", "verify etcd's certificate with this CA bundle `FILE` ($ETCDCTL_CACERT)")
	fs.StringVar(&o.etcdCert, "cert", "", "client certificate `FILE` for etcd ($ETCDCTL_CERT)")
	fs.StringVar(&o.etcdKey, "key", "", "client key `FILE` for etcd ($ETCDCTL_KEY); the budget key is --budget-key")
	fs.StringVar(&o.etcdUser, "user", "", "etcd user, `USER` or USER:PASSWORD ($ETCDCTL_USER)")
	fs.StringVar(&o.etcdPassword, "password", "", "etcd user's `PASSWORD` ($ETCDCTL_PASSWORD)")
	fs.DurationVar(&o.dialTimeout, "dial-timeout", 2*time.Second, "give up connecting to etcd after this, as etcdctl ($ETCDCTL_DIAL_TIMEOUT)")
	fs.DurationVar(&o.commandTimeout, "command-timeout", 5*time.Second, "give up an etcd request after this, as etcdctl ($ETCDCTL_COMMAND_TIMEOUT)")
	fs.StringVarP(&o.writeOut, "write-out", "w", "simple", "output `FORMAT`: simple, table (status, list, history) or json ($ETCDCTL_WRITE_OUT)")
	for _, a := range [][2]string{{"etcd-ca", "cacert"}, {"etcd-cert", "cert"}, {"etcd-key", "key"}, {"etcd-user", "user"}, {"etcd-password", "password"}} {
		f := fs.Lookup(a[1])
		fs.Var(f.Value, a[0], f.Usage)
		fs.MarkDeprecated(a[0], "use --"+a[1]+", as etcdctl (removed in v0.3.0)")
	}
	fs.StringVar(&o.prefix, "prefix", etcdbudget.DefaultPrefix, "etcd key `PREFIX` of the budget")
	fs.StringVar(&o.holder, "holder", "", "`NAME` shown to other machines (default HOSTNAME pid PID)")
	fs.BoolVar(&o.jsonOut, "json", false, "JSON on stdout (as --write-out json)")
	fs.DurationVar(&o.unreachable, "unreachable", etcdbudget.DefaultUnreachable, "how long etcd may be unreachable before giving up")
	for _, name := range []string{"cacert", "cert", "key"} {
		fs.SetAnnotation(name, cobra.BashCompFilenameExt, nil) // complete files
	}
}

// etcdctlEnv are the flags etcdctl reads from ETCDCTL_<FLAG> (its flag
// name upper-cased, "-" as "_"), as it does: a flag given on the command
// line wins over its variable.
var etcdctlEnv = []string{"endpoints", "cacert", "cert", "key", "user", "password", "dial-timeout", "command-timeout", "write-out"}

// fromEnv sets each etcdctl flag not given on the command line from its
// ETCDCTL_* variable, then applies what follows from the flags: USER:PASSWORD,
// --json as -w json. A variable whose value the flag refuses, or an
// endpoint etcd's client cannot read, is a usage error naming it.
func fromEnv(fs *pflag.FlagSet, o *options) error {
	o.endpointsFrom = "--endpoints"
	if !fs.Changed("endpoints") {
		o.endpointsFrom = defaultEndpointsFrom
		if v, ok := os.LookupEnv("ETCDCTL_ENDPOINTS"); ok && v != "" {
			o.endpointsFrom = "$ETCDCTL_ENDPOINTS"
		}
	}
	for _, name := range etcdctlEnv {
		env := "ETCDCTL_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		v, ok := os.LookupEnv(env)
		if !ok || v == "" || fs.Changed(name) || (name == "cacert" && fs.Changed("etcd-ca")) || (name == "cert" && fs.Changed("etcd-cert")) ||
			(name == "key" && fs.Changed("etcd-key")) || (name == "user" && fs.Changed("etcd-user")) || (name == "password" && fs.Changed("etcd-password")) {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			return fmt.Errorf("$%s=%q: %v", env, v, err)
		}
	}
	if user, pass, ok := strings.Cut(o.etcdUser, ":"); ok && o.etcdPassword == "" {
		o.etcdUser, o.etcdPassword = user, pass // etcdctl's --user USER:PASSWORD
	}
	switch o.writeOut {
	case "simple", "table", "json":
	default:
		return fmt.Errorf("--write-out %q: want simple, table or json", o.writeOut)
	}
	if o.jsonOut {
		o.writeOut = "json"
	}
	o.jsonOut = o.writeOut == "json"
	if o.dialTimeout <= 0 || o.commandTimeout <= 0 {
		return errors.New("--dial-timeout and --command-timeout must be positive")
	}
	if err := etcdbudget.CheckEndpoints(strings.Split(o.endpoints, ",")); err != nil {
		return fmt.Errorf("%s: %v", o.endpointsFrom, err)
	}
	if o.etcdKey != "" {
		// v0.2's --key was the budget key: a key that is no file is that.
		if _, err := os.Stat(o.etcdKey); err != nil && o.etcdCert == "" {
			return fmt.Errorf("--key %q: no such file: --key is etcd's client key FILE (as etcdctl's); the budget key is --budget-key", o.etcdKey)
		}
	}
	return nil
}

const rolloutIntro = `snapsvc-rollout restarts snap services under a cluster-wide restart budget
kept in etcd. Run the same command on every machine: each waits for a slot,
restarts, waits until the service is ready again (--ready-url answers 2xx,
then --settle) and only then gives the slot to the next machine. Progress
goes to stderr; --json prints one JSON object per event on stdout and a
final "result" or "error" object. In every command's JSON, times are
RFC 3339 strings and durations numbers of seconds in fields named so
("waited_seconds", "held_seconds").

NAME is a snap ("k8s": all its services) or a service ("k8s.kube-apiserver").
Without --budget-key each service is its own budget key, a snap name
standing for every one of its services; --budget-key gives the whole
restart one key. Every machine must use the same --budget-key and --max or
--max-unavailable.

During an upgrade from v0.1.1, whose machines restarted a whole snap under
the snap's name and several names under the names joined with '+' (or
their --key): this release also counts, and is counted by, holders of the
snap's name (--legacy-snap-keys, on by default) and of each --legacy-key
KEY, given exactly as the v0.1.1 machines were (not sorted). Set
--legacy-snap-keys=false once no machine runs v0.1.1.

The etcd flags are etcdctl's, with its defaults (--endpoints 127.0.0.1:2379,
--dial-timeout 2s, --command-timeout 5s), and read its environment
variables as it does: ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_CERT,
ETCDCTL_KEY, ETCDCTL_USER (USER or USER:PASSWORD), ETCDCTL_PASSWORD,
ETCDCTL_DIAL_TIMEOUT, ETCDCTL_COMMAND_TIMEOUT and ETCDCTL_WRITE_OUT; a flag
wins over its variable.`

// rolloutExits are the rollout's exit codes.
var rolloutExits = clistyle.ExitCodes{
	{Code: exitOK, Text: "done, and the services are ready again"},
	{Code: exitFailed, Text: "the restart failed, the service did not become ready in --ready-timeout, or the slot was lost mid-restart: check the service before running again; or the key is halted (nothing was restarted: see status, then resume)"},
	{Code: exitUsage, Text: "usage error (a malformed endpoint included), or etcd refused the client before anything was restarted (certificates, credentials, an endpoint's scheme that does not match the server's: http:// to a TLS etcd)"},
	{Code: exitRetryable, Text: "retryable, nothing was restarted: etcd unreachable, no slot within --max-wait, snapd unreachable or busy, the key still paused or the admission check still refusing when --timeout ended"},
	{Code: exitInterrupted, Text: "interrupted (Ctrl-C, SIGTERM)"},
}

// runner is one invocation: what its command did.
type runner struct {
	stdout, stderr io.Writer
	// ran: a command's work started (anything that fails before it is
	// the command line's fault); code is its exit code.
	ran  bool
	code int
	// act does the work of kind ("rollout", "status", "pause",
	// "resume") with o; parse replaces it to only read the command line.
	act func(ctx context.Context, kind string, o *options) int
}

// newRoot builds the command tree.
func (r *runner) newRoot() *cobra.Command {
	o := &options{}
	var maxSet bool
	root := &cobra.Command{
		Use:   "snapsvc-rollout [flags] NAME...",
		Short: "Restart snap services under a cluster-wide restart budget kept in etcd",
		Long:  rolloutExits.Help(rolloutIntro),
		Example: `  snapsvc-rollout --endpoints https://10.0.0.1:2379,https://10.0.0.2:2379 \
      --cacert ca.crt --cert client.crt --key client.key \
      --max 1 --ready-url https://127.0.0.1:6443/readyz --settle 5s k8s.kube-apiserver
  export ETCDCTL_ENDPOINTS=https://10.0.0.1:2379   # then no --endpoints, as etcdctl
  snapsvc-rollout --max-unavailable 25% --window "Mon-Fri 22:00-04:00 Europe/Berlin" k8s
  snapsvc-rollout list -w table
  snapsvc-rollout status --watch k8s.kube-apiserver`,
		Annotations: map[string]string{clistyle.ManLong: rolloutExits.Man(rolloutIntro)},
		// Arguments are service names; a subcommand's name wins.
		Args:              cobra.ArbitraryArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, names []string) error {
			maxSet = c.Flags().Changed("max")
			o.names = names
			if err := fromEnv(c.Flags(), o); err != nil {
				return &clistyle.UsageError{Msg: err.Error(), Cmd: c.CommandPath()}
			}
			if err := validateRefresh(o); err != nil {
				return &clistyle.UsageError{Msg: err.Error(), Cmd: c.CommandPath()}
			}
			if err := validateRollout(o, maxSet); err != nil {
				return &clistyle.UsageError{Msg: err.Error(), Cmd: c.CommandPath()}
			}
			return r.do(c, "rollout", o)
		},
	}
	clistyle.Apply(root)
	fs := root.Flags()
	fs.SortFlags = false
	etcdFlags(fs, o)
	fs.StringVar(&o.key, "budget-key", "", "one budget `KEY` for the whole restart (default: each service's own key; a snap name stands for all its services)")
	fs.StringArrayVar(&o.legacyKeys, "legacy-key", nil, "during an upgrade from v0.1.1: the budget `KEY` machines still on v0.1.1 restart these services under, exactly as they were given it (their --key, else their names joined with '+' in the order given); this restart counts their holders and they count it (repeatable)")
	fs.BoolVar(&o.legacySnapKeys, "legacy-snap-keys", true, "count the holders of v0.1.1's whole-snap keys (a snap's name: its budget key for a restart of the whole snap) and be counted by them; set false once no machine runs v0.1.1")
	fs.IntVar(&o.max, "max", 1, "machines that may restart at once (the same on every machine); see --max-unavailable")
	fs.StringVar(&o.maxUnavailable, "max-unavailable", "", "machines that may restart at once: a `COUNT`, or a percentage of the machines taking part (25%: rounded down, at least 1)")
	fs.StringVar(&o.window, "window", "", `maintenance `+"`WINDOW`"+`, e.g. "Mon-Fri 22:00-04:00 Europe/Berlin": outside it, wait`)
	fs.DurationVar(&o.joinPeriod, "join-period", etcdbudget.DefaultJoinPeriod, "with a percentage --max-unavailable: how long machines may join before it is resolved")
	fs.DurationVar(&o.ttl, "ttl", etcdbudget.DefaultTTL, "lease of the slot: a crashed machine's slot frees itself after this")
	fs.BoolVar(&o.failOpen, "fail-open", false, "restart anyway, without a slot, when etcd stays unreachable")
	fs.BoolVar(&o.bootstrap, "bootstrap", false, "no cluster exists yet: restart without a budget")
	fs.DurationVar(&o.maxWait, "max-wait", 0, "give up when no slot is free within this (0: wait)")
	fs.StringVar(&o.readyURL, "ready-url", "", "readiness `URL` that must answer 2xx before the slot is given back")
	fs.StringVar(&o.readyCA, "ready-ca", "", "CA bundle `FILE` for the readiness URL")
	fs.StringVar(&o.readyCert, "ready-cert", "", "client certificate `FILE` for the readiness URL")
	fs.StringVar(&o.readyKey, "ready-key", "", "client key `FILE` for the readiness URL")
	fs.BoolVar(&o.readyInsecure, "ready-insecure", false, "do not verify the readiness URL's certificate")
	fs.DurationVar(&o.readyInterval, "ready-interval", time.Second, "pause between readiness checks")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 5*time.Minute, "how long the service may take to become ready")
	fs.DurationVar(&o.settle, "settle", 0, "keep the slot this long after the service is ready")
	fs.BoolVar(&o.reload, "reload", false, "reload services that support it instead of restarting")
	fs.StringVar(&o.socket, "socket", "", "snapd's socket `PATH` (default /run/snapd.socket, or snapctl inside a snap)")
	fs.IntVar(&o.haltAfter, "halt-after", budget.DefaultHaltAfter, "`N` failed restarts of a key (since its last good one or resume) halt it: no machine restarts under it until resumed (negative: never)")
	fs.StringVar(&o.admitCommand, "admit-command", "", "shell `COMMAND` asked before restarting, slot held: exit 0 admits, else its first output line is why not, asked again with backoff")
	fs.StringVar(&o.admitURL, "admit-url", "", "admission `URL` asked before restarting, slot held: 2xx admits, else asked again with backoff")
	fs.StringVar(&o.admitCA, "admit-ca", "", "CA bundle `FILE` for the admission URL")
	fs.BoolVar(&o.admitInsecure, "admit-insecure", false, "do not verify the admission URL's certificate")
	fs.DurationVar(&o.timeout, "timeout", 0, "bound on the whole command (0: none)")
	refreshFlags(fs, &o.refresh)
	for _, name := range []string{"ready-ca", "ready-cert", "ready-key", "socket", "admit-ca"} {
		fs.SetAnnotation(name, cobra.BashCompFilenameExt, nil)
	}
	root.RegisterFlagCompletionFunc("budget-key", completeKeys(o, false, false))
	root.AddCommand(r.controlCmd("status"), r.controlCmd("pause"), r.controlCmd("resume"), r.controlCmd("list"), r.controlCmd("history"), versionCmd())
	for _, c := range root.Commands() {
		c.DisableFlagsInUseLine = true // their Use lists their flags
	}
	return root
}

// versionCmd is "version": --version as a command, as snapsvc has it.
func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:               "version",
		Short:             "Print this build's version (module, Go, revision)",
		Args:              cobra.NoArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		Run: func(c *cobra.Command, _ []string) {
			fmt.Fprintln(c.OutOrStdout(), clistyle.ReadBuild().Line(c.Root().Name()))
		},
	}
}

// do runs the work of kind, once the command line was read and checked.
func (r *runner) do(c *cobra.Command, kind string, o *options) error {
	r.ran = true
	r.code = r.act(c.Context(), kind, o)
	return nil
}

// run runs one command line and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	r := &runner{stdout: stdout, stderr: stderr}
	r.act = r.work
	code, err := r.execute(ctx, args)
	if err == nil {
		return code
	}
	err.Fprint(stderr)
	return exitUsage
}

// execute runs args through the command tree: the exit code of the
// command that ran, or the usage error that kept it from running.
func (r *runner) execute(ctx context.Context, args []string) (int, *clistyle.UsageError) {
	path, err := clistyle.Execute(ctx, r.newRoot(), args, r.stdout, r.stderr, func() bool { return r.ran })
	if err == nil {
		return r.code, nil
	}
	var ue *clistyle.UsageError
	if !errors.As(err, &ue) {
		// Only the style's own commands (man DIR, in a build with the
		// manpages tag) fail after they ran.
		ue = &clistyle.UsageError{Msg: err.Error(), Cmd: path}
	}
	return exitUsage, ue
}

// parse reads a rollout's command line without running it (for tests).
func parse(args []string, stdout, stderr io.Writer) (*options, error) {
	var got *options
	r := &runner{stdout: stdout, stderr: stderr}
	r.act = func(_ context.Context, kind string, o *options) int {
		if kind == "rollout" {
			got = o
		}
		return exitOK
	}
	if _, ue := r.execute(context.Background(), args); ue != nil {
		return nil, ue
	}
	if got == nil {
		return nil, errors.New("not a rollout")
	}
	return got, nil
}

// work does the work of kind.
func (r *runner) work(ctx context.Context, kind string, o *options) int {
	if kind == "rollout" {
		return rollout(ctx, o, r.stdout, r.stderr)
	}
	return control(ctx, kind, o, r.stdout, r.stderr)
}

// validateRollout checks a rollout's options, after its flags were read,
// and fills in what the environment gives.
func validateRollout(o *options, maxSet bool) error {
	switch {
	case o.writeOut == "table":
		return errors.New("--write-out table: for status and list; a rollout writes simple or json")
	case o.maxUnavailable != "" && maxSet:
		return errors.New("give --max or --max-unavailable, not both")
	case len(o.names) == 0:
		return errors.New("name at least one service, e.g. k8s.kube-apiserver")
	case o.max < 1:
		return fmt.Errorf("--max %d: must be at least 1", o.max)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ttl", o.ttl}, {"unreachable", o.unreachable}, {"max-wait", o.maxWait}, {"settle", o.settle},
		{"timeout", o.timeout}, {"ready-interval", o.readyInterval}, {"ready-timeout", o.readyTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("--%s %s: must not be negative", d.name, d.v)
		}
	}
	for _, n := range o.names {
		if _, _, err := snapsvc.ValidateName(n); err != nil {
			return err
		}
	}
	if o.maxUnavailable == "" {
		o.maxUnavailable = strconv.Itoa(o.max)
	}
	if _, err := etcdbudget.ParseMaxUnavailable(o.maxUnavailable); err != nil {
		return fmt.Errorf("--max-unavailable: %w", err)
	}
	if o.window != "" {
		if _, err := etcdbudget.ParseWindow(o.window); err != nil {
			return fmt.Errorf("--window: %w", err)
		}
	}
	if o.key != "" {
		// One form on every machine: "a+b" and "b+a" are one key.
		o.key = etcdbudget.Key(o.key)
	}
	for _, k := range o.legacyKeys {
		// As v0.1.1 took it: verbatim, never sorted.
		if k == "" || strings.Contains(k, "/") {
			return fmt.Errorf("--legacy-key %q: empty or containing '/' (v0.1.1 refused such keys)", k)
		}
	}
	return nil
}

// legacyKeysOf is the budget's Config.LegacyKeys for o: v0.1.1's
// whole-snap keys (unless --legacy-snap-keys=false) and every --legacy-key.
func legacyKeysOf(o *options) func(string) []string {
	return func(key string) []string {
		var out []string
		if o.legacySnapKeys {
			out = etcdbudget.LegacySnapKeys(key)
		}
		return append(out, o.legacyKeys...)
	}
}

// printer writes progress lines to stderr, or JSON events to stdout.
type printer struct {
	mu     sync.Mutex
	json   bool
	stdout io.Writer
	stderr io.Writer
	acting string // what a slot is acquired for: "restarting" (default) or "refreshing"
}

func (p *printer) event(ev snapsvc.BudgetEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		m := map[string]any{"time": ev.Time.UTC().Format(time.RFC3339Nano), "event": ev.Kind, "key": ev.Key}
		if ev.Holder != "" {
			m["holder"] = ev.Holder
		}
		if ev.Kind == "waiting" {
			m["holders"], m["ahead"], m["max"] = ev.Wait.Holders, ev.Wait.Ahead, ev.Wait.Max
		}
		if ev.Waited > 0 {
			m["waited_seconds"] = seconds(ev.Waited)
		}
		if ev.Held > 0 {
			m["held_seconds"] = seconds(ev.Held)
		}
		if ev.Attempt > 0 {
			m["attempt"] = ev.Attempt
		}
		if ev.Err != nil {
			m["error"] = ev.Err.Error()
		}
		if ev.Act != nil {
			m["act"] = newActDoc(ev.Act)
		}
		if ev.Halt != nil {
			m["halt"] = ev.Halt
		}
		json.NewEncoder(p.stdout).Encode(m)
		return
	}
	ts := ev.Time.Format("15:04:05.000")
	switch ev.Kind {
	case "waiting":
		fmt.Fprintf(p.stderr, "%s waiting for %s: %s\n", ts, ev.Key, etcdbudget.DescribeWait(ev.Wait))
	case "acquired":
		acting := p.acting
		if acting == "" {
			acting = "restarting"
		}
		fmt.Fprintf(p.stderr, "%s acquired %s as %s after %s; %s\n", ts, ev.Key, ev.Holder, ev.Waited.Round(time.Millisecond), acting)
	case "ready":
		fmt.Fprintf(p.stderr, "%s %s ready\n", ts, ev.Key)
	case "released":
		fmt.Fprintf(p.stderr, "%s released %s after holding it %s\n", ts, ev.Key, ev.Held.Round(time.Millisecond))
	case "release-failed":
		fmt.Fprintf(p.stderr, "%s could not release %s (attempt %d; retrying, else its lease expires): %v\n", ts, ev.Key, ev.Attempt, ev.Err)
	case "fence-failed":
		fmt.Fprintf(p.stderr, "%s cannot confirm %s is still ours; not restarting: %v\n", ts, ev.Key, ev.Err)
	case "lost":
		fmt.Fprintf(p.stderr, "%s LOST %s: %v\n", ts, ev.Key, ev.Err)
	case "admission-refused":
		fmt.Fprintf(p.stderr, "%s admission check refused %s, keeping the slot and asking again: %v\n", ts, ev.Key, ev.Err)
	case "record-failed":
		fmt.Fprintf(p.stderr, "%s could not record the restart in %s's history: %v\n", ts, ev.Key, ev.Err)
	case "halted":
		if ev.Halt != nil {
			fmt.Fprintf(p.stderr, "%s HALTED %s after %d failed restart(s): %s; no machine restarts under it until: %s\n",
				ts, ev.Key, ev.Halt.Failures, etcdbudget.HaltSummary(*ev.Halt), etcdbudget.ResumeCommand(ev.Key))
		}
	}
}

// fail reports a failure before the restart: one "error: " line on
// stderr, and under --json the error document on stdout (retryable when
// etcd could not be reached, as the exit code says).
func (p *printer) fail(err error, code int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		json.NewEncoder(p.stdout).Encode(map[string]any{"error": map[string]any{"message": err.Error(), "retryable": errors.Is(err, snapsvc.ErrBudgetUnavailable)}})
	}
	fmt.Fprintf(p.stderr, "error: %v\n", err)
	return code
}

func (p *printer) done(res *snapsvc.Result, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		if err != nil {
			var opErr *snapsvc.OpError
			retryable := errors.As(err, &opErr) && opErr.Retryable()
			json.NewEncoder(p.stdout).Encode(map[string]any{"error": map[string]any{"message": err.Error(), "retryable": retryable}})
			return
		}
		json.NewEncoder(p.stdout).Encode(map[string]any{"result": map[string]any{"change": res.ChangeID, "status": res.Status, "attempts": res.Attempts, "no-update": res.NoUpdate}})
		return
	}
	if err != nil {
		fmt.Fprintln(p.stderr, "error:", err)
		return
	}
	if res.NoUpdate {
		fmt.Fprintln(p.stderr, "done: no updates available; nothing was refreshed")
		return
	}
	fmt.Fprintf(p.stderr, "done: change %s %s\n", res.ChangeID, res.Status)
}

// rollout restarts o.names under the budget and returns the exit code.
func rollout(ctx context.Context, o *options, stdout, stderr io.Writer) int {
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	p := &printer{json: o.jsonOut, stdout: stdout, stderr: stderr}
	if o.refresh.on {
		p.acting = "refreshing"
	}
	var copts []snapsvc.Option
	if o.socket != "" {
		copts = append(copts, snapsvc.WithSocket(o.socket))
	}
	if !o.bootstrap {
		cli, err := etcdClient(o)
		if err != nil {
			return p.fail(endpointHint(o, err), clientExit(err))
		}
		defer cli.Close()
		mu, _ := etcdbudget.ParseMaxUnavailable(o.maxUnavailable) // checked by validateRollout
		ctl := etcdbudget.Controls{MaxUnavailable: mu, JoinPeriod: o.joinPeriod}
		if o.window != "" {
			ctl.Window, _ = etcdbudget.ParseWindow(o.window)
		}
		haltAfter := o.haltAfter
		if haltAfter == 0 {
			haltAfter = budget.DefaultHaltAfter
		}
		b, err := etcdbudget.NewControlled(etcdbudget.Config{Client: cli, Prefix: o.prefix, TTL: o.ttl,
			Holder: o.holder, Unreachable: o.unreachable, FailOpen: o.failOpen, LegacyKeys: legacyKeysOf(o), HaltAfter: haltAfter}, ctl)
		if err != nil {
			return p.fail(err, exitUsage)
		}
		defer b.Close()
		bopts := snapsvc.BudgetOptions{
			Settle:   o.settle,
			MaxWait:  o.maxWait,
			Progress: p.event,
			Probe:    probe.Options{Interval: o.readyInterval, MaxWait: o.readyTimeout},
		}
		if o.key != "" {
			bopts.Key = func(string) string { return o.key }
		}
		if o.readyURL != "" {
			ready := &probe.HTTP{URL: o.readyURL, CAFile: o.readyCA, CertFile: o.readyCert, KeyFile: o.readyKey, InsecureSkipVerify: o.readyInsecure}
			bopts.Ready = func(string) probe.Probe { return ready }
		}
		admit, err := admission(o)
		if err != nil {
			return p.fail(err, exitUsage)
		}
		bopts.Admit = admit
		copts = append(copts, snapsvc.WithRestartBudget(b, bopts))
	}
	c, err := snapsvc.New(copts...)
	if err != nil {
		return p.fail(err, exitUsage)
	}
	defer c.Close()
	res, err := o.refresh.act(ctx, c, o)
	p.done(res, endpointHint(o, err))
	return exitCode(ctx, err)
}

// clientExit is the exit code of a failure to build the etcd client:
// retryable when etcd could not be reached, usage otherwise (a refusal:
// certificates, credentials).
func clientExit(err error) int {
	if errors.Is(err, snapsvc.ErrBudgetUnavailable) {
		return exitRetryable
	}
	return exitUsage
}

// exitCode is the rollout's exit code for err: etcd's refusal before
// any request to act was sent (TLS, credentials, an endpoint's scheme) is
// the command line's (exitUsage), as it is for the operator commands.
func exitCode(ctx context.Context, err error) int {
	var opErr *snapsvc.OpError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return exitInterrupted
	case errors.As(err, &opErr) && opErr.Attempts == 0 && opErr.ChangeID == "" &&
		errors.Is(err, snapsvc.ErrBudgetRefused) && !errors.Is(err, snapsvc.ErrBudgetHalted):
		return exitUsage
	case errors.As(err, &opErr) && opErr.Retryable():
		return exitRetryable
	}
	return exitFailed
}

// etcdClient builds the etcd client from the etcd flags (and
// environment). A client certificate outside its validity is refused
// here, naming the file; a client that cannot be built names each
// endpoint and why it failed (etcdbudget.NewClient).
func etcdClient(o *options) (*clientv3.Client, error) {
	// gRPC keep-alive drops a connection to a member that hangs.
	cfg := etcdbudget.ClientConfig(strings.Split(o.endpoints, ","))
	cfg.Username, cfg.Password = o.etcdUser, o.etcdPassword
	cfg.DialTimeout = o.dialTimeout
	if o.etcdCA != "" || o.etcdCert != "" {
		if o.etcdCA != "" {
			// etcd's transport reads a CA file without a certificate as
			// an empty pool: every server would then be "signed by
			// unknown authority".
			if err := pemHasCert(o.etcdCA, "CA file"); err != nil {
				return nil, err
			}
		}
		if o.etcdCert != "" {
			if err := certValid(o.etcdCert, time.Now()); err != nil {
				return nil, err
			}
		}
		tlsCfg, err := transport.TLSInfo{TrustedCAFile: o.etcdCA, CertFile: o.etcdCert, KeyFile: o.etcdKey}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tlsCfg
	}
	return etcdbudget.NewClient(cfg)
}

// certValid checks that the first certificate in file is valid at now
// (and that there is one).
func certValid(file string, now time.Time) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("etcd TLS: %w", err)
	}
	var block *pem.Block
	for rest := raw; ; {
		if block, rest = pem.Decode(rest); block == nil || block.Type == "CERTIFICATE" {
			break
		}
	}
	if block == nil {
		return pemHasCert(file, "certificate file")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("etcd TLS: %s: %w", file, err)
	}
	switch {
	case now.After(cert.NotAfter):
		return fmt.Errorf("%w: etcd TLS: client certificate %s (%s) expired at %s", snapsvc.ErrBudgetRefused, file, cert.Subject.CommonName, cert.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(cert.NotBefore):
		return fmt.Errorf("%w: etcd TLS: client certificate %s (%s) is not valid before %s", snapsvc.ErrBudgetRefused, file, cert.Subject.CommonName, cert.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// endpointHint adds to err, when etcd was unreachable and no endpoint was
// given, that etcdctl's default endpoint was tried.
func endpointHint(o *options, err error) error {
	if err == nil || o.endpointsFrom != defaultEndpointsFrom || !errors.Is(err, snapsvc.ErrBudgetUnavailable) {
		return err
	}
	return fmt.Errorf("%w (no --endpoints or $ETCDCTL_ENDPOINTS given: tried etcdctl's default, %s)", err, defaultEndpoint)
}

// pemHasCert checks that file (a what: "CA file") holds at least one PEM
// certificate, and says what it holds otherwise.
func pemHasCert(file, what string) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("etcd TLS: %w", err)
	}
	var others []string
	for rest := raw; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			return nil
		}
		others = append(others, block.Type)
	}
	why := "no PEM block: want -----BEGIN CERTIFICATE-----"
	switch {
	case len(raw) == 0:
		why = "the file is empty"
	case len(others) > 0:
		why = "it holds " + strings.Join(others, ", ") + ", no CERTIFICATE"
	}
	return fmt.Errorf("etcd TLS: no certificate found in %s %s (%s)", what, file, why)
}
