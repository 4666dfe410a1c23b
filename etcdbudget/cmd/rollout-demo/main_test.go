package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
)

func TestMain(m *testing.M) {
	etcdtest.BuildMember() // before any timed cluster start
	os.Exit(m.Run())
}

func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"--machines", "3", "--ready-after", "50ms", "--settle", "10ms"}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"waits: slot held by machine-", "acquired the slot", "kube-apiserver ready", "released the slot",
		"at most 1 machine(s) restarting or not yet ready at once (budget 1)"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	if n := strings.Count(s, "released the slot"); n != 3 {
		t.Errorf("%d releases, want 3:\n%s", n, s)
	}
}

func TestHelpOnStdoutAndVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"--help"}, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "usage: rollout-demo") {
		t.Fatalf("--help: %v %q", err, out.String())
	}
	out.Reset()
	if err := run([]string{"--version"}, &out); err != nil || !regexp.MustCompile(`^rollout-demo \S+ \(github.com/snapsvc/snapsvc/etcdbudget, go[^)]*\)\n$`).MatchString(out.String()) {
		t.Fatalf("--version: %v %q", err, out.String())
	}
}
