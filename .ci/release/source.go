package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
)

// Where the binaries are built from. The build information Go embeds in
// a binary ("go version -m") names each module's version only when the go
// command resolved it as a module version: a build in the workspace
// (go.work) records "(devel)" for the main module and the project's
// others, whatever -ldflags stamps. So the tool publishes the
// repository's modules, as committed at HEAD, at one module version in a
// file module proxy (.ci/modproxy, as .ci/consumer does) and builds each
// binary as a user installs it, "go install MODULE/cmd/NAME@VERSION",
// without the workspace: each binary then names that version, with its
// checksum, for the project's own modules as for every other.
//
// The module version is the release's (v0.2.0: a tag at HEAD, or
// CHANGELOG.md's dated release), or between releases Go's pseudo-version
// of HEAD (v0.2.1-0.20261206084400-0123456789ab after v0.2.0), for which
// each published go.mod requires its siblings at that pseudo-version too
// (modproxy -require-own: HEAD's go.mod files still require the last
// release). A release's go.mod files must require their siblings at the
// release itself: the tool refuses one that does not, as that release
// would build other code than HEAD's. A tree with changes not committed
// has no module version: it is built in the workspace, as before, and its
// binaries say "(devel)" (the SBOM too).

// moduleVersion is the module version v is built at, and whether it is a
// release (else a pseudo-version); "" for a dirty tree.
func moduleVersion(v version) (string, bool, error) {
	if strings.HasSuffix(v.Tag, "-dirty") {
		return "", false, nil
	}
	m := reDescribe.FindStringSubmatch(v.Tag)
	if m == nil {
		return "", false, fmt.Errorf("version %q: not vX.Y.Z[-PRERELEASE][-N-gHASH]", v.Tag)
	}
	if m[3] == "" {
		return v.Tag, true, nil
	}
	if len(v.Commit) < 12 {
		return "", false, fmt.Errorf("commit %q: want a full hash", v.Commit)
	}
	return pseudoVersion("v"+m[1], m[2], v), false, nil
}

// pseudoVersion is Go's pseudo-version of v's commit after release
// vX.Y.Z (with pre, its pre-release): vX.Y.(Z+1)-0.TIME-HASH, or
// vX.Y.Z-PRE.0.TIME-HASH; v0.0.0-TIME-HASH after none (v0.0.0). See
// https://go.dev/ref/mod#pseudo-versions.
func pseudoVersion(release, pre string, v version) string {
	stamp := v.Time.UTC().Format("20060102150405") + "-" + v.Commit[:12]
	switch {
	case pre != "":
		return release + "-" + pre + ".0." + stamp
	case release == "v0.0.0":
		return "v0.0.0-" + stamp
	}
	parts := strings.Split(strings.TrimPrefix(release, "v"), ".")
	patch, _ := strconv.Atoi(parts[2])
	return fmt.Sprintf("v%s.%s.%d-0.%s", parts[0], parts[1], patch+1, stamp)
}

// source is what the binaries are built from: the modules at a module
// version in a file proxy (proxy != ""), or the workspace.
type source struct {
	// version is the modules' version; proxy the file proxy's
	// directory, cache the module cache of the builds, both under work.
	version, proxy, cache, work string
	// own are the published modules' paths.
	own []string
}

// reModuleLine is a go.mod's module line.
var reModuleLine = regexp.MustCompile(`(?m)^module\s+"?([^"\s]+)"?\s*$`)

// reRequire is one requirement in a go.mod.
var reRequire = regexp.MustCompile(`(?m)^\s*(?:require\s+)?"?([^"\s()]+)"?\s+(v\S+)`)

