package clistyle

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

func newRoot(out *bytes.Buffer) *cobra.Command {
	root := &cobra.Command{Use: "tool", RunE: func(*cobra.Command, []string) error { return nil }}
	Apply(root)
	root.AddCommand(&cobra.Command{Use: "restart", RunE: func(*cobra.Command, []string) error { return errors.New("boom") }})
	root.SetOut(out)
	root.SetErr(out)
	return root
}

// TestStyle checks the shared style: --version and help on stdout,
// unknown flags and commands as *UsageError (with a suggestion), and a
// command's own failure not taken for a usage error.
func TestStyle(t *testing.T) {
	var out bytes.Buffer
	root := newRoot(&out)
	root.SetArgs([]string{"--version"})
	if err := root.Execute(); err != nil || !regexp.MustCompile(`^tool \S+ \(\S+, go`).MatchString(out.String()) {
		t.Errorf("--version: %v %q", err, out.String())
	}
	for args, want := range map[string]string{"restart --bogus": "unknown flag: --bogus", "resart": "Did you mean this?\n\trestart"} {
		root, ran := newRoot(&out), false
		root.SetArgs(strings.Fields(args))
		_, err := root.ExecuteC()
		ue, ok := AsUsage(err, ran, "tool")
		if !ok || !strings.Contains(ue.Msg, want) {
			t.Errorf("%s: %v, want a usage error saying %q", args, err, want)
		}
	}
	root = newRoot(&out)
	root.SetArgs([]string{"restart"})
	if _, err := root.ExecuteC(); err == nil {
		t.Fatal("restart did not fail")
	} else if _, ok := AsUsage(err, true, "tool restart"); ok {
		t.Errorf("a command's own failure taken for a usage error: %v", err)
	}
	b := ReadBuild()
	if b.Module == "" || b.Version == "" || b.Go == "" {
		t.Errorf("build %+v", b)
	}
}

