// Package clistyle is the one command-line style of snapsvc's binaries
// (snapsvc, fakesnapd and bench in this module; snapsvc-rollout and
// rollout-demo in github.com/snapsvc/snapsvc/etcdbudget/cmd): help on
// stdout, GNU-style flag errors that exit 2, suggestions for mistyped
// commands, shell completion, and one --version flag that prints the
// build from debug.ReadBuildInfo, or what the release tool stamped. Man
// pages come from package manpage, which no shipped binary links.
//
// It is public only so that the etcd commands, a module of their own, can
// share it: Go's internal rule would keep it from a module outside cmd/,
// and the library modules must not import it (it brings cobra). It is not
// a stable API: its names may change in any release.
//
// It is built on cobra (and its pflag), as k8sd and kubectl are, rather
// than on go-flags as snap and pebble are: cobra generates the bash, zsh
// and fish completion scripts and the man pages (cobra/doc, in package
// manpage) from the same command definitions, so help, completion and
// manual never disagree, and it is the library the Kubernetes-side users
// of snapsvc already know.
package clistyle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// Build is what a binary knows of its own build.
type Build struct {
	// Module is the main module's path, Version its version ("(devel)"
	// for a build from a checkout).
	Module   string `json:"module"`
	Version  string `json:"version"`
	Go       string `json:"go"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
}

// What a release build stamps into the binary (go build -ldflags "-X
// github.com/snapsvc/snapsvc/cmd/clistyle.stampedVersion=v0.2.0
// ..."; .ci/release does, from git): the version from git describe, the
// commit and its time. A build in the workspace (go.work) gets neither a
// module version nor VCS settings from the go command, so these are what
// --version shows of a package; empty, debug.ReadBuildInfo's are used.
var (
	stampedVersion  string
	stampedRevision string
	stampedTime     string
)

// ReadBuild reads the binary's build information.
func ReadBuild() Build {
	v := Build{Module: "github.com/snapsvc/snapsvc/cmd", Version: "(devel)", Go: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v.read(bi)
	}
	if stampedVersion != "" {
		v.Version, v.Revision, v.Time, v.Modified = stampedVersion, stampedRevision, stampedTime, strings.HasSuffix(stampedVersion, "-dirty")
	}
	return v
}

// read takes what the go command recorded of the build.
func (v *Build) read(bi *debug.BuildInfo) {
	if bi.Main.Path != "" {
		v.Module = bi.Main.Path
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
}

// Line is the build as one line: "NAME VERSION (module, go1.25.0,
// revision R, TIME, modified)".
func (b Build) Line(name string) string {
	extra := []string{b.Module, b.Go}
	if b.Revision != "" {
		extra = append(extra, "revision "+b.Revision)
	}
	if b.Time != "" {
		extra = append(extra, b.Time)
	}
	if b.Modified {
		extra = append(extra, "modified")
	}
	return fmt.Sprintf("%s %s (%s)", name, b.Version, strings.Join(extra, ", "))
}

// UsageError is a bad command line: exit code 2. Flag errors, unknown
// commands and wrong argument counts found by cobra are turned into one
// by Apply; commands return one (Usagef) for arguments they refuse.
type UsageError struct {
	Msg string
	// Cmd is the command whose usage was wrong ("snapsvc restart").
	Cmd string
}

func (e *UsageError) Error() string { return e.Msg }

// Fprint writes e as every binary reports a bad command line: "error: "
// and the message, then how to get the command's help.
func (e *UsageError) Fprint(w io.Writer) {
	fmt.Fprintf(w, "error: %s\nRun '%s --help' for usage.\n", e.Msg, e.Cmd)
}

// Usagef returns a *UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// Apply gives root the common style:
//   - help (--help, -h, "help COMMAND") and --version print on stdout;
//   - errors are left to the caller (SilenceErrors), which prints them
//     once, on stderr; usage is not dumped after an error, only a hint;
//   - flag errors (pflag's GNU-style "unknown flag: --bogus") are
//     *UsageError;
//   - unknown commands are *UsageError with cobra's suggestions;
//   - --version prints Build.Line;
//   - completion bash|zsh|fish (cobra's);
//   - whatever Extend registered: package manpage's "man DIR", in the
//     builds that import it (never the shipped binaries: see its
//     documentation).
func Apply(root *cobra.Command) {
	root.SilenceErrors = true
	root.SilenceUsage = true
	root.Version = ReadBuild().Version
	root.SetVersionTemplate(ReadBuild().Line(root.Name()) + "\n")
	root.Flags().Bool("version", false, "print this build's version (module, Go, revision) and exit")
	root.SuggestionsMinimumDistance = 2
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &UsageError{Msg: err.Error(), Cmd: c.CommandPath()}
	})
	root.CompletionOptions.HiddenDefaultCmd = false
	for _, f := range extensions {
		f(root)
	}
}

// extensions are what Extend registered.
var extensions []func(root *cobra.Command)

// Extend registers f to run on every root Apply styles, after the style's
// own settings. Call it from an init function: package manpage does, to
// add its man command to the builds that import it (the release's build
// for man pages, the tests), and only to those.
func Extend(f func(root *cobra.Command)) { extensions = append(extensions, f) }

// ManLong is the annotation key of a command's description for its man
// page, in go-md2man's markdown, when the help's plain text would not
// render there (an aligned list becomes one paragraph in roff; a
// definition list, "TERM\n: TEXT", becomes a tagged paragraph).
const ManLong = "clistyle/man-long"

// AsUsage reports whether err, returned by root.Execute, is a bad
// command line, and returns it as a *UsageError. Errors cobra makes
// itself before any command runs (unknown command, wrong number of
// arguments) carry no type: ran says whether a command's RunE started,
// so anything before it is the command line's fault.
func AsUsage(err error, ran bool, path string) (*UsageError, bool) {
	var ue *UsageError
	if errors.As(err, &ue) {
		if ue.Cmd == "" {
			ue.Cmd = path
		}
		return ue, true
	}
	if err != nil && !ran {
		return &UsageError{Msg: err.Error(), Cmd: path}, true
	}
	return nil, false
}

// Execute runs one command line through root, every binary's way: args
// (a command's own flags may come before its name, as the global ones
// may: commandFirst), output on stdout and stderr, an empty stdin. It returns the path of the
// command that ran or was asked for ("snapsvc restart") and its error: a
// *UsageError when the command line is at fault (AsUsage; ran reports,
// once it returns, whether a command's work began), else as it is.
func Execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer, ran func() bool) (path string, err error) {
	root.SetArgs(commandFirst(root, args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetIn(strings.NewReader(""))
	c, err := root.ExecuteContextC(ctx)
	path = root.CommandPath()
	if c != nil {
		path = c.CommandPath()
	}
	if ue, ok := AsUsage(err, ran(), path); ok {
		return path, ue
	}
	return path, err
}

// ExitCode is one exit code of a command and what it means.
type ExitCode struct {
	Code int
	Text string
}

// ExitCodes is a command's list of exit codes, the one source of both its
// help (Help) and its man page (Man), so the two never disagree.
type ExitCodes []ExitCode

// Help is intro followed by the exit codes as an aligned list, wrapped at
// 80 columns, for a command's Long.
func (codes ExitCodes) Help(intro string) string {
	var b strings.Builder
	b.WriteString(intro + "\n\nExit codes:\n")
	for _, e := range codes {
		fmt.Fprintf(&b, "  %-4d %s\n", e.Code, wrap(e.Text, 72, "       "))
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// Man is intro followed by the exit codes as a definition list (a tagged
// paragraph in roff, which reflows to the reader's width where the help's
// aligned list would not), for a command's ManLong annotation.
func (codes ExitCodes) Man(intro string) string {
	var b strings.Builder
	b.WriteString(intro + "\n\nExit codes:\n\n")
	for _, e := range codes {
		fmt.Fprintf(&b, "%d\n: %s\n\n", e.Code, e.Text)
	}
	return b.String()
}

// wrap breaks s into lines of at most width columns, the lines after the
// first indented by indent.
func wrap(s string, width int, indent string) string {
	var b strings.Builder
	n := 0
	for i, w := range strings.Fields(s) {
		if i > 0 && n+1+len(w) > width {
			b.WriteString("\n" + indent)
			n = 0
		} else if i > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}
