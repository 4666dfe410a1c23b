package manpage

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
)

func newRoot(out *bytes.Buffer) *cobra.Command {
	root := &cobra.Command{Use: "tool", RunE: func(*cobra.Command, []string) error { return nil }}
	clistyle.Apply(root)
	root.AddCommand(&cobra.Command{Use: "restart", RunE: func(*cobra.Command, []string) error { return errors.New("boom") }})
	root.SetOut(out)
	root.SetErr(out)
	return root
}

// TestManLong checks that "man DIR", which importing the package adds,
// writes each command's ManLong, when set, as its description: a
// definition list becomes roff's tagged paragraphs. It is hidden, and has
// no page: the shipped binaries have no such command.
func TestManLong(t *testing.T) {
	var out bytes.Buffer
	root := newRoot(&out)
	root.Long = "Exit codes:\n  0  ok\n  1  failed"
	root.Annotations = map[string]string{clistyle.ManLong: "Exit codes:\n\n0\n: ok\n\n1\n: failed\n"}
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
		if c.Name() == "man" && !c.Hidden {
			t.Error("man is listed in the help")
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "tool-man.1")); err == nil {
		t.Error("a page for the man command")
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
	if err := write(root, dir, clistyle.Build{Version: "v0.2.0", Time: "2026-12-04T10:00:00Z"}); err != nil {
		t.Fatal(err)
	}
	for name, title := range map[string]string{"tool": "TOOL", "tool-tasks": "TOOL-TASKS", "tool-completion-bash": "TOOL-COMPLETION-BASH"} {
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

// TestExitCodesPage checks that clistyle.ExitCodes' man text is a tagged
// paragraph per code on the page.
func TestExitCodesPage(t *testing.T) {
	codes := clistyle.ExitCodes{{Code: 0, Text: "done"}, {Code: 3, Text: "retryable: " + strings.Repeat("etcd unreachable, ", 6) + "no slot"}, {Code: 130, Text: "interrupted"}}
	var out bytes.Buffer
	root := newRoot(&out)
	root.Long = codes.Help("Intro.")
	root.Annotations = map[string]string{clistyle.ManLong: codes.Man("Intro.")}
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
