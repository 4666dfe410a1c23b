// Command modproxy writes a file-based Go module proxy (GOPROXY=file://DIR)
// holding the repository's modules exactly as a release would publish
// them: each module's tree at one git revision, zipped by
// golang.org/x/mod/zip as the go command and the module proxy do (nested
// modules, vendor directories and files outside the module left out), with
// its go.mod and an .info at the given version. It only writes files;
// the go command reads them with GOPROXY=file://DIR. A module in directory d
// is tagged d/vX.Y.Z, the root module vX.Y.Z.
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
	flag.Parse()
	if *version == "" || *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: modproxy -repo DIR -rev REV -version vX.Y.Z -out DIR moduledir...")
		os.Exit(2)
	}
	root, err := filepath.Abs(*repo)
	if err == nil {
		err = run(root, *rev, *version, *out, flag.Args())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

func run(repo, rev, version, out string, dirs []string) error {
	when, err := git(repo, "show", "-s", "--format=%cI", rev)
	if err != nil {
		return err
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(when)))
	if err != nil {
		return err
	}
	for _, dir := range dirs {
		dir = filepath.ToSlash(filepath.Clean(dir))
		subdir := ""
		if dir != "." {
			subdir = dir
		}
		gomod, err := git(repo, "show", rev+":"+filepath.ToSlash(filepath.Join(subdir, "go.mod")))
		if err != nil {
			return err
		}
		path := modfile.ModulePath(gomod)
		if path == "" {
			return fmt.Errorf("%s/go.mod at %s names no module", dir, rev)
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
		err = zipAt(zf, mv, repo, rev, subdir)
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

// zipAt zips the module in subdir of repo as it is at rev: the tree
// comes from git archive (only committed files, as a tag would have them;
// modzip.CreateFromVCS does the same but does not recognise a git
// worktree), and modzip.CreateFromDir applies the module zip rules.
func zipAt(w io.Writer, mv module.Version, repo, rev, subdir string) error {
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