// prepareSource publishes HEAD's modules (every go.mod outside internal/
// and .ci/ directories, as .ci/consumer does) at the module version of
// b.v into a file proxy, with .ci/modproxy (modproxyDir), or leaves
// b.src for the workspace when the tree has changes not committed.
func (b *builder) prepareSource() error {
	mv, release, err := moduleVersion(b.v)
	if err != nil || mv == "" {
		if err == nil {
			fmt.Printf("release: changes not committed: built in the workspace, \"(devel)\" in the build information\n")
		}
		return err
	}
	out, err := b.git("ls-tree", "-r", "--name-only", "HEAD")
	if err != nil {
		return err
	}
	var dirs []string
	for _, f := range strings.Split(strings.TrimSpace(out), "\n") {
		if f != "go.mod" && !strings.HasSuffix(f, "/go.mod") || strings.HasPrefix(f, ".ci/") || strings.HasPrefix(f, "internal/") || strings.Contains(f, "/internal/") {
			continue
		}
		dirs = append(dirs, filepath.Dir(f))
	}
	src := source{version: mv}
	gomods := map[string]string{}
	for _, d := range dirs {
		gomod, err := b.git("show", "HEAD:"+filepath.ToSlash(filepath.Join(d, "go.mod")))
		if err != nil {
			return err
		}
		m := reModuleLine.FindStringSubmatch(gomod)
		if m == nil {
			return fmt.Errorf("%s/go.mod names no module", d)
		}
		src.own = append(src.own, m[1])
		gomods[d] = gomod
	}
	if release {
		// The release's go.mod files must require their siblings at
		// the release: published, they would build the code those
		// versions name, not HEAD's.
		for d, gomod := range gomods {
			for _, r := range reRequire.FindAllStringSubmatch(gomod, -1) {
				for _, own := range src.own {
					if r[1] == own && r[2] != mv {
						return fmt.Errorf("%s/go.mod requires %s %s, not the release %s: require it at %s before the release", d, r[1], r[2], mv, mv)
					}
				}
			}
		}
	}
	if src.work, err = os.MkdirTemp("", "snapsvc-release-src"); err != nil {
		return err
	}
	src.proxy, src.cache = filepath.Join(src.work, "proxy"), filepath.Join(src.work, "modcache")
	args := []string{"run", ".", "-repo", b.repo, "-rev", "HEAD", "-version", mv, "-out", src.proxy}
	if !release {
		args = append(args, "-require-own")
	}
	cmd := exec.Command("go", append(args, dirs...)...)
	cmd.Dir = b.modproxy
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("modproxy: %v\n%s", err, out)
	}
	b.src = src
	fmt.Printf("release: modules %s at %s from a module proxy of HEAD\n", strings.Join(src.own, ", "), mv)
	return nil
}

// cleanSource removes what prepareSource made (the module cache's files
// are read-only without -modcacherw; the builds set it).
func (b *builder) cleanSource() {
	if b.src.work != "" {
		os.RemoveAll(b.src.work)
	}
}

// install builds bin for t from the proxy, as "go install PATH@VERSION"
// does for a user, into dst, with flags (-trimpath, -ldflags, -tags)
// and env (GOOS, GOARCH, CGO_ENABLED): in a GOPATH of its own, without
// GOBIN (go install refuses GOBIN for another platform), outside any
// module, the workspace off.
func (b *builder) install(t target, bin binary, dst string, flags, env []string) error {
	pkg, err := b.importPath(bin.Main)
	if err != nil {
		return err
	}
	gopath, err := os.MkdirTemp(b.src.work, "gopath")
	if err != nil {
		return err
	}
	defer os.RemoveAll(gopath)
	mainCache, err := goEnv("GOMODCACHE")
	if err != nil {
		return err
	}
	upstream, err := goEnv("GOPROXY")
	if err != nil {
		return err
	}
	cmd := exec.Command("go", append(append([]string{"install"}, flags...), pkg+"@"+b.src.version)...)
	cmd.Dir = b.src.work
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env, "GOWORK=off", "GOBIN=", "GOPATH="+gopath, "GOMODCACHE="+b.src.cache,
		// Our modules from the proxy alone; the others from this
		// machine's module cache when it has them, else upstream.
		"GOPROXY=file://"+b.src.proxy+",file://"+filepath.Join(mainCache, "cache", "download")+","+upstream,
		"GONOSUMDB="+strings.Join(b.src.own, ","), "GOFLAGS=-modcacherw", "GOTOOLCHAIN=local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err := cmd.Output(); err != nil {
		return fmt.Errorf("go install %s@%s for %s: %v\n%s%s", pkg, b.src.version, t, err, out, stderr.Bytes())
	}
	built := filepath.Join(gopath, "bin", filepath.Base(pkg))
	if t.OS != runtime.GOOS || t.Arch != runtime.GOARCH {
		built = filepath.Join(gopath, "bin", t.OS+"_"+t.Arch, filepath.Base(pkg))
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.Rename(built, dst)
}

// importPath is the import path of the main package at rel (a path
// relative to the repository's root), as the workspace resolves it.
func (b *builder) importPath(rel string) (string, error) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}", rel)
	cmd.Dir = b.repo
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(b.repo, "go.work"), "GOFLAGS=")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list %s: %v", rel, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// goEnv is one of the go command's settings.
func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// git runs git in the repository and returns its output.
func (b *builder) git(args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = b.repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}
