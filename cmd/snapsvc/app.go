package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// env is what the command line sees of its process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// terminal: stderr is a terminal, so progress may be drawn there.
	terminal bool
	// watchPolled, when set (by tests), is called after each poll of
	// watch with its error.
	watchPolled func(error)
}

// app is one invocation: the environment and the global flags.
type app struct {
	env
	socket    string
	json      bool
	timeout   time.Duration
	waitSnapd time.Duration
	verbose   bool

	// helpOut, when set, is where -h prints the usage ("help COMMAND"
	// prints it on stdout); otherwise it goes to stderr.
	helpOut io.Writer

	prog *progress
}

// command is one subcommand. parse reads its flags and arguments (global
// flags included, wherever they are) and checks them without any request;
// it returns the action to run.
type command struct {
	name    string
	args    string
	summary string
	parse   func(a *app, args []string) (action, error)
}

// action is a parsed command, ready to run under the global flags.
type action func(ctx context.Context) error

var commands []command

func init() {
	commands = []command{
		{"status", "[NAME...]", "show services and the changes that hold their snaps", cmdStatus},
		{"start", "[--enable] [--no-wait] NAME...", "start services and wait for snapd's change", cmdStart},
		{"stop", "[--disable] [--no-wait] NAME...", "stop services and wait for snapd's change", cmdStop},
		{"restart", "[--reload] [--no-wait] NAME...", "restart services and wait for snapd's change", cmdRestart},
		{"changes", "[--all] [SNAP]", "list changes in progress (--all: every change)", cmdChanges},
		{"change", "ID", "show a change: its tasks, status and log", cmdChange},
		{"wait", "ID", "wait until a change is ready", cmdWait},
		{"wait-idle", "SNAP", "wait until no change holds SNAP", cmdWaitIdle},
		{"watch", "[--interval D] [--until-idle] [SNAP]", "follow changes as they happen", cmdWatch},
		{"demo", "[--scale F]", "demonstrate the library against an in-process fake snapd", cmdDemo},
		{"version", "", "print snapsvc's version, and snapd's when it answers", cmdVersion},
		{"help", "[COMMAND]", "print this help, or a command's", nil},
	}
}

// globalFlags are the flags every command takes; a command's -h lists
// them once, in usageTail.
var globalFlags = map[string]bool{"socket": true, "json": true, "timeout": true, "wait-snapd": true, "v": true}

const usageTail = `
NAME is a snap ("k8s": all its services) or a service ("k8s.kubelet").

Global flags (before or after the command):
  --socket PATH     snapd's socket (default $SNAPSVC_SOCKET, else /run/snapd.socket)
  --json            print the result, or the error, as one JSON document on
                    stdout (watch: one JSON object per line)
  --timeout D       give up after D, e.g. 30s (default 0: no limit)
  --wait-snapd D    how long to keep trying while snapd is unreachable
                    (default 30s; 0: give up at the first failed connection)
  -v                log what the library does (slog text on stderr)
  --version         the same as the version command (before the command only)

Exit codes:
  0    success
  1    the operation failed (a change ended in error, snapd refused)
  2    usage error (unknown command or flag, missing or malformed name)
  3    nothing was done and retrying later may help: timed out (--timeout),
       gave up waiting for another change or for an unreachable snapd
  4    not found (unknown snap, service or change)
  5    the request was, or may have been, carried out but its outcome is not
       known (timed out or snapd vanished while waiting for its change, or
       snapd's answer was lost): check before running it again
  130  interrupted
`

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: snapsvc [global flags] COMMAND [flags] [ARGS]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %s\n  %-10s   %s\n", strings.TrimSpace(fmt.Sprintf("%-10s %s", c.name, c.args)), "", c.summary)
	}
	fmt.Fprint(w, usageTail)
}

// findCommand returns the named command, or nil.
func findCommand(name string) *command {
	for i := range commands {
		if commands[i].name == name && commands[i].parse != nil {
			return &commands[i]
		}
	}
	return nil
}

// usageError is a bad command line (exit code 2). printed: the problem is
// already on stderr (the flag package prints it).
type usageError struct {
	msg     string
	printed bool
}

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelp reports that help was printed (exit code 0).
var errHelp = errors.New("help requested")

// run runs one command line and returns the exit code.
func run(ctx context.Context, args []string, e env) int {
	a := &app{env: e, waitSnapd: retry.DefaultPolicy().MaxUnreachable}
	a.socket = e.getenv("SNAPSVC_SOCKET")
	fs := a.flagSet("snapsvc")
	showVersion := fs.Bool("version", false, "")
	fs.Usage = func() {} // -h prints it below; a bad flag only says what is wrong
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(a.stderr)
			return exitOK
		}
		fmt.Fprintln(a.stderr, "Run 'snapsvc -h' for usage.")
		return a.reportUsage("", args, &usageError{msg: err.Error(), printed: true})
	}
	rest := fs.Args()
	if *showVersion {
		if len(rest) > 0 {
			return a.reportUsage("", args, usagef("--version takes no command (got %q)", rest[0]))
		}
		rest = []string{"version"}
	}
	if len(rest) == 0 {
		fmt.Fprintln(a.stderr, "error: no command given")
		usage(a.stderr)
		return a.reportUsage("", args, &usageError{msg: "no command given", printed: true})
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		return a.help(args, rest)
	}
	cmd := findCommand(name)
	if cmd == nil {
		msg := fmt.Sprintf("unknown command %q", name)
		fmt.Fprintf(a.stderr, "error: %s\n", msg)
		usage(a.stderr)
		return a.reportUsage("", args, &usageError{msg: msg, printed: true})
	}
	// Parse everything first: global flags after the command (--timeout,
	// -v, --json) only take effect once the command's flags are read.
	act, err := cmd.parse(a, rest)
	if err != nil {
		return a.reportUsage(cmd.name, args, err)
	}
	a.prog = newProgress(a.stderr, a.terminal && !a.verbose)
	err = a.withTimeout(ctx, act)
	a.prog.close()
	return a.report(cmd.name, err)
}

