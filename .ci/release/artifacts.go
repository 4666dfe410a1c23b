package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	"go.yaml.in/yaml/v3"
)

// archiveName is the base name of t's archive (and of its SBOM).
func (b *builder) archiveName(t target) string {
	return fmt.Sprintf("%s_%s_%s_%s", b.def.Project, strings.TrimPrefix(b.v.Tag, "v"), t.OS, t.Arch)
}

// archives writes a tar.gz per target: a directory of the archive's name
// with every binary, man/man1/, completion/{bash,zsh,fish}/ and the
// definition's files; entries sorted, owned by root, timed at the commit.
// Beside each, its SBOM.
func (b *builder) archives() error {
	for _, t := range b.def.Targets {
		name := b.archiveName(t)
		files := map[string]string{} // path in the archive -> source
		for _, bin := range b.def.Binaries {
			files[bin.Name] = filepath.Join(b.binDir(t), bin.Name)
		}
		for _, f := range b.def.Archive.Files {
			files[f] = filepath.Join(b.repo, f)
		}
		for dir, into := range map[string]string{b.manDir(): "man/man1", filepath.Join(b.out, "build", "completion"): "completion"} {
			err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
				if err != nil || e.IsDir() {
					return err
				}
				in := rel(dir, p)
				if dir == b.manDir() {
					in = filepath.Base(p) // build/man/NAME/PAGE: every page in man/man1
				}
				files[filepath.ToSlash(filepath.Join(into, in))] = p
				return nil
			})
			if err != nil {
				return err
			}
		}
		var buf bytes.Buffer
		if err := b.tarGz(&buf, name, files); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(b.out, name+".tar.gz"), buf.Bytes(), 0o644); err != nil {
			return err
		}
		if err := b.sbom(t, name); err != nil {
			return err
		}
		fmt.Printf("release: %s.tar.gz (%d files), %s.sbom.cdx.json\n", name, len(files), name)
	}
	return nil
}

