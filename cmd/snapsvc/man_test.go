package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestManPages checks that "man DIR" is listed in the help and writes a
// page per command, the root's exit codes as a tagged list (.TP), which
// roff reflows, where the help's aligned list became one run-on
// paragraph; and that the help's list and the page's say the same.
func TestManPages(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runWithSocket(safetyNet(t), "/nonexistent", false, "--help")
	if code != exitOK || !strings.Contains(out, "\n  man         Write a man page for every command into DIR\n") {
		t.Errorf("--help does not list man (exit %d):\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runWithSocket(safetyNet(t), "/nonexistent", false, "man", dir); code != exitOK {
		t.Fatalf("man %s: exit %d: %s", dir, code, errOut)
	}
	for _, page := range []string{"snapsvc.1", "snapsvc-restart.1", "snapsvc-watch.1", "snapsvc-man.1", "snapsvc-logs.1"} {
		if _, err := os.Stat(filepath.Join(dir, page)); err != nil {
			t.Errorf("no %s: %v", page, err)
		}
	}
	// Every page: titled by its own command, with EXAMPLES (issue 36).
	pages, _ := filepath.Glob(filepath.Join(dir, "*.1"))
	for _, p := range pages {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(filepath.Base(p), ".1")
		if !strings.HasPrefix(string(data), ".nh\n.TH \""+strings.ToUpper(name)+"\" \"1\" ") || !strings.Contains(string(data), "\n.SH EXAMPLES\n") {
			t.Errorf("%s: not titled %s, or no EXAMPLES:\n%.300s", p, strings.ToUpper(name), data)
		}
	}
	root, err := os.ReadFile(filepath.Join(dir, "snapsvc.1"))
	if err != nil {
		t.Fatal(err)
	}
	help := strings.Join(strings.Fields(rootLong), " ")
	for _, e := range exitCodes {
		code := strconv.Itoa(e.Code)
		if tagged := ".TP\n" + code + "\n" + e.Text + "\n"; !strings.Contains(string(root), tagged) {
			t.Errorf("snapsvc.1 lacks exit code %d as a tagged paragraph %q", e.Code, tagged)
		}
		if !strings.Contains(help, " "+code+" "+e.Text) {
			t.Errorf("the help lacks exit code %d: %s", e.Code, e.Text)
		}
	}
}
