// Command release writes snapsvc's release artifacts from the one
// definition in release.yaml: static binaries with their version stamped
// from git, man pages and shell completions, a tar.gz archive per target,
// .deb packages made with nfpm, an SBOM per archive and SHA256SUMS.
//
//	cd .ci/release && GOWORK=off go run . -out /tmp/dist
//	cd .ci/release && GOWORK=off go run . -out /tmp/dist -targets linux/amd64
//
// It builds the commands as a user's `go install MODULE/cmd/NAME@VERSION`
// does, from the repository's modules as committed at HEAD, published at
// the release's module version in a file module proxy (.ci/modproxy), so
// that each binary's build information (`go version -m`) names that
// version for the project's own modules (source.go); a tree with changes
// not committed is built in the workspace (go.work) instead, "(devel)".
// The man pages come from a build of each command with the manpages tag,
// which no shipped binary is. Every file it writes is the same for the
// same commit (times are the commit's).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	repo := flag.String("repo", "../..", "the repository's root")
	def := flag.String("def", "release.yaml", "the release definition")
	out := flag.String("out", "", "the directory to write (created; must be empty or absent)")
	targets := flag.String("targets", "", "build only these of the definition's targets (comma-separated GOOS/GOARCH)")
	modproxy := flag.String("modproxy", "", "the directory of .ci/modproxy, which publishes the modules the binaries are built from (default: REPO/.ci/modproxy)")
	flag.Parse()
	if *out == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: release [-repo DIR] [-def FILE] [-targets LIST] [-modproxy DIR] -out DIR")
		os.Exit(2)
	}
	if err := run(*repo, *def, *out, *targets, *modproxy); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(repo, defPath, out, only, modproxy string) error {
	var err error
	if repo, err = filepath.Abs(repo); err != nil {
		return err
	}
	if modproxy == "" {
		modproxy = filepath.Join(repo, ".ci", "modproxy")
	}
	if modproxy, err = filepath.Abs(modproxy); err != nil {
		return err
	}
	if defPath, err = filepath.Abs(defPath); err != nil {
		return err
	}
	if out, err = filepath.Abs(out); err != nil {
		return err
	}
	d, err := loadDefinition(defPath)
	if err != nil {
		return err
	}
	if only != "" {
		if d.Targets, err = restrict(d.Targets, strings.Split(only, ",")); err != nil {
			return err
		}
	}
	if entries, err := os.ReadDir(out); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s is not empty", out)
	}
	v, err := gitVersion(repo)
	if err != nil {
		return err
	}
	fmt.Printf("release: %s %s (deb %s), commit %s of %s\n", d.Project, v.Tag, v.Deb, v.Commit, v.Time.Format("2006-01-02T15:04:05Z07:00"))
	// nfpm reads the packages' relative sources from the working directory.
	if err := os.Chdir(repo); err != nil {
		return err
	}
	b := &builder{def: d, repo: repo, out: out, v: v, modproxy: modproxy}
	defer b.cleanSource()
	steps := []struct {
		what string
		do   func() error
	}{
		{"binaries", b.binaries},
		{"man pages and completions", b.docs},
		{"archives and SBOMs", b.archives},
		{"packages", b.packages},
		{"checksums", b.checksums},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
	}
	return nil
}

// restrict keeps the targets of want, which must all be the definition's.
func restrict(all []target, want []string) ([]target, error) {
	var kept []target
	for _, w := range want {
		found := false
		for _, t := range all {
			if t.String() == strings.TrimSpace(w) {
				kept, found = append(kept, t), true
			}
		}
		if !found {
			return nil, fmt.Errorf("target %q is not in the definition", w)
		}
	}
	return kept, nil
}
