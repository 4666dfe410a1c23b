package main

import (
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// builder writes the artifacts of one definition at one version into out:
// what goes into archives and packages under out/build, the artifacts
// themselves at the top.
type builder struct {
	def  *definition
	repo string
	out  string
	v    version
	// modproxy is .ci/modproxy's directory; src what the binaries are
	// built from (prepareSource).
	modproxy string
	src      source
}

// binDir is where the binaries of t are built.
func (b *builder) binDir(t target) string {
	return filepath.Join(b.out, "build", t.OS+"_"+debArch(t.Arch))
}

// manDir is where the man pages are written, gzipped, a directory per
// binary (build/man/NAME/), so that a package takes one binary's pages by
// directory: a name glob such as snapsvc*.1.gz would also take
// snapsvc-rollout's.
func (b *builder) manDir() string { return filepath.Join(b.out, "build", "man") }

func (b *builder) completionDir(shell string) string {
	return filepath.Join(b.out, "build", "completion", shell)
}

// binaries builds every binary for every target: static (CGO_ENABLED=0),
// -trimpath, stripped, the version stamped; from the module proxy of
// prepareSource, or in the repository's workspace for a dirty tree
// (GOWORK is set to its go.work, whatever the tool was run with). None
// may link the man page generator (noManGenerator).
func (b *builder) binaries() error {
	if err := b.prepareSource(); err != nil {
		return err
	}
	for _, t := range b.def.Targets {
		for _, bin := range b.def.Binaries {
			if err := b.build(t, bin, b.binDir(t), ""); err != nil {
				return err
			}
			if err := noManGenerator(filepath.Join(b.binDir(t), bin.Name)); err != nil {
				return err
			}
		}
	}
	return nil
}

// manGenerator are the modules that write man pages (cobra/doc's):
// package clistyle/manpage brings them, in a build with the manpages tag
// only.
var manGenerator = []string{"github.com/cpuguy83/go-md2man/v2", "github.com/russross/blackfriday/v2"}

// noManGenerator refuses a shipped binary that links the man page
// generator: its pages are written at build time (docs), by a build of
// its own.
func noManGenerator(path string) error {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return err
	}
	for _, m := range bi.Deps {
		for _, g := range manGenerator {
			if m.Path == g {
				return fmt.Errorf("%s links %s, the man page generator: only a build with the manpages tag may (package clistyle/manpage)", path, g)
			}
		}
	}
	return nil
}

// build builds bin for t into dir, with the build tags tags ("" for
// none).
func (b *builder) build(t target, bin binary, dir, tags string) error {
	ldflags := []string{"-s", "-w"}
	if bin.Stamp != "" {
		for _, s := range [][2]string{{"stampedVersion", b.v.Tag}, {"stampedRevision", b.v.Commit}, {"stampedTime", b.v.Time.Format(time.RFC3339)}} {
			ldflags = append(ldflags, "-X", bin.Stamp+"."+s[0]+"="+s[1])
		}
	}
	flags := []string{"-trimpath", "-ldflags", strings.Join(ldflags, " ")}
	if tags != "" {
		flags = append(flags, "-tags", tags)
	}
	env := []string{"GOOS=" + t.OS, "GOARCH=" + t.Arch, "CGO_ENABLED=0"}
	dst := filepath.Join(dir, bin.Name)
	start := time.Now()
	if b.src.proxy != "" {
		if err := b.install(t, bin, dst, flags, env); err != nil {
			return err
		}
	} else {
		cmd := exec.Command("go", append(append([]string{"build", "-buildvcs=false"}, flags...), "-o", dst, bin.Main)...)
		cmd.Dir = b.repo
		cmd.Env = append(append(os.Environ(), env...), "GOWORK="+filepath.Join(b.repo, "go.work"), "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s for %s: %v\n%s", bin.Main, t, err, out)
		}
	}
	what := ""
	if tags != "" {
		what = " (tags " + tags + ")"
	}
	fmt.Printf("release: built %s for %s%s (%.1fs)\n", rel(b.out, dst), t, what, time.Since(start).Seconds())
	return nil
}

// docs runs each binary that makes them, built for this machine, for its
// bash, zsh and fish completion, and a build of it with the manpages tag
// (the man command and its generator, which the shipped binary has not)
// for its man pages (gzipped without name or time, as Debian ships them).
func (b *builder) docs() error {
	host := target{runtime.GOOS, runtime.GOARCH}
	hostDir := filepath.Join(b.out, "build", "host")
	for _, t := range b.def.Targets {
		if t == host {
			hostDir = b.binDir(t)
		}
	}
	manDir := filepath.Join(b.out, "build", "host-manpages")
	raw := filepath.Join(b.out, "build", "man-raw")
	for _, bin := range b.def.Binaries {
		if !bin.Man && !bin.Completion {
			continue
		}
		exe := filepath.Join(hostDir, bin.Name)
		if _, err := os.Stat(exe); err != nil {
			if err := b.build(host, bin, hostDir, ""); err != nil {
				return err
			}
		}
		if bin.Man {
			if err := b.build(host, bin, manDir, "manpages"); err != nil {
				return err
			}
			dir := filepath.Join(raw, bin.Name)
			if out, err := exec.Command(filepath.Join(manDir, bin.Name), "man", dir).CombinedOutput(); err != nil {
				return fmt.Errorf("%s man %s (built with the manpages tag): %v\n%s", bin.Name, dir, err, out)
			}
		}
		if bin.Completion {
			for shell, file := range map[string]string{"bash": bin.Name, "zsh": "_" + bin.Name, "fish": bin.Name + ".fish"} {
				out, err := exec.Command(exe, "completion", shell).Output()
				if err != nil || len(out) == 0 {
					return fmt.Errorf("%s completion %s: %v", bin.Name, shell, err)
				}
				if err := writeFile(filepath.Join(b.completionDir(shell), file), out, 0o644); err != nil {
					return err
				}
			}
		}
	}
	pages, _ := filepath.Glob(filepath.Join(raw, "*", "*.1"))
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			return err
		}
		var gz bytes.Buffer
		w, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression) // no name, no time: the same bytes every time
		w.Write(data)
		if err := w.Close(); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(b.manDir(), rel(raw, page)+".gz"), gz.Bytes(), 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("release: %d man pages, completions for %s\n", len(pages), strings.Join(b.completing(), ", "))
	if err := os.RemoveAll(manDir); err != nil {
		return err
	}
	return os.RemoveAll(raw)
}

// completing names the binaries with completions.
func (b *builder) completing() []string {
	var names []string
	for _, bin := range b.def.Binaries {
		if bin.Completion {
			names = append(names, bin.Name)
		}
	}
	return names
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, mode)
}

// rel is path relative to base, for messages.
func rel(base, path string) string {
	if r, err := filepath.Rel(base, path); err == nil {
		return r
	}
	return path
}

// copyFile copies src to w.
func copyFile(w io.Writer, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}