// TestManLong checks that "man DIR" is listed (not hidden) and writes each
// command's ManLong, when set, as its description: a definition list
// becomes roff's tagged paragraphs.
func TestManLong(t *testing.T) {
	var out bytes.Buffer
	root := newRoot(&out)
	root.Long = "Exit codes:\n  0  ok\n  1  failed"
	root.Annotations = map[string]string{ManLong: "Exit codes:\n\n0\n: ok\n\n1\n: failed\n"}
	dir := t.TempDir()
	root.SetArgs([]string{"man", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(dir, "tool.1"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), ".TP\n0\nok\n") || strings.Contains(string(page), "  0  ok") {
		t.Errorf("tool.1 does not describe the command with its ManLong:\n%s", page)
	}
	if _, err := os.Stat(filepath.Join(dir, "tool-restart.1")); err != nil {
		t.Error(err)
	}
	for _, c := range root.Commands() {
		if c.Name() == "man" && c.Hidden {
			t.Error("man is hidden from the help")
		}
	}
}

// TestStamped checks that what a release build stamps (-ldflags -X) is
// what --version shows, and that a dirty tree's version is marked
// modified.
func TestStamped(t *testing.T) {
	defer func(v, r, tm string) { stampedVersion, stampedRevision, stampedTime = v, r, tm }(stampedVersion, stampedRevision, stampedTime)
	stampedVersion, stampedRevision, stampedTime = "v0.2.0-3-gabc1234-dirty", "abc1234def", "2026-12-04T15:50:08Z"
	b := ReadBuild()
	if b.Version != stampedVersion || b.Revision != stampedRevision || b.Time != stampedTime || !b.Modified {
		t.Errorf("stamped build read as %+v", b)
	}
	if line := b.Line("snapsvc"); line != "snapsvc v0.2.0-3-gabc1234-dirty (github.com/snapsvc/snapsvc/cmd, "+b.Go+", revision abc1234def, 2026-12-04T15:50:08Z, modified)" {
		t.Errorf("--version line %q", line)
	}
}

// TestExitCodes checks that one list of exit codes gives the help an
// aligned, wrapped list and the man page a tagged paragraph per code.
func TestExitCodes(t *testing.T) {
	codes := ExitCodes{{0, "done"}, {3, "retryable: " + strings.Repeat("etcd unreachable, ", 6) + "no slot"}, {130, "interrupted"}}
	help := codes.Help("Intro.")
	if !strings.HasPrefix(help, "Intro.\n\nExit codes:\n  0    done\n  3    retryable: etcd unreachable,") || !strings.HasSuffix(help, "\n  130  interrupted") {
		t.Errorf("help:\n%s", help)
	}
	for _, l := range strings.Split(help, "\n") {
		if len(l) > 80 {
			t.Errorf("help line of %d columns: %q", len(l), l)
		}
	}
	if !strings.Contains(help, "\n       unreachable, etcd") {
		t.Errorf("help does not wrap under the text:\n%s", help)
	}
	var out bytes.Buffer
	root := newRoot(&out)
	root.Long = help
	root.Annotations = map[string]string{ManLong: codes.Man("Intro.")}
	dir := t.TempDir()
	root.SetArgs([]string{"man", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(dir, "tool.1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".TP\n0\ndone\n", ".TP\n130\ninterrupted\n"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("tool.1 lacks %q:\n%s", want, page)
		}
	}
}

// Execute: a bad command line is a *UsageError naming the command asked
// for, printed in the one form; a command's own failure after it ran is
// returned as it is.
func TestExecute(t *testing.T) {
	ran := false
	failed := errors.New("it failed")
	mkRoot := func() *cobra.Command {
		root := &cobra.Command{Use: "tool"}
		root.AddCommand(&cobra.Command{Use: "sub", Args: cobra.NoArgs, RunE: func(*cobra.Command, []string) error {
			ran = true
			return failed
		}})
		Apply(root)
		return root
	}
	var stdout, stderr bytes.Buffer
	path, err := Execute(context.Background(), mkRoot(), []string{"sub", "extra"}, &stdout, &stderr, func() bool { return ran })
	var ue *UsageError
	if !errors.As(err, &ue) || ue.Cmd != "tool sub" || path != "tool sub" || ran {
		t.Fatalf("extra argument: path %q, %#v (ran %v), want a UsageError of \"tool sub\"", path, err, ran)
	}
	var out bytes.Buffer
	ue.Fprint(&out)
	if want := "error: unknown command \"extra\" for \"tool sub\"\nRun 'tool sub --help' for usage.\n"; out.String() != want {
		t.Errorf("Fprint: %q, want %q", out.String(), want)
	}
	path, err = Execute(context.Background(), mkRoot(), []string{"sub"}, &stdout, &stderr, func() bool { return ran })
	if err != failed || path != "tool sub" {
		t.Errorf("failure after running: path %q, %v, want %v", path, err, failed)
	}
}

// TestManPages checks what issue 36 found wrong in every page: each page
// is titled by its own command, the footer is short (a 130-character
// version overprinted the date and the title), the synopsis keeps its
// brackets and parentheses (markdown took "[--x] (A | B)" for a link), and
// a command's Example is under EXAMPLES, completion's included. With man
// installed, the rendered pages are checked too.
func TestManPages(t *testing.T) {
	var out bytes.Buffer
	root := newRoot(&out)
	root.Example = "  tool restart x"
	root.AddCommand(&cobra.Command{Use: "tasks [--abs-time] (ID | --last=KIND)", Short: "List a change's tasks", Example: "  tool tasks 42",
		RunE: func(*cobra.Command, []string) error { return nil }})
	dir := t.TempDir()
	root.SetArgs([]string{"man", dir})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	stampedVersion, stampedTime = "v0.2.0", "2026-12-04T10:00:00Z"
	defer func() { stampedVersion, stampedTime = "", "" }()
	if err := WriteMan(root, dir); err != nil {
		t.Fatal(err)
	}
	for name, title := range map[string]string{"tool": "TOOL", "tool-tasks": "TOOL-TASKS", "tool-man": "TOOL-MAN", "tool-completion-bash": "TOOL-COMPLETION-BASH"} {
		page, err := os.ReadFile(filepath.Join(dir, name+".1"))
		if err != nil {
			t.Fatal(err)
		}
		th := strings.SplitN(string(page), "\n", 3)[1]
		if want := `.TH "` + title + `" "1" "Dec 2026" "tool 0.2.0" "User Commands"`; th != want {
			t.Errorf("%s: %s, want %s", name, th, want)
		}
		if !strings.Contains(string(page), "\n.SH EXAMPLES\n") || strings.Contains(string(page), "\n.SH EXAMPLE\n") {
			t.Errorf("%s: no EXAMPLES section:\n%s", name, page)
		}
	}
	tasks, _ := os.ReadFile(filepath.Join(dir, "tool-tasks.1"))
	if !strings.Contains(string(tasks), `tool tasks [--abs-time] (ID | --last=KIND)`) {
		t.Errorf("the synopsis lost its brackets:\n%s", tasks)
	}
	if _, err := exec.LookPath("man"); err != nil {
		return
	}
	cmd := exec.Command("man", "-l", filepath.Join(dir, "tool-tasks.1"))
	cmd.Env = append(os.Environ(), "MANWIDTH=80", "MAN_KEEP_FORMATTING=0", "LANG=C.UTF-8")
	raw, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	rendered := regexp.MustCompile(`.\x08`).ReplaceAll(raw, nil) // grotty's overstrike
	lines := strings.Split(strings.TrimRight(string(rendered), "\n"), "\n")
	if footer := lines[len(lines)-1]; !regexp.MustCompile(`^tool 0\.2\.0 +December 2026 +TOOL-TASKS\(1\)$|^tool 0\.2\.0 +Dec 2026 +TOOL-TASKS\(1\)$`).MatchString(footer) {
		t.Errorf("footer %q", footer)
	}
	if !strings.Contains(string(rendered), "tool tasks [--abs-time] (ID | --last=KIND)") {
		t.Errorf("rendered synopsis:\n%s", rendered)
	}
}
