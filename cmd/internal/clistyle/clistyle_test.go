package clistyle

import (
	"bytes"
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
