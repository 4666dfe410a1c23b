package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// env is what the command line sees of its process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// terminal: stderr is a terminal, so progress may be drawn there;
	// width is its width in columns (0: unknown).
	terminal bool
	width    func() int
	// watchPolled, when set (by tests), is called after each poll of
	// follow with its error.
	watchPolled func(error)
	// quietEvery is how often, without a terminal, a wait says it is
	// still waiting (0: progressQuietEvery).
	quietEvery time.Duration
	// snapdRoot, when set (by tests), is where the library looks for an
	// installed snapd when the socket is missing (snapsvc.WithSnapdRoot).
	snapdRoot string
	// geteuid, when set (by tests), is os.Geteuid: errors suggest sudo to
	// a user who is not root.
	geteuid func() int
}

// app is one invocation: the environment and the global flags.
type app struct {
	env
	socket    string
	json      bool
	timeout   time.Duration
	waitSnapd time.Duration
	verbose   bool
	logFormat string
	// noWait: the service command does not wait for its change (--no-wait):
	// it prints the id and nothing on stderr, as snap does.
	noWait bool

	// cmd is the path of the command that runs ("snapsvc restart"), name
	// its name as typed; ran says its RunE started (so an error before is
	// the command line's).
	cmd, name string
	ran       bool
	// followMode: watch runs with its old meaning (follow), printing
	// JSON Lines.
	followMode bool

	prog *progress
	// signal is the signal that ended the command, if one did.
	signal os.Signal
}

// Command groups in the help.
const (
	groupSnap   = "snap"
	groupExtras = "extras"
)

const rootIntro = `snapsvc starts, stops and restarts snap services through snapd, waiting out
other changes that hold the snap (conflicts) and then for its own change.

Its commands follow the snap command's where they overlap (services, logs,
start, stop, restart, refresh, changes, tasks, watch, abort, version); status,
wait-idle, follow and demo are its own.

NAME is a snap ("k8s": all its services) or a service ("k8s.kubelet").`

// exitCodes is the one list of exit codes, for the help (rootLong) and
// the man page (rootManLong).
var exitCodes = clistyle.ExitCodes{
	{Code: exitOK, Text: "success"},
	{Code: exitFailed, Text: "the operation failed (a change ended in error, snapd refused, snapd is not installed)"},
	{Code: exitUsage, Text: "usage error (unknown command or flag, missing or malformed name)"},
	{Code: exitTimeout, Text: "nothing was done and retrying later may help: timed out (--timeout), gave up waiting for another change or for an unreachable snapd (--wait-snapd)"},
	{Code: exitNotFound, Text: "not found (unknown snap, service or change)"},
	{Code: exitUnknown, Text: "the request was, or may have been, carried out but its outcome is not known (timed out or snapd vanished while waiting for its change, or snapd's answer was lost): check before running it again"},
	{Code: exitInterrupted, Text: "interrupted (Ctrl-C, SIGINT): the change, if one was made, goes on in snapd; the message says which and how to wait for it again; logs -f ends so, silently"},
	{Code: exitTerminated, Text: "terminated (SIGTERM): as 130"},
}

// rootLong is the root's help: the exit codes as an aligned list;
// rootManLong, the man page's: a definition list.
var (
	rootLong    = exitCodes.Help(rootIntro)
	rootManLong = exitCodes.Man(rootIntro)
)

