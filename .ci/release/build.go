package main

import (
	"bytes"
	"compress/gzip"
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
// -trimpath, stripped, the version stamped; always in the repository's
// workspace (GOWORK is set to its go.work, whatever the tool was run with).
func (b *builder) binaries() error {
	for _, t := range b.def.Targets {
		for _, bin := range b.def.Binaries {
			if err := b.build(t, bin, b.binDir(t)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *builder) build(t target, bin binary, dir string) error {
	ldflags := []string{"-s", "-w"}
	if bin.Stamp != "" {
		for _, s := range [][2]string{{"stampedVersion", b.v.Tag}, {"stampedRevision", b.v.Commit}, {"stampedTime", b.v.Time.Format(time.RFC3339)}} {
			ldflags = append(ldflags, "-X", bin.Stamp+"."+s[0]+"="+s[1])
		}
	}
	dst := filepath.Join(dir, bin.Name)
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags", strings.Join(ldflags, " "), "-o", dst, bin.Main)
	cmd.Dir = b.repo
	cmd.Env = append(os.Environ(), "GOOS="+t.OS, "GOARCH="+t.Arch, "CGO_ENABLED=0", "GOWORK="+filepath.Join(b.repo, "go.work"), "GOFLAGS=")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s for %s: %v\n%s", bin.Main, t, err, out)
	}
	fmt.Printf("release: built %s for %s (%.1fs)\n", rel(b.out, dst), t, time.Since(start).Seconds())
	return nil
}

// docs runs each binary that makes them, built for this machine, for its
// man pages (gzipped without name or time, as Debian ships them) and its
// bash, zsh and fish completion.
func (b *builder) docs() error {
	host := target{runtime.GOOS, runtime.GOARCH}
	hostDir := filepath.Join(b.out, "build", "host")
	for _, t := range b.def.Targets {
		if t == host {
			hostDir = b.binDir(t)
		}
	}
	raw := filepath.Join(b.out, "build", "man-raw")
	for _, bin := range b.def.Binaries {
		if !bin.Man && !bin.Completion {
			continue
		}
		exe := filepath.Join(hostDir, bin.Name)
		if _, err := os.Stat(exe); err != nil {
			if err := b.build(host, bin, hostDir); err != nil {
				return err
			}
		}
		if bin.Man {
			dir := filepath.Join(raw, bin.Name)
			if out, err := exec.Command(exe, "man", dir).CombinedOutput(); err != nil {
				return fmt.Errorf("%s man %s: %v\n%s", bin.Name, dir, err, out)
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
