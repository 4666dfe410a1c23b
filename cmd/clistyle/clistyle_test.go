package clistyle

import (
	"bytes"
	"context"
	"errors"
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
	// The man page's: a definition list (package manpage renders it as
	// tagged paragraphs).
	if man := codes.Man("Intro."); !strings.HasPrefix(man, "Intro.\n\nExit codes:\n\n0\n: done\n\n3\n: retryable: ") || !strings.HasSuffix(man, "\n130\n: interrupted\n\n") {
		t.Errorf("man:\n%s", man)
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
