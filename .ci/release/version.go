package main

import (
	"bytes"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// version is the release's version, from git.
type version struct {
	// Tag is what --version shows: the tag at HEAD ("v0.2.0"), or git
	// describe's "v0.2.0-3-gabc1234" past it, or "v0.0.0-N-gHASH" before
	// any tag (N commits); "-dirty" when the work tree has changes.
	Tag string
	// Deb is Debian's version: "0.2.0", "0.2.0+3.gabc1234",
	// "0.0.0+N.gHASH", "+dirty" appended for a dirty tree; each sorts
	// after the tag it follows and before the next.
	Deb string
	// Commit is HEAD's full hash, Time its commit time (the mtime of
	// every file written, so the same commit gives the same files).
	Commit string
	Time   time.Time
}

// gitVersion reads the version of the repository at repo.
func gitVersion(repo string) (version, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return strings.TrimSpace(string(out)), nil
	}
	var v version
	var err error
	if v.Commit, err = git("rev-parse", "HEAD"); err != nil {
		return v, err
	}
	when, err := git("show", "-s", "--format=%ct", "HEAD")
	if err != nil {
		return v, err
	}
	secs, err := strconv.ParseInt(when, 10, 64)
	if err != nil {
		return v, fmt.Errorf("commit time %q: %w", when, err)
	}
	v.Time = time.Unix(secs, 0).UTC()
	// The root module's tags (v0.2.0), not the nested modules'
	// (cmd/v0.2.0, etcdbudget/v0.2.0).
	described, err := git("describe", "--tags", "--match", "v[0-9]*", "--dirty")
	if err != nil {
		// No tag yet.
		count, cerr := git("rev-list", "--count", "HEAD")
		if cerr != nil {
			return v, cerr
		}
		short, serr := git("rev-parse", "--short=7", "HEAD")
		if serr != nil {
			return v, serr
		}
		described = fmt.Sprintf("v0.0.0-%s-g%s", count, short)
		if status, _ := git("status", "--porcelain", "--untracked-files=no"); status != "" {
			described += "-dirty"
		}
	}
	v.Tag = described
	v.Deb, err = debVersion(described)
	return v, err
}

// reDescribe is git describe's output: a tag, then commits past it and
// the abbreviated hash, then -dirty.
var reDescribe = regexp.MustCompile(`^v(\d+\.\d+\.\d+)(?:-([0-9A-Za-z.]+))?(?:-(\d+)-g([0-9a-f]+))?$`)

// debVersion turns git describe's output into a Debian version: "v0.2.0"
// is 0.2.0, "v0.2.0-rc1" 0.2.0~rc1 (before 0.2.0), "v0.2.0-3-gabc1234"
// 0.2.0+3.gabc1234 (after it), "-dirty" adds "+dirty" (or ".dirty").
func debVersion(described string) (string, error) {
	rest, dirty := strings.CutSuffix(described, "-dirty")
	m := reDescribe.FindStringSubmatch(rest)
	if m == nil {
		return "", fmt.Errorf("version %q: not vX.Y.Z[-PRERELEASE][-N-gHASH][-dirty]", described)
	}
	deb := m[1]
	if m[2] != "" {
		deb += "~" + m[2]
	}
	plus := ""
	if m[3] != "" {
		plus = m[3] + ".g" + m[4]
	}
	if dirty {
		if plus != "" {
			plus += "."
		}
		plus += "dirty"
	}
	if plus != "" {
		deb += "+" + plus
	}
	return deb, nil
}
