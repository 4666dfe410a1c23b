package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestManPages checks that "man DIR" (in the tests' build and the
// release's build with the manpages tag, never the shipped binary: it is
// not in the help) writes a page per command, the root's exit codes as a
// tagged list (.TP), which roff reflows, where the help's aligned list
// became one run-on paragraph; and that the help's list and the page's
// say the same.
func TestManPages(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runWithSocket(safetyNet(t), "/nonexistent", false, "--help")
	if code != exitOK || strings.Contains(out, "\n  man ") {
		t.Errorf("--help lists man (exit %d):\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runWithSocket(safetyNet(t), "/nonexistent", false, "man", dir); code != exitOK {
		t.Fatalf("man %s: exit %d: %s", dir, code, errOut)
	}
	for _, page := range []string{"snapsvc.1", "snapsvc-restart.1", "snapsvc-watch.1", "snapsvc-logs.1", "snapsvc-completion.1"} {
		if _, err := os.Stat(filepath.Join(dir, page)); err != nil {
			t.Errorf("no %s: %v", page, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "snapsvc-man.1")); err == nil {
		t.Error("a page for the man command, which the shipped binary has not")
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

// TestManGeneratorNotLinked checks that the man page generator (package
// manpage: cobra/doc, go-md2man, blackfriday) is in no binary this
// module ships, built as the release builds it, and is in the build with
// the manpages tag that writes the pages ("go version -m" of v0.2.0's
// snapsvc listed go-md2man).
func TestManGeneratorNotLinked(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command:", err)
	}
	generator := []string{"github.com/snapsvc/snapsvc/cmd/clistyle/manpage", "github.com/spf13/cobra/doc", "github.com/cpuguy83/go-md2man/v2/md2man", "github.com/russross/blackfriday/v2"}
	for _, pkg := range []string{".", "../fakesnapd"} {
		for _, tags := range []string{"", "manpages"} {
			out, err := exec.Command(goBin, "list", "-deps", "-tags", tags, pkg).Output()
			if err != nil {
				t.Fatalf("go list -deps -tags %q %s: %v", tags, pkg, err)
			}
			deps := "\n" + string(out)
			for _, g := range generator {
				if linked := strings.Contains(deps, "\n"+g+"\n"); linked != (tags == "manpages") {
					t.Errorf("%s with tags %q: %s linked %t", pkg, tags, g, linked)
				}
			}
		}
	}
}
