package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// version is the release's version, from git.
type version struct {
	// Tag is what --version shows: the tag at HEAD ("v0.2.0"), else
	// CHANGELOG.md's release (changelogVersion: "v0.2.0" while its first
	// section is that release, "v0.2.0-3-gabc1234" under an [Unreleased]
	// section three commits after it); "-dirty" when the work tree has
	// changes.
	Tag string
	// Deb is Debian's version: "0.2.0", "0.2.0+3.gabc1234",
	// "0.0.0+N.gHASH", "+dirty" appended for a dirty tree; each sorts
	// after the release it follows and before the next.
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
	described, err := git("describe", "--tags", "--exact-match", "--match", "v[0-9]*", "--dirty")
	if err != nil {
		// No tag at HEAD: CHANGELOG.md's release, so that a release is
		// built from the repository itself before its tags exist, else
		// git describe past the last tag (changelogVersion).
		described, err = changelogVersion(repo, git)
		if err != nil {
			return v, err
		}
	}
	v.Tag = described
	v.Deb, err = debVersion(described)
	return v, err
}

// reRelease is a dated release heading of CHANGELOG.md (Keep a
// Changelog): "## [0.2.0] - 2026-12-04".
var reRelease = regexp.MustCompile(`(?m)^## \[(\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?)\] - (\d{4}-\d\d-\d\d)\s*$`)

// reUnreleased is the heading of changes not released yet.
var reUnreleased = regexp.MustCompile(`(?m)^## \[Unreleased\]`)

// changelogVersion is the version of a HEAD without a tag, in git
// describe's form, "-dirty" added when tracked files have changes:
//
//   - CHANGELOG.md's first section is a dated release that has no tag
//     yet, "## [0.2.0] - 2026-12-04": that release, "v0.2.0" (the commits
//     that date a release and follow it until its tag are that release; a
//     change meant for the next one opens an [Unreleased] section above
//     it);
//   - else, past a tag: git describe's "v0.2.0-N-gHASH";
//   - else, with no tag yet, past the last dated release: as git describe
//     would say past its tag, N the commits since the one that dated it;
//   - else "v0.0.0-N-gHASH", N all the commits.
func changelogVersion(repo string, git func(...string) (string, error)) (string, error) {
	data, err := os.ReadFile(filepath.Join(repo, "CHANGELOG.md"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	short, err := git("rev-parse", "--short=7", "HEAD")
	if err != nil {
		return "", err
	}
	dirty := ""
	if status, _ := git("status", "--porcelain", "--untracked-files=no"); status != "" {
		dirty = "-dirty"
	}
	rel := reRelease.FindSubmatchIndex(data)
	unrel := reUnreleased.FindIndex(data)
	if rel != nil && (unrel == nil || unrel[0] > rel[0]) {
		version := "v" + string(data[rel[2]:rel[3]])
		if _, err := git("rev-parse", "--verify", "--quiet", "refs/tags/"+version); err != nil {
			return version + dirty, nil
		}
	}
	if described, err := git("describe", "--tags", "--match", "v[0-9]*", "--dirty"); err == nil {
		return described, nil
	}
	if rel != nil {
		// The commit that dated the release: the newest that added its
		// heading.
		heading := strings.TrimSpace(string(data[rel[0]:rel[1]]))
		dated, err := git("log", "-n1", "--format=%H", "-S", heading, "--", "CHANGELOG.md")
		if err != nil || dated == "" {
			return "", fmt.Errorf("CHANGELOG.md: no commit added %q: %v", heading, err)
		}
		count, err := git("rev-list", "--count", dated+"..HEAD")
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("v%s-%s-g%s%s", data[rel[2]:rel[3]], count, short, dirty), nil
	}
	count, err := git("rev-list", "--count", "HEAD")
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("v0.0.0-%s-g%s%s", count, short, dirty), nil
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
