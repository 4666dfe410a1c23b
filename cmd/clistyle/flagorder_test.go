package clistyle

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// TestCommandFlagsFirst checks that a command's own flags may come before
// its name, as the root's persistent ones may: "snapsvc --no-wait restart
// k8s" was "unknown command "k8s"" (cobra read "restart" as --no-wait's
// value). Each command line runs; the test compares what the command got
// with what the same flags after its name give.
func TestCommandFlagsFirst(t *testing.T) {
	run := func(args ...string) (string, error) {
		var got string
		var jsonOut bool
		var timeout time.Duration
		root := &cobra.Command{Use: "tool", RunE: func(*cobra.Command, []string) error { return nil }}
		Apply(root)
		root.PersistentFlags().BoolVar(&jsonOut, "json", false, "")
		root.PersistentFlags().DurationVar(&timeout, "timeout", 0, "")
		restart := &cobra.Command{Use: "restart", RunE: func(c *cobra.Command, pos []string) error {
			noWait, _ := c.Flags().GetBool("no-wait")
			got = fmt.Sprintf("restart no-wait=%t json=%t timeout=%v %q", noWait, jsonOut, timeout, pos)
			return nil
		}}
		restart.Flags().Bool("no-wait", false, "")
		logs := &cobra.Command{Use: "logs", RunE: func(c *cobra.Command, pos []string) error {
			n, _ := c.Flags().GetString("lines")
			f, _ := c.Flags().GetBool("follow")
			got = fmt.Sprintf("logs n=%s f=%t json=%t %q", n, f, jsonOut, pos)
			return nil
		}}
		logs.Flags().StringP("lines", "n", "10", "")
		logs.Flags().BoolP("follow", "f", false, "")
		root.AddCommand(restart, logs)
		_, err := Execute(context.Background(), root, args, io.Discard, io.Discard, func() bool { return got != "" })
		return got, err
	}
	for before, after := range map[string]string{
		"--no-wait restart k8s":                      "restart --no-wait k8s",
		"--json --no-wait restart k8s":               "restart --json --no-wait k8s",
		"--timeout 2m --no-wait restart k8s.a k8s.b": "restart --timeout 2m --no-wait k8s.a k8s.b",
		"--no-wait=false restart k8s":                "restart --no-wait=false k8s",
		"-f logs k8s":                                "logs -f k8s",
		"-f -n 3 logs k8s":                           "logs -f -n 3 k8s",
		"-fn3 logs k8s":                              "logs -f -n 3 k8s",
		"-n=all --json logs k8s":                     "logs -n all --json k8s",
		"--json restart k8s":                         "restart --json k8s",
		"--json logs -- -f":                          "logs --json -- -f",
	} {
		want, err := run(strings.Fields(after)...)
		if err != nil {
			t.Fatalf("%s: %v", after, err)
		}
		if got, err := run(strings.Fields(before)...); got != want || err != nil {
			t.Errorf("tool %s: ran %q (%v), want %q as tool %s", before, got, err, want, after)
		}
	}
	// A flag no one has is named as the command's (not "unknown command
	// "k8s""), and words that are not flags are left to cobra.
	for args, want := range map[string]string{
		"--bogus restart k8s":         `unknown flag: --bogus`,
		"--no-wait logs k8s":          `unknown flag: --no-wait`,
		"-x logs k8s":                 `unknown shorthand flag: 'x' in -x`,
		"--version --no-wait restart": `unknown flag: --no-wait`, // --version is the root's alone
	} {
		if _, err := run(strings.Fields(args)...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("tool %s: %v, want an error saying %q", args, err, want)
		}
	}
}