// help prints the usage, or with one argument that command's usage, on
// stdout.
func (a *app) help(args, rest []string) int {
	switch len(rest) {
	case 0:
		usage(a.stdout)
		return exitOK
	case 1:
	default:
		return a.reportUsage("", args, usagef("help takes at most one command, got %d", len(rest)))
	}
	if rest[0] == "help" {
		usage(a.stdout)
		return exitOK
	}
	cmd := findCommand(rest[0])
	if cmd == nil {
		msg := fmt.Sprintf("unknown command %q", rest[0])
		fmt.Fprintf(a.stderr, "error: %s\n", msg)
		usage(a.stderr)
		return a.reportUsage("", args, &usageError{msg: msg, printed: true})
	}
	a.helpOut = a.stdout
	_, err := cmd.parse(a, []string{"-h"})
	return a.report(cmd.name, err)
}

// reportUsage reports an error found while reading the command line. The
// flags may not all have been read, so --json is looked for in args too.
func (a *app) reportUsage(cmd string, args []string, err error) int {
	a.json = a.json || jsonRequested(args)
	return a.report(cmd, err)
}

// jsonRequested reports whether args ask for --json before any "--".
func jsonRequested(args []string) bool {
	want := false
	for _, arg := range args {
		if arg == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") || name != "json" {
			continue
		}
		want = true
		if hasVal {
			want, _ = strconv.ParseBool(val)
		}
	}
	return want
}

// withTimeout runs f under --timeout.
func (a *app) withTimeout(ctx context.Context, f func(context.Context) error) error {
	if a.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, a.timeout, fmt.Errorf("timed out after %v (--timeout): %w", a.timeout, context.DeadlineExceeded))
		defer cancel()
	}
	return f(ctx)
}

// flagSet makes a flag set with the global flags on it, so they may come
// before or after the command. Their usage is usageTail's.
func (a *app) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	if a.helpOut != nil {
		fs.SetOutput(a.helpOut)
	}
	fs.StringVar(&a.socket, "socket", a.socket, "")
	fs.BoolVar(&a.json, "json", a.json, "")
	fs.Var(&durationFlag{&a.timeout}, "timeout", "")
	fs.Var(&durationFlag{&a.waitSnapd}, "wait-snapd", "")
	fs.BoolVar(&a.verbose, "v", a.verbose, "")
	return fs
}

// durationFlag is a flag that takes a duration that is not negative, and
// says what is wrong with a value it refuses.
type durationFlag struct{ d *time.Duration }

// maxDuration is the longest time.Duration, about 292 years.
const maxDuration = time.Duration(1<<63 - 1)

// reDuration matches what time.ParseDuration reads: numbers with units.
var reDuration = regexp.MustCompile(`^[-+]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+$`)

func (f *durationFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

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

// commandUsage prints a command's usage: its own flags, then the global
// ones.
func commandUsage(w io.Writer, fs *flag.FlagSet, cmd command) {
	fmt.Fprintf(w, "Usage: snapsvc %s\n\n%s.\n", strings.TrimSpace(cmd.name+" "+cmd.args), capitalize(cmd.summary))
	printFlags(w, fs)
	fmt.Fprint(w, usageTail)
}

// printFlags lists the flags of fs that are not global, with their
// defaults (never the values the command line gave).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		if globalFlags[f.Name] {
			return
		}
		if n == 0 {
			fmt.Fprintln(tw, "\nFlags:")
		}
		n++
		arg, usage := flag.UnquoteUsage(f)
		if arg != "" {
			arg = " " + arg
		}
		switch f.DefValue {
		case "", "false", "0", "0s":
		default:
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(tw, "  --%s%s\t%s\n", f.Name, arg, usage)
	})
	tw.Flush()
}

// parse parses a command's flags, which may be mixed with its arguments
// ("restart k8s.kubelet --json"); "--" ends the flags.
func (a *app) parse(fs *flag.FlagSet, cmd command, args []string) ([]string, error) {
	fs.Usage = func() {} // -h prints it below; a bad flag only says what is wrong
	var tail []string
	for i, arg := range args {
		if arg == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				commandUsage(fs.Output(), fs, cmd)
				return nil, errHelp
			}
			fmt.Fprintf(a.stderr, "Run 'snapsvc %s -h' for usage.\n", cmd.name)
			return nil, &usageError{msg: err.Error(), printed: true}
		}
		args = fs.Args()
		if len(args) == 0 {
			return append(pos, tail...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// parseCommand is parse for the named command.
func (a *app) parseCommand(fs *flag.FlagSet, name string, args []string) ([]string, error) {
	if c := findCommand(name); c != nil {
		return a.parse(fs, *c, args)
	}
	panic("unknown command " + name)
}

// client builds the library client the command line uses.
func (a *app) client(opts ...snapsvc.Option) (*snapsvc.Client, error) {
	if a.socket != "" {
		opts = append(opts, snapsvc.WithSocket(a.socket))
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

// logger is the library's logger: slog text on stderr with -v, progress
// text on a terminal, nothing otherwise.
func (a *app) logger() *slog.Logger {
	if a.verbose {
		return slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if a.prog.enabled() {
		return slog.New(&readableHandler{ops: &sync.Map{}, sink: func(_, line string) { a.prog.set(line) }})
	}
	return slog.New(slog.DiscardHandler)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
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