// newRoot builds the command tree for one invocation.
func (a *app) newRoot() *cobra.Command {
	root := &cobra.Command{
		Use: "snapsvc",
		Example: `  snapsvc services k8s                         # as snap services
  snapsvc restart k8s.kubelet                  # waits out changes that hold k8s
  snapsvc --json --timeout 2m restart k8s      # one JSON document; exit 3: try later
  snapsvc logs -f k8s.kubelet                  # as snap logs -f`,
		Short:       "Start, stop and restart snap services, waiting out snapd's change conflicts",
		Long:        rootLong,
		Annotations: map[string]string{clistyle.ManLong: rootManLong},
		// "snapsvc" alone (or with flags only) prints the help on
		// stdout and exits 0, as snap does.
		RunE: func(c *cobra.Command, _ []string) error {
			return c.Help()
		},
	}
	clistyle.Apply(root)
	root.AddGroup(&cobra.Group{ID: groupSnap, Title: "Commands shared with snap:"},
		&cobra.Group{ID: groupExtras, Title: "snapsvc's own commands:"})
	root.SetHelpCommandGroupID(groupExtras)
	root.SetCompletionCommandGroupID(groupExtras)
	pf := root.PersistentFlags()
	pf.StringVar(&a.socket, "socket", "", "snapd's socket `PATH` (default $SNAPSVC_SOCKET, else /run/snapd.socket)")
	pf.BoolVar(&a.json, "json", false, "print the result, or the error, as one JSON document on stdout (follow: one object per line)")
	pf.Var(&durationFlag{&a.timeout}, "timeout", "give up after `D`, e.g. 30s (0: no limit)")
	pf.Var(&durationFlag{&a.waitSnapd}, "wait-snapd", "every command keeps trying for `D` while snapd is unreachable (0: give up at the first failed connection)")
	pf.BoolVarP(&a.verbose, "verbose", "v", false, "log what the library does on stderr (slog, in --log-format), and every error's detail")
	a.logFormat = "text"
	pf.Var(&choiceFlag{v: &a.logFormat, choices: []string{"text", "json"}}, "log-format", "the `FORMAT` of -v's log: text (slog's key=value lines) or json (one JSON object per line)")
	root.Flags().SortFlags = false

	snapCmds := []*cobra.Command{a.servicesCmd(), a.logsCmd(), a.startCmd(), a.stopCmd(), a.restartCmd(), a.refreshCmd(),
		a.changesCmd(), a.tasksCmd(), a.watchCmd(), a.abortCmd(), a.versionCmd()}
	for _, c := range snapCmds {
		c.GroupID = groupSnap
	}
	extras := []*cobra.Command{a.statusCmd(), a.waitIdleCmd(), a.followCmd(), a.demoCmd()}
	for _, c := range extras {
		c.GroupID = groupExtras
	}
	root.AddCommand(snapCmds...)
	root.AddCommand(extras...)
	root.AddCommand(a.waitCmd()) // deprecated, hidden
	for _, c := range root.Commands() {
		c.DisableFlagsInUseLine = true // their Use lists their flags
		if c.Name() == "man" {
			c.GroupID = groupExtras
		}
	}
	return root
}

// run runs one command line and returns the exit code.
func run(ctx context.Context, args []string, e env) int {
	a := &app{env: e, waitSnapd: retry.DefaultPolicy().MaxUnreachable}
	path, err := clistyle.Execute(ctx, a.newRoot(), args, e.stdout, e.stderr, func() bool { return a.ran })
	a.signal = terminatedBy(ctx)
	if a.cmd == "" {
		a.cmd = path
	}
	var ue *clistyle.UsageError
	if errors.As(err, &ue) {
		a.json = a.json || jsonRequested(args)
	}
	return a.report(err)
}

// do runs a command's work under the global flags: --timeout, progress
// on stderr. Every RunE ends in do.
// withClient runs f through do with a Client of the command's settings,
// closed when f returns.
func (a *app) withClient(c *cobra.Command, f func(ctx context.Context, cl *snapsvc.Client) error) error {
	return a.do(c, func(ctx context.Context) error {
		cl, err := a.client()
		if err != nil {
			return err
		}
		defer cl.Close()
		return f(ctx, cl)
	})
}

// serviceState is how snap's services table words a service's startup and
// current state.
func serviceState(s snapsvc.Service) (startup, current string) {
	startup, current = "disabled", "inactive"
	if s.Enabled {
		startup = "enabled"
	}
	if s.Active {
		current = "active"
	}
	return startup, current
}

func (a *app) do(c *cobra.Command, f func(ctx context.Context) error) error {
	a.ran = true
	a.cmd = c.CommandPath()
	if a.socket == "" {
		a.socket = a.getenv("SNAPSVC_SOCKET")
	}
	a.name = c.CalledAs()
	// Progress: on a terminal a self-erasing line, unless -v (the log
	// says it all); off one, lines with -v's text log, none in its JSON
	// log (one JSON object per line) or without -v.
	quiet := !a.chatty() || (a.verbose && (a.terminal || a.logFormat == "json"))
	a.prog = newProgress(a.stderr, a.terminal, a.width, a.quietEvery, quiet)
	defer a.prog.close()
	ctx := c.Context()
	if a.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, a.timeout, timeoutError{a.timeout})
		defer cancel()
	}
	return f(ctx)
}

// chatty reports whether the command tells on stderr what it waits for
// and what it waited out: on a terminal or with -v, never under --no-wait
// (snap prints nothing there). Off a terminal without -v it prints only
// its result and, when it fails, the error.
func (a *app) chatty() bool { return (a.terminal || a.verbose) && !a.noWait }

