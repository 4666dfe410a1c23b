package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goreleaser/nfpm/v2/files"
)

// TestDebVersion checks git describe's forms against the Debian versions
// they become, and that each sorts where it must (dpkg --compare-versions
// when dpkg is there).
func TestDebVersion(t *testing.T) {
	for in, want := range map[string]string{
		"v0.2.0":                    "0.2.0",
		"v0.2.0-dirty":              "0.2.0+dirty",
		"v0.2.0-3-gabc1234":         "0.2.0+3.gabc1234",
		"v0.2.0-3-gabc1234-dirty":   "0.2.0+3.gabc1234.dirty",
		"v0.2.0-rc1":                "0.2.0~rc1",
		"v0.2.0-rc1-3-gabc1234":     "0.2.0~rc1+3.gabc1234",
		"v0.0.0-303-gaeff7a3":       "0.0.0+303.gaeff7a3",
		"v0.0.0-303-gaeff7a3-dirty": "0.0.0+303.gaeff7a3.dirty",
	} {
		got, err := debVersion(in)
		if err != nil || got != want {
			t.Errorf("debVersion(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0.2.0", "v0.2", "abc1234", "v0.2.0-3-gXYZ"} {
		if got, err := debVersion(bad); err == nil {
			t.Errorf("debVersion(%q) = %q, want an error", bad, got)
		}
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		return
	}
	// Each after the one before.
	order := []string{"0.1.0", "0.1.0+12.gabc1234", "0.2.0~rc1", "0.2.0~rc1+3.gabc1234", "0.2.0", "0.2.0+3.gabc1234", "0.2.0+3.gabc1234.dirty", "0.2.1~rc1"}
	for i := 1; i < len(order); i++ {
		if err := exec.Command("dpkg", "--compare-versions", order[i-1], "lt", order[i]).Run(); err != nil {
			t.Errorf("dpkg: %s is not before %s", order[i-1], order[i])
		}
	}
}

// TestDefinition checks the repository's release.yaml: it parses, every
// binary's main package exists, and every package's contents come from
// what the tool writes or from the repository.
func TestDefinition(t *testing.T) {
	d, err := loadDefinition("release.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range d.Binaries {
		if _, err := os.Stat(filepath.Join("../..", b.Main, "main.go")); err != nil {
			t.Errorf("binary %s: %v", b.Name, err)
		}
	}
	if len(d.Packages) < 2 {
		t.Errorf("%d packages, want snapsvc and snapsvc-rollout", len(d.Packages))
	}
}

// TestRelease runs the tool on a repository of its own making: a
// workspace with one command that writes a man page and completions, a
// definition with one target, an archive and a package. It checks every
// artifact, SHA256SUMS, the stamped version, and that a second run of the
// same commit writes the same bytes.
func TestRelease(t *testing.T) {
	repo := t.TempDir()
	files := map[string]string{
		"go.work":          "go 1.26.0\n\nuse ./cmd\n",
		"cmd/go.mod":       "module example.com/tool/cmd\n\ngo 1.26.0\n",
		"cmd/tool/main.go": toolMain,
		"LICENSE":          "a licence\n",
		"release.yaml": `project: tool
targets: [linux/amd64]
binaries:
  - name: tool
    main: ./cmd/tool
    stamp: main
    man: true
    completion: true
archive:
  files: [LICENSE]
packages:
  - name: tool
    arch: ${ARCH}
    version: ${VERSION}
    version_schema: none
    maintainer: Someone <someone@example.invalid>
    description: a tool
    contents:
      - src: ${DIST}/build/linux_${ARCH}/tool
        dst: /usr/bin/tool
        expand: true
      - src: ${DIST}/build/man/tool/*.1.gz
        dst: /usr/share/man/man1/
        expand: true
      - src: ${DIST}/build/completion/bash/tool
        dst: /usr/share/bash-completion/completions/tool
        expand: true
`,
	}
	for name, content := range files {
		if err := writeFile(filepath.Join(repo, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_DATE=2026-01-02T03:04:05Z", "GIT_COMMITTER_DATE=2026-01-02T03:04:05Z")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty", "-m", "one")
	git("add", ".")
	git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "two")
	git("tag", "v1.2.0")
	git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "--allow-empty", "-m", "three")

	wd, _ := os.Getwd()
	t.Cleanup(func() { os.Chdir(wd) }) // run changes into the repository
	modproxy := filepath.Join(wd, "..", "modproxy")
	outs := []string{filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")}
	for _, out := range outs {
		if err := run(repo, filepath.Join(repo, "release.yaml"), out, "", modproxy); err != nil {
			t.Fatal(err)
		}
	}
	sums, err := os.ReadFile(filepath.Join(outs[0], "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	again, _ := os.ReadFile(filepath.Join(outs[1], "SHA256SUMS"))
	if string(sums) != string(again) {
		t.Errorf("two runs of one commit differ:\n%s\n%s", sums, again)
	}
	want := []string{"tool_1.2.0-1-g", "_linux_amd64.tar.gz", "_linux_amd64.sbom.cdx.json", "tool_1.2.0+1.g", "_amd64.deb"}
	for _, w := range want {
		if !strings.Contains(string(sums), w) {
			t.Errorf("SHA256SUMS names no %q:\n%s", w, sums)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		sum, name, _ := strings.Cut(line, "  ")
		data, err := os.ReadFile(filepath.Join(outs[0], name))
		if err != nil || fmt.Sprintf("%x", sha256.Sum256(data)) != sum {
			t.Errorf("%s: checksum does not match (%v)", name, err)
		}
	}
	tool := filepath.Join(outs[0], "build", "linux_amd64", "tool")
	out, err := exec.Command(tool, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "tool v1.2.0-1-g") {
		t.Errorf("--version: %q, %v", out, err)
	}
	// The build information names the module version (go version -m;
	// it said "(devel)"): a commit after v1.2.0, Go's pseudo-version.
	head := strings.TrimSpace(gitOut(t, repo, "rev-parse", "HEAD"))
	if bi, err := buildinfo.ReadFile(tool); err != nil || bi.Main.Path != "example.com/tool/cmd" || bi.Main.Version != "v1.2.1-0.20260102030405-"+head[:12] || bi.Main.Sum == "" {
		t.Errorf("build information: %+v, %v", bi, err)
	}
	if _, err := exec.LookPath("dpkg-deb"); err == nil {
		debs, _ := filepath.Glob(filepath.Join(outs[0], "*.deb"))
		if len(debs) != 1 {
			t.Fatalf("packages %v", debs)
		}
		list, err := exec.Command("dpkg-deb", "-c", debs[0]).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"./usr/bin/tool", "./usr/share/man/man1/tool.1.gz", "./usr/share/bash-completion/completions/tool"} {
			if !strings.Contains(string(list), " "+f+"\n") {
				t.Errorf("the package lacks %s:\n%s", f, list)
			}
		}
		if !strings.Contains(string(list), "-rwxr-xr-x root/root") {
			t.Errorf("the binary is not executable by all:\n%s", list)
		}
	}
	if err := run(repo, filepath.Join(repo, "release.yaml"), outs[0], "", modproxy); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("a second run into the same directory: %v, want a refusal", err)
	}

	// The copyright names the Go standard library's licence: every Go
	// binary links it statically (Debian policy 12.5).
	copyright, err := os.ReadFile(filepath.Join(outs[0], "build", "debian", "tool", "copyright"))
	goVersion := runtime.Version()
	if err != nil || !strings.Contains(string(copyright), "\nFiles: go-toolchain/"+goVersion+"/*\nCopyright: Copyright 2009 The Go Authors.\nLicense: BSD-3-clause\n Copyright 2009 The Go Authors.\n .\n Redistribution and use") ||
		!strings.Contains(string(copyright), "Comment: Go's standard library and runtime, "+goVersion+", linked into tool. Go's patent grant (PATENTS):") {
		t.Errorf("copyright (%v):\n%s", err, copyright)
	}

	// A release: tagged at HEAD, the binaries name it; and the SBOM the
	// same version.
	git("tag", "v1.3.0")
	rel := filepath.Join(t.TempDir(), "rel")
	if err := run(repo, filepath.Join(repo, "release.yaml"), rel, "", modproxy); err != nil {
		t.Fatal(err)
	}
	tool = filepath.Join(rel, "build", "linux_amd64", "tool")
	if bi, err := buildinfo.ReadFile(tool); err != nil || bi.Main.Version != "v1.3.0" {
		t.Errorf("release build information: %+v, %v", bi, err)
	}
	sbom, err := os.ReadFile(filepath.Join(rel, "tool_1.3.0_linux_amd64.sbom.cdx.json"))
	if err != nil || !strings.Contains(string(sbom), `"purl": "pkg:golang/example.com/tool/cmd@v1.3.0"`) {
		t.Errorf("SBOM: %v\n%s", err, sbom)
	}

	// Changes not committed: no module version describes the tree, so
	// it is built in the workspace and says "(devel)".
	if err := os.WriteFile(filepath.Join(repo, "LICENSE"), []byte("another licence\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dirty := filepath.Join(t.TempDir(), "dirty")
	if err := run(repo, filepath.Join(repo, "release.yaml"), dirty, "", modproxy); err != nil {
		t.Fatal(err)
	}
	if bi, err := buildinfo.ReadFile(filepath.Join(dirty, "build", "linux_amd64", "tool")); err != nil || bi.Main.Version != "(devel)" {
		t.Errorf("dirty build information: %+v, %v", bi, err)
	}
}

// gitOut runs git in repo and returns its output.
func gitOut(t *testing.T, repo string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %v: %v", args, err)
	}
	return string(out)
}

// TestModuleVersion checks the module version a build is published at:
// the release, Go's pseudo-version past one, none for a dirty tree.
func TestModuleVersion(t *testing.T) {
	at := time.Date(2026, 12, 6, 8, 44, 0, 0, time.UTC)
	commit := "0123456789abcdef0123456789abcdef01234567"
	for tag, want := range map[string]string{
		"v0.2.0":                  "v0.2.0",
		"v0.2.0-rc1":              "v0.2.0-rc1",
		"v0.2.0-3-g0123456":       "v0.2.1-0.20261206084400-0123456789ab",
		"v0.2.0-rc1-3-g0123456":   "v0.2.0-rc1.0.20261206084400-0123456789ab",
		"v0.0.0-303-g0123456":     "v0.0.0-20261206084400-0123456789ab",
		"v1.9.9-1-g0123456":       "v1.9.10-0.20261206084400-0123456789ab",
		"v0.2.0-dirty":            "",
		"v0.2.0-3-g0123456-dirty": "",
	} {
		got, release, err := moduleVersion(version{Tag: tag, Commit: commit, Time: at})
		if err != nil || got != want || release != (want == tag) {
			t.Errorf("moduleVersion(%q) = %q, release %t, %v; want %q", tag, got, release, err, want)
		}
	}
}

// TestClaim checks that two packages of one target may share directories
// but not a file: the snapsvc package's man page glob once took
// snapsvc-rollout's pages too, and dpkg would have refused the second
// package.
func TestClaim(t *testing.T) {
	owners := map[string]string{}
	one := files.Contents{
		{Destination: "/usr/share/man/man1/", Type: files.TypeImplicitDir},
		{Destination: "/usr/share/man/man1/snapsvc.1.gz", Source: "build/man/snapsvc/snapsvc.1.gz"},
	}
	two := files.Contents{
		{Destination: "/usr/share/man/man1/", Type: files.TypeImplicitDir},
		{Destination: "/usr/share/man/man1/snapsvc-rollout.1.gz", Source: "build/man/snapsvc-rollout/snapsvc-rollout.1.gz"},
	}
	if err := claim(owners, "snapsvc", one); err != nil {
		t.Fatal(err)
	}
	if err := claim(owners, "snapsvc-rollout", two); err != nil {
		t.Fatalf("a shared directory refused: %v", err)
	}
	both := append(files.Contents{}, two...)
	both = append(both, &files.Content{Destination: "/usr/share/man/man1/snapsvc-rollout.1.gz", Source: "build/man/snapsvc-rollout.1.gz"})
	err := claim(map[string]string{"/usr/share/man/man1/snapsvc-rollout.1.gz": "snapsvc-rollout"}, "snapsvc", both)
	if err == nil || !strings.Contains(err.Error(), "packages snapsvc-rollout and snapsvc both install /usr/share/man/man1/snapsvc-rollout.1.gz") {
		t.Fatalf("a file of two packages: %v", err)
	}
}

// toolMain is the test repository's command: --version prints what was
// stamped, "man DIR" writes one page, "completion SHELL" a script.
const toolMain = `package main

import (
	"fmt"
	"os"
	"path/filepath"
)

var stampedVersion, stampedRevision, stampedTime string

func main() {
	switch {
	case len(os.Args) == 2 && os.Args[1] == "--version":
		fmt.Println("tool", stampedVersion, stampedRevision, stampedTime)
	case len(os.Args) == 3 && os.Args[1] == "man":
		os.MkdirAll(os.Args[2], 0o755)
		os.WriteFile(filepath.Join(os.Args[2], "tool.1"), []byte(".TH TOOL 1\n"), 0o644)
	case len(os.Args) == 3 && os.Args[1] == "completion":
		fmt.Println("# completion for", os.Args[2])
	default:
		os.Exit(2)
	}
}
`

// TestChangelogVersion checks where the version of a HEAD without a tag
// comes from (issue 36: everything said 0.0.0+426.g519f3ee): a dated
// release at the top of CHANGELOG.md without its tag is that release; an
// [Unreleased] section above it is past it, counted from the commit that
// dated it or from its tag; a tag at HEAD wins.
func TestChangelogVersion(t *testing.T) {
	repo := t.TempDir()
	git := func(args ...string) string {
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid"}, args...)...)
		cmd.Dir = repo
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	commit := func(changelog string) string {
		if err := os.WriteFile(filepath.Join(repo, "CHANGELOG.md"), []byte("# Changelog\n\n"+changelog), 0o644); err != nil {
			t.Fatal(err)
		}
		git("add", ".")
		git("commit", "-q", "-m", "x")
		return git("rev-parse", "--short=7", "HEAD")
	}
	check := func(wantTag, wantDeb string) {
		t.Helper()
		v, err := gitVersion(repo)
		if err != nil || v.Tag != wantTag || v.Deb != wantDeb {
			t.Errorf("version %q (deb %q), %v; want %q (%q)", v.Tag, v.Deb, err, wantTag, wantDeb)
		}
	}
	git("init", "-q")
	h := commit("## [Unreleased]\n\n- a\n")
	check("v0.0.0-1-g"+h, "0.0.0+1.g"+h)
	commit("## [1.3.0] - 2026-12-04\n\n- a\n")
	check("v1.3.0", "1.3.0")
	if err := os.WriteFile(filepath.Join(repo, "CHANGELOG.md"), []byte("# Changelog\n\n## [1.3.0] - 2026-12-04\n\n- a, b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	check("v1.3.0-dirty", "1.3.0+dirty")
	h = commit("## [Unreleased]\n\n- b\n\n## [1.3.0] - 2026-12-04\n\n- a\n")
	check("v1.3.0-1-g"+h, "1.3.0+1.g"+h) // no tag: counted from the dating commit
	git("tag", "v1.3.0", "HEAD~1")
	h = commit("## [Unreleased]\n\n- b, c\n\n## [1.3.0] - 2026-12-04\n\n- a\n")
	check("v1.3.0-2-g"+h, "1.3.0+2.g"+h) // past the tag
	commit("## [1.4.0] - 2026-12-05\n\n- b, c\n\n## [1.3.0] - 2026-12-04\n\n- a\n")
	check("v1.4.0", "1.4.0")
	git("tag", "v1.4.0-rc1")
	check("v1.4.0-rc1", "1.4.0~rc1") // a tag at HEAD wins
}