func (b *builder) tarGz(buf *bytes.Buffer, top string, files map[string]string) error {
	gz, _ := gzip.NewWriterLevel(buf, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	dirs := map[string]bool{}
	for _, p := range paths {
		// Every directory once, before its files.
		parts := strings.Split(top+"/"+p, "/")
		for i := 1; i < len(parts); i++ {
			dir := strings.Join(parts[:i], "/") + "/"
			if dirs[dir] {
				continue
			}
			dirs[dir] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: b.v.Time, Uname: "root", Gname: "root", Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		src := files[p]
		st, err := os.Stat(src)
		if err != nil {
			return err
		}
		mode := int64(0o644)
		if st.Mode()&0o111 != 0 {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: top + "/" + p, Size: st.Size(), Mode: mode, ModTime: b.v.Time, Uname: "root", Gname: "root", Format: tar.FormatPAX}); err != nil {
			return err
		}
		if err := copyFile(tw, src); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// cdx is the part of a CycloneDX 1.5 document the SBOM fills in.
type cdx struct {
	BOMFormat   string `json:"bomFormat"`
	SpecVersion string `json:"specVersion"`
	Version     int    `json:"version"`
	Metadata    struct {
		Timestamp string       `json:"timestamp"`
		Tools     []cdxComp    `json:"tools"`
		Component cdxComponent `json:"component"`
	} `json:"metadata"`
	Components   []cdxComponent `json:"components"`
	Dependencies []cdxDep       `json:"dependencies"`
}

type cdxComp struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
}

type cdxComponent struct {
	Type    string    `json:"type"`
	BOMRef  string    `json:"bom-ref"`
	Name    string    `json:"name"`
	Version string    `json:"version,omitempty"`
	PURL    string    `json:"purl,omitempty"`
	Hashes  []cdxHash `json:"hashes,omitempty"`
	Props   []cdxProp `json:"properties,omitempty"`
}

type cdxHash struct {
	Alg     string `json:"alg"`
	Content string `json:"content"`
}

type cdxProp struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type cdxDep struct {
	Ref       string   `json:"ref"`
	DependsOn []string `json:"dependsOn"`
}

// sbom writes the archive's SBOM: a CycloneDX 1.5 JSON document whose
// components are the archive's binaries and every Go module built into
// them, read from the build information each binary carries (what "go
// version -m" prints), so it lists exactly what was linked, at the
// versions the binaries name. nfpm makes no SBOM; this is the tool's.
func (b *builder) sbom(t target, name string) error {
	var doc cdx
	doc.BOMFormat, doc.SpecVersion, doc.Version = "CycloneDX", "1.5", 1
	doc.Metadata.Timestamp = b.v.Time.Format("2006-01-02T15:04:05Z")
	doc.Metadata.Tools = []cdxComp{{Name: "snapsvc .ci/release"}}
	doc.Metadata.Component = cdxComponent{Type: "application", BOMRef: name, Name: b.def.Project, Version: b.v.Tag}
	seen := map[string]bool{}
	var top []string
	for _, bin := range b.def.Binaries {
		path := filepath.Join(b.binDir(t), bin.Name)
		bi, err := buildinfo.ReadFile(path)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		ref := "bin:" + bin.Name
		top = append(top, ref)
		c := cdxComponent{Type: "application", BOMRef: ref, Name: bin.Name, Version: b.v.Tag,
			Hashes: []cdxHash{{Alg: "SHA-256", Content: fmt.Sprintf("%x", sum)}},
			Props:  []cdxProp{{Name: "go:main", Value: bi.Path}, {Name: "go:toolchain", Value: bi.GoVersion}, {Name: "go:module", Value: bi.Main.Path}}}
		var deps []string
		mods := append([]*debug.Module{&bi.Main}, bi.Deps...)
		for _, m := range mods {
			devel := false
			switch {
			case m.Version == "(devel)":
				// Built in the workspace (a tree with changes not
				// committed: no module version names it): the
				// release's version, from git, and the build
				// information's word beside it.
				m, devel = &debug.Module{Path: m.Path, Version: b.v.Tag}, true
			case m.Replace != nil:
				m = m.Replace
			}
			// Otherwise the version the binary's build information
			// names: the module proxy's (prepareSource), for the
			// project's own modules too.
			mref := "pkg:golang/" + m.Path + "@" + m.Version
			deps = append(deps, mref)
			if seen[mref] {
				continue
			}
			seen[mref] = true
			mc := cdxComponent{Type: "library", BOMRef: mref, Name: m.Path, Version: m.Version, PURL: mref}
			if m.Sum != "" {
				mc.Props = []cdxProp{{Name: "go:sum", Value: m.Sum}}
			}
			if devel {
				mc.Props = []cdxProp{{Name: "go:buildinfo-version", Value: "(devel)"}}
			}
			doc.Components = append(doc.Components, mc)
		}
		doc.Components = append(doc.Components, c)
		doc.Dependencies = append(doc.Dependencies, cdxDep{Ref: ref, DependsOn: deps})
	}
	doc.Dependencies = append(doc.Dependencies, cdxDep{Ref: name, DependsOn: top})
	sort.SliceStable(doc.Components, func(i, j int) bool { return doc.Components[i].BOMRef < doc.Components[j].BOMRef })
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(b.out, name+".sbom.cdx.json"), append(data, '\n'), 0o644)
}

// ownModule reports whether path is one of the project's modules: the
// repository's root module or one nested in it.
func (b *builder) ownModule(path string) bool {
	root := b.rootModule()
	return root != "" && (path == root || strings.HasPrefix(path, root+"/"))
}

// rootModule is the module path of the repository's go.mod.
func (b *builder) rootModule() string {
	data, err := os.ReadFile(filepath.Join(b.repo, "go.mod"))
	if err != nil {
		return ""
	}
	return modfileModule(data)
}

// modfileModule is the path on a go.mod's module line.
func modfileModule(data []byte) string {
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// packages writes each package of the definition for each target with
// nfpm's deb packager: its configuration parsed by nfpm with ${VERSION},
// ${ARCH} and ${DIST} expanded, the files' times the commit's.
func (b *builder) packages() error {
	pkgr, err := nfpm.Get("deb")
	if err != nil {
		return err
	}
	for _, t := range b.def.Targets {
		if err := b.debianDocs(t); err != nil {
			return err
		}
		owners := map[string]string{} // installed path -> package
		for i := range b.def.Packages {
			conf, err := yaml.Marshal(&b.def.Packages[i])
			if err != nil {
				return err
			}
			vars := map[string]string{"VERSION": b.v.Deb, "ARCH": debArch(t.Arch), "DIST": b.out}
			cfg, err := nfpm.ParseWithEnvMapping(bytes.NewReader(conf), func(k string) string { return vars[k] })
			if err != nil {
				return fmt.Errorf("package %d: %w", i+1, err)
			}
			info, err := cfg.Get("deb")
			if err != nil {
				return err
			}
			info.MTime = b.v.Time
			info.Target = ""
			if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
				return fmt.Errorf("%s: %w", info.Name, err)
			}
			if err := claim(owners, info.Name, info.Contents); err != nil {
				return fmt.Errorf("%s: %w", t, err)
			}
			var buf bytes.Buffer
			if err := pkgr.Package(info, &buf); err != nil {
				return fmt.Errorf("%s for %s: %w", info.Name, t, err)
			}
			file := pkgr.ConventionalFileName(info)
			if err := writeFile(filepath.Join(b.out, file), buf.Bytes(), 0o644); err != nil {
				return err
			}
			fmt.Printf("release: %s (%d files)\n", file, len(info.Contents))
		}
	}
	return nil
}

// claim records in owners (installed path -> package) the files pkg
// installs, and refuses a file another package of the same target
// installs too: dpkg would refuse to install the second package.
// Directories may be shared.
func claim(owners map[string]string, pkg string, contents files.Contents) error {
	for _, c := range contents {
		if c.Type == files.TypeDir || c.Type == files.TypeImplicitDir || c.Type == files.TypeTree {
			continue
		}
		if other, ok := owners[c.Destination]; ok && other != pkg {
			return fmt.Errorf("packages %s and %s both install %s (from %s): dpkg refuses to install both", other, pkg, c.Destination, c.Source)
		}
		owners[c.Destination] = pkg
	}
	return nil
}

// checksums writes SHA256SUMS over every artifact (the files at the top
// of out), in sha256sum's format.
func (b *builder) checksums() error {
	entries, err := os.ReadDir(b.out)
	if err != nil {
		return err
	}
	var sums strings.Builder
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(b.out, e.Name()))
		if err != nil {
			return err
		}
		fmt.Fprintf(&sums, "%x  %s\n", sha256.Sum256(data), e.Name())
	}
	if err := writeFile(filepath.Join(b.out, "SHA256SUMS"), []byte(sums.String()), 0o644); err != nil {
		return err
	}
	fmt.Printf("release: SHA256SUMS (%d artifacts)\n", strings.Count(sums.String(), "\n"))
	return nil
}
