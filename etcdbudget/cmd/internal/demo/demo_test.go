package demo

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/snapsvc/snapsvc/cmd/clistyle/clistyletest"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
)

// buildFirst builds etcd's member binary before any test starts a
// cluster under a time bound (a cold build cache takes minutes), and only
// in the test binary's own run, not when a script runs it as a command.
type buildFirst struct{ m *testing.M }

func (b buildFirst) Run() int {
	etcdtest.BuildMember()
	return b.m.Run()
}

// TestMain lets the test binary act as the rollout-demo command inside
// scripts.
func TestMain(m *testing.M) {
	testscript.Main(buildFirst{m}, map[string]func(){
		"rollout-demo": func() { os.Exit(Main()) },
	})
}

// TestScripts runs testdata/script/*.txtar: the command line style.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Cmds:                map[string]func(ts *testscript.TestScript, neg bool, args []string){"exits": clistyletest.Exits},
	})
}

func TestDemo(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Run(context.Background(), []string{"--machines", "3", "--ready-after", "50ms", "--settle", "10ms"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
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

// A cancelled demo (Ctrl-C) stops, exits 130 and says so once.
func TestDemoInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	if code := Run(ctx, []string{"--machines", "2"}, &out, &errb); code != exitInterrupted || errb.String() != "error: interrupted\n" {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}