// deprecated prints the one-line notice of an old name on stderr.
func (a *app) deprecated(old, instead string) {
	fmt.Fprintf(a.stderr, "snapsvc: %q is deprecated and goes away in v0.3.0: use %s\n", old, instead)
}

// durationFlag is a flag that takes a duration that is not negative, and
// says what is wrong with a value it refuses.
type durationFlag struct{ d *time.Duration }

// maxDuration is the longest time.Duration, about 292 years.
const maxDuration = time.Duration(1<<63 - 1)

// reDuration matches what time.ParseDuration reads: numbers with units.
var reDuration = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)

func (f *durationFlag) String() string {
	if f.d == nil || *f.d == 0 {
		return "0" // pflag shows no default for "0"
	}
	return f.d.String()
}

func (f *durationFlag) Type() string { return "duration" }

func (f *durationFlag) Set(s string) error {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil && reDuration.MatchString(s):
		return fmt.Errorf("too long: at most %v (about 292 years)", maxDuration.Truncate(time.Second))
	case err != nil:
		return fmt.Errorf("not a duration: want a number with a unit, e.g. 30s, 5m or 1h30m")
	case d < 0:
		return fmt.Errorf("must not be negative")
	}
	*f.d = d
	return nil
}

// usagef is a bad command line (exit 2).
func usagef(format string, args ...any) error { return clistyle.Usagef(format, args...) }

// client builds the library client the command line uses.
func (a *app) client(opts ...snapsvc.Option) (*snapsvc.Client, error) {
	if a.socket != "" {
		opts = append(opts, snapsvc.WithSocket(a.socket))
	}
	if a.snapdRoot != "" {
		opts = append(opts, snapsvc.WithSnapdRoot(a.snapdRoot))
	}
	opts = append(opts, snapsvc.WithLogger(a.logger()), snapsvc.WithPolicy(a.policy()), snapsvc.WithObserver(a.observe))
	return snapsvc.New(opts...)
}

// policy is the library's retry policy with --wait-snapd applied.
func (a *app) policy() retry.Policy {
	p := retry.DefaultPolicy()
	p.MaxUnreachable = a.waitSnapd
	if p.MaxUnreachable == 0 {
		// Give up at the first failed connection (0 would mean the
		// default to the library).
		p.MaxUnreachable = time.Nanosecond
	}
	return p
}

// logger is the library's logger: slog on stderr with -v, text or JSON
// (--log-format), nothing otherwise (progress and notes come from the
// observer).
func (a *app) logger() *slog.Logger {
	if !a.verbose {
		return slog.New(slog.DiscardHandler)
	}
	opts := &slog.HandlerOptions{Level: slog.LevelDebug}
	if a.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(a.stderr, opts))
	}
	return slog.New(slog.NewTextHandler(a.stderr, opts))
}

// choiceFlag is a flag that takes one of a few words and names them when
// given another.
type choiceFlag struct {
	v       *string
	choices []string
}

func (f *choiceFlag) String() string {
	if f.v == nil {
		return ""
	}
	return *f.v
}

func (f *choiceFlag) Type() string { return "string" }

func (f *choiceFlag) Set(s string) error {
	for _, c := range f.choices {
		if s == c {
			*f.v = s
			return nil
		}
	}
	return fmt.Errorf("want %s", strings.Join(f.choices, " or "))
}

// names checks service names before any request.
func checkNames(names []string) error {
	for _, n := range names {
		if _, _, err := snapsvc.ValidateName(n); err != nil {
			return err
		}
	}
	return nil
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// socketOpt is WithSocket for --socket or $SNAPSVC_SOCKET, if given.
func (a *app) socketOpt() []snapsvc.Option {
	s := a.socket
	if s == "" && a.getenv != nil {
		s = a.getenv("SNAPSVC_SOCKET")
	}
	if s != "" {
		return []snapsvc.Option{snapsvc.WithSocket(s)}
	}
	return nil
}

// needNames is the Args of the service commands: at least one name.
func needNames(action string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) == 0 {
			return usagef("%s needs at least one snap or service name", action)
		}
		return nil
	}
}

// timeoutError is --timeout running out: it matches
// context.DeadlineExceeded without saying it again.
type timeoutError struct{ d time.Duration }

func (e timeoutError) Error() string        { return fmt.Sprintf("timed out after %v (--timeout)", e.d) }
func (e timeoutError) Is(target error) bool { return target == context.DeadlineExceeded }
