// Package clistyle is the one command-line style of snapsvc's binaries
// (snapsvc, fakesnapd and bench in this module; snapsvc-rollout and
// rollout-demo in github.com/snapsvc/snapsvc/etcdbudget/cmd): help on
// stdout, GNU-style flag errors that exit 2, suggestions for mistyped
// commands, shell completion, man pages, and one --version flag that
// prints the build from debug.ReadBuildInfo, or what the release tool
// stamped.
//
// It is public only so that the etcd commands, a module of their own, can
// share it: Go's internal rule would keep it from a module outside cmd/,
// and the library modules must not import it (it brings cobra). It is not
// a stable API: its names may change in any release.
//
// It is built on cobra (and its pflag), as k8sd and kubectl are, rather
// than on go-flags as snap and pebble are: cobra generates the bash, zsh
// and fish completion scripts and the man pages (cobra/doc) from the same
// command definitions, so help, completion and manual never disagree, and
// it is the library the Kubernetes-side users of snapsvc already know.
package clistyle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
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
//   - completion bash|zsh|fish (cobra's), and a "man DIR" command writing
//     man pages for every command (a command's ManLong annotation, when
//     set, is its description there).
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
	root.AddCommand(manCommand(root))
}

// ManLong is the annotation key of a command's description for its man
// page, in go-md2man's markdown, when the help's plain text would not
// render there (an aligned list becomes one paragraph in roff; a
// definition list, "TERM\n: TEXT", becomes a tagged paragraph).
const ManLong = "clistyle/man-long"

// manCommand writes the man pages of every command of root into a
// directory; packaging runs it.
func manCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "man DIR",
		Short: "Write a man page for every command into DIR",
		Long: `The man command writes a man page (section 1) for every command into DIR,
from the same definitions as the help; the packages install them.`,
		Example: "  " + root.Name() + " man ./man && man -l ./man/" + root.Name() + ".1",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return WriteMan(root, args[0])
		},
	}
}

// WriteMan writes a man page (section 1) for every available command of
// root into dir, named as cobra names them (NAME-SUB.1): each titled by its
// own name (SNAPSVC-RESTART(1)), with a short footer (the binary and its
// version, the build's date; a long version string overprinted the date
// and title), the synopsis as the help writes it (markdown ate its
// brackets), and each command's Example under EXAMPLES.
func WriteMan(root *cobra.Command, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	manLong(root)
	completionExamples(root)
	root.DisableAutoGenTag = true
	b := ReadBuild()
	hdr := doc.GenManHeader{Section: "1", Source: root.Name() + " " + strings.TrimPrefix(b.Version, "v"), Manual: "User Commands"}
	if t, err := time.Parse(time.RFC3339, b.Time); err == nil {
		hdr.Date = &t
	}
	return writeManTree(root, hdr, dir)
}

// writeManTree writes c's page and those of its available commands.
func writeManTree(c *cobra.Command, hdr doc.GenManHeader, dir string) error {
	for _, sub := range c.Commands() {
		if !sub.IsAvailableCommand() || sub.IsAdditionalHelpTopicCommand() {
			continue
		}
		if err := writeManTree(sub, hdr, dir); err != nil {
			return err
		}
	}
	page, err := manPage(c, hdr)
	if err != nil {
		return err
	}
	name := strings.ReplaceAll(c.CommandPath(), " ", "-") + "." + hdr.Section
	return os.WriteFile(filepath.Join(dir, name), page, 0o644)
}

// manPage is c's page. hdr is a copy: GenMan fills in the title, which is
// the command's own.
func manPage(c *cobra.Command, hdr doc.GenManHeader) ([]byte, error) {
	// The synopsis goes through markdown, where "[--flag] (A | B)" is a
	// link: escape what markdown would take, for the page only.
	use := c.Use
	defer func() { c.Use = use }()
	c.Use = markdownEscaper.Replace(use)
	var buf bytes.Buffer
	if err := doc.GenMan(c, &hdr, &buf); err != nil {
		return nil, err
	}
	// man-pages(7) calls the section EXAMPLES; cobra writes EXAMPLE.
	return bytes.ReplaceAll(buf.Bytes(), []byte("\n.SH EXAMPLE\n"), []byte("\n.SH EXAMPLES\n")), nil
}

// markdownEscaper escapes the characters markdown gives a meaning to in a
// synopsis: links ([...](...)), emphasis (*, _), code (`).
var markdownEscaper = strings.NewReplacer(`[`, `\[`, `]`, `\]`, `(`, `\(`, `)`, `\)`, `*`, `\*`, `_`, `\_`, "`", "\\`", `<`, `\<`, `>`, `\>`)

// completionExamples gives cobra's completion commands, which have none,
// an example each, for their man pages.
func completionExamples(root *cobra.Command) {
	root.InitDefaultCompletionCmd()
	name := root.Name()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		if c.Example == "" {
			c.Example = "  " + name + " completion bash > /etc/bash_completion.d/" + name + "\n  " + name + " completion zsh > \"${fpath[1]}/_" + name + "\"\n  " + name + " completion fish > ~/.config/fish/completions/" + name + ".fish"
		}
		for _, sub := range c.Commands() {
			if sub.Example != "" {
				continue
			}
			switch sub.Name() {
			case "bash":
				sub.Example = "  source <(" + name + " completion bash)                  # this shell\n  " + name + " completion bash > /etc/bash_completion.d/" + name + "   # every new one"
			case "zsh":
				sub.Example = "  " + name + " completion zsh > \"${fpath[1]}/_" + name + "\""
			case "fish":
				sub.Example = "  " + name + " completion fish > ~/.config/fish/completions/" + name + ".fish"
			case "powershell":
				sub.Example = "  " + name + " completion powershell | Out-String | Invoke-Expression"
			}
		}
	}
}

// manLong puts each command's ManLong annotation in place of its Long.
func manLong(c *cobra.Command) {
	if long := c.Annotations[ManLong]; long != "" {
		c.Long = long
	}
	for _, sub := range c.Commands() {
		manLong(sub)
	}
}

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
