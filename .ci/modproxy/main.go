// Command modproxy writes a file-based Go module proxy (GOPROXY=file://DIR)
// holding the repository's modules exactly as a release would publish
// them: each module's tree at one git revision, zipped by
// golang.org/x/mod/zip as the go command and the module proxy do (nested
// modules, vendor directories and files outside the module left out), with
// its go.mod and an .info at the given version. It only writes files;
// the go command reads them with GOPROXY=file://DIR. A module in directory d
// is tagged d/vX.Y.Z, the root module vX.Y.Z.
//
// With -require-own, each published go.mod requires the other published
// modules at -version (a requirement of one of them at another version is
// set to it): what a commit between releases needs to be built as one
// pseudo-version (.ci/release does so), as its go.mod files still require
// the last release's. A release's go.mod files require it already.
//
//	go run . -repo ../.. -rev HEAD -version v0.2.0 -out /tmp/proxy . etcdbudget
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

func main() {
	repo := flag.String("repo", ".", "the git repository")
	rev := flag.String("rev", "HEAD", "the revision to publish")
	version := flag.String("version", "", "the version every module is published at (vX.Y.Z)")
	out := flag.String("out", "", "the proxy directory to write")
	requireOwn := flag.Bool("require-own", false, "make each go.mod require the other published modules at -version")
	flag.Parse()
	if *version == "" || *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: modproxy -repo DIR -rev REV -version vX.Y.Z -out DIR moduledir...")
		os.Exit(2)
	}
	root, err := filepath.Abs(*repo)
	if err == nil {
		err = run(root, *rev, *version, *out, *requireOwn, flag.Args())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

func run(repo, rev, version, out string, requireOwn bool, dirs []string) error {
	when, err := git(repo, "show", "-s", "--format=%cI", rev)
	if err != nil {
		return err
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(when)))
	if err != nil {
		return err
	}
	gomods := map[string][]byte{} // dir -> go.mod at rev
	own := map[string]bool{}      // the published modules' paths
	for i, dir := range dirs {
		dir = filepath.ToSlash(filepath.Clean(dir))
		dirs[i] = dir
		gomod, err := git(repo, "show", rev+":"+filepath.ToSlash(filepath.Join(subdirOf(dir), "go.mod")))
		if err != nil {
			return err
		}
		path := modfile.ModulePath(gomod)
		if path == "" {
			return fmt.Errorf("%s/go.mod at %s names no module", dir, rev)
		}
		gomods[dir], own[path] = gomod, true
	}
	for _, dir := range dirs {
		subdir := subdirOf(dir)
		gomod := gomods[dir]
		path := modfile.ModulePath(gomod)
		if requireOwn {
			if gomod, err = requireAt(gomod, own, version); err != nil {
				return fmt.Errorf("%s/go.mod: %w", dir, err)
			}
		}
		mv := module.Version{Path: path, Version: version}
		if err := module.Check(mv.Path, mv.Version); err != nil {
			return err
		}
		esc, err := module.EscapePath(path)
		if err != nil {
			return err
		}
		vdir := filepath.Join(out, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return err
		}
		zf, err := os.Create(filepath.Join(vdir, version+".zip"))
		if err != nil {
			return err
		}
		err = zipAt(zf, mv, repo, rev, subdir, gomod)
		if cerr := zf.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("zip %s: %w", mv, err)
		}
		info, _ := json.Marshal(struct {
			Version string
			Time    time.Time
		}{version, t.UTC()})
		for name, data := range map[string][]byte{version + ".mod": gomod, version + ".info": info, "list": []byte(version + "\n")} {
			if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
				return err
			}
		}
		fmt.Printf("%s@%s from %s:%s\n", path, version, rev, dir)
	}
	return nil
}

// subdirOf is a module directory as a path in the tree ("" for the root).
func subdirOf(dir string) string {
	if dir == "." {
		return ""
	}
	return dir
}

// requireAt is gomod with every requirement of a module of own set to
// version.
func requireAt(gomod []byte, own map[string]bool, version string) ([]byte, error) {
	f, err := modfile.Parse("go.mod", gomod, nil)
	if err != nil {
		return nil, err
	}
	changed := false
	for _, r := range f.Require {
		if own[r.Mod.Path] && r.Mod.Version != version {
			if err := f.AddRequire(r.Mod.Path, version); err != nil {
				return nil, err
			}
			changed = true
		}
	}
	if !changed {
		return gomod, nil
	}
	return f.Format()
}

// zipAt zips the module in subdir of repo as it is at rev, with gomod
// as its go.mod: the tree comes from git archive (only committed files, as
// a tag would have them; modzip.CreateFromVCS does the same but does not
// recognise a git worktree), and modzip.CreateFromDir applies the module
// zip rules.
func zipAt(w io.Writer, mv module.Version, repo, rev, subdir string, gomod []byte) error {
	tmp, err := os.MkdirTemp("", "modproxy")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	tree := rev
	if subdir != "" {
		tree = rev + ":" + subdir
	}
	archive := exec.Command("git", "archive", "--format=tar", tree)
	archive.Dir = repo
	untar := exec.Command("tar", "-x", "-C", tmp)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	var stderr bytes.Buffer
	archive.Stderr, untar.Stderr = &stderr, &stderr
	if err := untar.Start(); err != nil {
		return err
	}
	if err := archive.Run(); err != nil {
		untar.Wait()
		return fmt.Errorf("git archive %s: %v: %s", tree, err, stderr.String())
	}
	if err := untar.Wait(); err != nil {
		return fmt.Errorf("tar: %v: %s", err, stderr.String())
	}
	if err := os.WriteFile(filepath.Join(tmp, "go.mod"), gomod, 0o644); err != nil {
		return err
	}
	return modzip.CreateFromDir(w, mv, tmp)
}

func git(repo string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}
