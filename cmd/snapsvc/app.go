package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

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
	socket  string
	json    bool
	timeout time.Duration
	verbose bool

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
	}
}

const usageTail = `
NAME is a snap ("k8s": all its services) or a service ("k8s.kubelet").

Global flags (before or after the command):
  --socket PATH  snapd's socket (default $SNAPSVC_SOCKET, else /run/snapd.socket)
  --json         print results as JSON on stdout
  --timeout D    give up after D, e.g. 30s (default: no limit)
  -v             log what the library does (slog text on stderr)

Exit codes:
  0    success
  1    the operation failed (a change ended in error, snapd refused)
  2    usage error (unknown command or flag, missing or malformed name)
  3    timed out (--timeout), gave up retrying a conflict, or snapd unreachable
  4    not found (unknown snap, service or change)
  130  interrupted
`

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: snapsvc [global flags] COMMAND [flags] [ARGS]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n  %-10s   %s\n", c.name, c.args, "", c.summary)
	}
	fmt.Fprint(w, usageTail)
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
	a := &app{env: e}
	a.socket = e.getenv("SNAPSVC_SOCKET")
	fs := a.flagSet("snapsvc")
	fs.Usage = func() { usage(a.stderr) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return a.reportUsage("", args, &usageError{msg: err.Error(), printed: true})
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fmt.Fprintln(a.stderr, "error: no command given")
		usage(a.stderr)
		return a.reportUsage("", args, &usageError{msg: "no command given", printed: true})
	}
	name, rest := rest[0], rest[1:]
	if name == "help" {
		usage(a.stdout)
		return exitOK
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
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
// before or after the command.
func (a *app) flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.StringVar(&a.socket, "socket", a.socket, "snapd's `socket` (default $SNAPSVC_SOCKET, else /run/snapd.socket)")
	fs.BoolVar(&a.json, "json", a.json, "print results as JSON on stdout")
	fs.DurationVar(&a.timeout, "timeout", a.timeout, "give up after this `duration` (0: no limit)")
	fs.BoolVar(&a.verbose, "v", a.verbose, "log what the library does (slog text on stderr)")
	return fs
}

// parse parses a command's flags, which may be mixed with its arguments
// ("restart k8s.kubelet --json"); "--" ends the flags.
func (a *app) parse(fs *flag.FlagSet, cmd command, args []string) ([]string, error) {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: snapsvc %s %s\n\n%s.\n\nFlags:\n", cmd.name, cmd.args, capitalize(cmd.summary))
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), usageTail)
	}
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
				return nil, errHelp
			}
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
	for _, c := range commands {
		if c.name == name {
			return a.parse(fs, c, args)
		}
	}
	panic("unknown command " + name)
}

// client builds the library client the command line uses.
func (a *app) client(opts ...snapsvc.Option) (*snapsvc.Client, error) {
	if a.socket != "" {
		opts = append(opts, snapsvc.WithSocket(a.socket))
	}
	opts = append(opts, snapsvc.WithLogger(a.logger()))
	return snapsvc.New(opts...)
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
