package main

import (
	"bytes"
	"compress/gzip"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// What Debian wants in /usr/share/doc/PACKAGE/ besides README: copyright
// in the machine-readable format (DEP-5), naming the licence of everything
// the package's static binaries link (every Go module, each with its
// licence's text and NOTICE: Apache-2.0, BSD and MIT ask for them in a
// binary distribution), and the changelogs (Debian policy 12.5, 12.7):
// changelog.Debian.gz in Debian's format, one entry per release of
// CHANGELOG.md, and the upstream changelog.gz. The packages' contents take
// them from ${DIST}/build/debian/PACKAGE/.

// debianDir is where a package's Debian documents are written.
func (b *builder) debianDir(pkg string) string {
	return filepath.Join(b.out, "build", "debian", pkg)
}

// debianDocs writes every package's copyright, changelog.Debian.gz and
// changelog.gz for target t (the copyright names the modules of t's
// binaries; they are the same on every target).
func (b *builder) debianDocs(t target) error {
	upstream, err := os.ReadFile(filepath.Join(b.repo, "CHANGELOG.md"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for i := range b.def.Packages {
		var p struct {
			Name       string `yaml:"name"`
			Maintainer string `yaml:"maintainer"`
			Homepage   string `yaml:"homepage"`
			Contents   []struct {
				Src string `yaml:"src"`
			} `yaml:"contents"`
		}
		if err := b.def.Packages[i].Decode(&p); err != nil {
			return err
		}
		var bins []string
		for _, c := range p.Contents {
			if name, ok := strings.CutPrefix(c.Src, "${DIST}/build/linux_${ARCH}/"); ok && !strings.Contains(name, "/") {
				bins = append(bins, name)
			}
		}
		copyright, err := b.copyright(t, p.Homepage, bins)
		if err != nil {
			return fmt.Errorf("%s: copyright: %w", p.Name, err)
		}
		dir := b.debianDir(p.Name)
		if err := writeFile(filepath.Join(dir, "copyright"), copyright, 0o644); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(dir, "changelog.Debian.gz"), gz(debianChangelog(p.Name, p.Maintainer, b.v, upstream)), 0o644); err != nil {
			return err
		}
		if upstream == nil {
			continue
		}
		if err := writeFile(filepath.Join(dir, "changelog.gz"), gz(upstream), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// gz compresses data without a name or time, so the same input gives the
// same bytes.
func gz(data []byte) []byte {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	w.Write(data)
	w.Close()
	return buf.Bytes()
}

// module is one Go module a binary links.
type module struct {
	Path, Version string
	// Dir is its directory in the module cache ("" for the project's own).
	Dir  string
	Bins []string
}

// copyright is the DEP-5 copyright of a package whose binaries are bins:
// the project's own files, then every other module they link, sorted,
// then the Go toolchain's standard library and runtime, which every Go
// binary links statically (goStanza).
func (b *builder) copyright(t target, homepage string, bins []string) ([]byte, error) {
	mods := map[string]*module{}
	goVersion := ""
	for _, bin := range bins {
		bi, err := buildinfo.ReadFile(filepath.Join(b.binDir(t), bin))
		if err != nil {
			return nil, err
		}
		if goVersion != "" && bi.GoVersion != goVersion {
			return nil, fmt.Errorf("%s was built with %s, the others with %s", bin, bi.GoVersion, goVersion)
		}
		goVersion = bi.GoVersion
		for _, m := range bi.Deps {
			if b.ownModule(m.Path) {
				continue
			}
			if m.Replace != nil {
				m = m.Replace
			}
			key := m.Path + "@" + m.Version
			if mods[key] == nil {
				mods[key] = &module{Path: m.Path, Version: m.Version}
			}
			mods[key].Bins = append(mods[key].Bins, bin)
		}
	}
	keys := make([]string, 0, len(mods))
	for k := range mods {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var w strings.Builder
	fmt.Fprintf(&w, "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n")
	fmt.Fprintf(&w, "Upstream-Name: %s\nSource: %s\n", b.def.Project, homepage)
	fmt.Fprintf(&w, "Comment: The binaries (%s) are statically linked Go programs: each Go\n module they link is listed below with its licence, read from the module,\n then Go's standard library and runtime (%s), read from the toolchain.\n", strings.Join(bins, ", "), goVersion)
	fmt.Fprintf(&w, "\nFiles: *\nCopyright: %d The %s authors\nLicense: Apache-2.0\n", b.v.Time.Year(), b.def.Project)
	for _, k := range keys {
		m := mods[k]
		dir, err := moduleDir(m.Path, m.Version)
		if err != nil {
			return nil, err
		}
		lic, text, notice, holders := readLicence(dir)
		if lic == "" {
			return nil, fmt.Errorf("%s: no licence found in %s", k, dir)
		}
		if len(holders) == 0 {
			holders = []string{"The authors of " + m.Path}
		}
		fmt.Fprintf(&w, "\nFiles: go-modules/%s/*\nCopyright: %s\nLicense: %s\n", k, strings.Join(holders, "\n "), lic)
		if lic != "Apache-2.0" {
			w.WriteString(fieldText(text))
		}
		comment := fmt.Sprintf("Go module %s %s, linked into %s.", m.Path, m.Version, strings.Join(uniq(m.Bins), ", "))
		if notice != "" {
			comment += " Its NOTICE:\n\n" + notice
		}
		fmt.Fprintf(&w, "Comment: %s", fieldText(comment)[1:])
	}
	stanza, err := goStanza(goVersion, bins)
	if err != nil {
		return nil, err
	}
	w.WriteString(stanza)
	w.WriteString("\nLicense: Apache-2.0\n On Debian systems, the complete text of the Apache License, Version 2.0\n can be found in /usr/share/common-licenses/Apache-2.0.\n")
	return []byte(w.String()), nil
}

// goStanza is the copyright stanza of the Go standard library and runtime
// that built bins (goVersion: go1.26.8), which a Go binary links
// statically, as it links the modules above: Debian's policy (12.5) wants
// the licence of everything the binary package contains. Its text is the
// toolchain's own LICENSE (BSD-3-clause, The Go Authors), read from the
// GOROOT of the go command that built them, with Go's patent grant
// (PATENTS) as its comment.
func goStanza(goVersion string, bins []string) (string, error) {
	out, err := exec.Command("go", "env", "GOROOT", "GOVERSION").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOROOT GOVERSION: %v", err)
	}
	goroot, toolchain, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if toolchain != goVersion {
		return "", fmt.Errorf("the binaries were built with %s, the go command here is %s: its licence would not be theirs", goVersion, toolchain)
	}
	lic, text, _, holders := readLicence(goroot)
	if lic == "" {
		return "", fmt.Errorf("no licence in %s", goroot)
	}
	patents, err := os.ReadFile(filepath.Join(goroot, "PATENTS"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	var w strings.Builder
	fmt.Fprintf(&w, "\nFiles: go-toolchain/%s/*\nCopyright: %s\nLicense: %s\n", goVersion, strings.Join(holders, "\n "), lic)
	if lic != "Apache-2.0" {
		w.WriteString(fieldText(text))
	}
	comment := fmt.Sprintf("Go's standard library and runtime, %s, linked into %s.", goVersion, strings.Join(uniq(append([]string(nil), bins...)), ", "))
	if len(patents) > 0 {
		comment += " Go's patent grant (PATENTS):\n\n" + strings.TrimSpace(string(patents))
	}
	fmt.Fprintf(&w, "Comment: %s", fieldText(comment)[1:])
	return w.String(), nil
}

// fieldText is text as the continuation lines of a DEP-5 field: each line
// indented by a space, empty lines as " .".
func fieldText(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(strings.ReplaceAll(text, "\r", "")), "\n") {
		line = strings.TrimRight(line, " \t")
		if line == "" {
			line = "."
		}
		b.WriteString(" " + line + "\n")
	}
	return b.String()
}

func uniq(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// moduleDir is a module's directory in the module cache (it was just
// built, so no download happens).
func moduleDir(path, version string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", path+"@"+version)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: %v %s", path, version, err, info.Error)
	}
	return info.Dir, nil
}

// reCopyright is a copyright line of a licence text (not Apache's
// appendix template, "Copyright [yyyy] [name of copyright owner]").
var reCopyright = regexp.MustCompile(`(?mi)^[ \t#*/]*(copyright\s+(?:\(c\)\s*|©\s*)?\d{4}.*)$`)

// readLicence reads a module's licence file and says which licence it is
// in Debian's short names (Apache-2.0, Expat, BSD-2-clause, BSD-3-clause,
// ISC, MPL-2.0; several joined with " and "; "other" for a text it does
// not know), with its text, its NOTICE and its copyright lines.
func readLicence(dir string) (lic, text, notice string, holders []string) {
	for _, name := range []string{"LICENSE", "LICENSE.txt", "LICENSE.md", "LICENCE", "COPYING", "LICENSE-MIT", "LICENSE.MIT"} {
		if data, err := os.ReadFile(filepath.Join(dir, name)); err == nil {
			text = string(data)
			break
		}
	}
	if text == "" {
		return "", "", "", nil
	}
	if data, err := os.ReadFile(filepath.Join(dir, "NOTICE")); err == nil {
		notice = strings.TrimSpace(string(data))
	}
	flat := strings.Join(strings.Fields(text), " ")
	var ids []string
	if strings.Contains(flat, "Permission is hereby granted, free of charge") {
		ids = append(ids, "Expat")
	}
	if strings.Contains(flat, "Redistribution and use in source and binary forms") {
		if strings.Contains(flat, "Neither the name") || strings.Contains(flat, "names of its contributors") {
			ids = append(ids, "BSD-3-clause")
		} else {
			ids = append(ids, "BSD-2-clause")
		}
	}
	if strings.Contains(flat, "Permission to use, copy, modify, and") && strings.Contains(flat, "distribute this software for any purpose") {
		ids = append(ids, "ISC")
	}
	if strings.Contains(flat, "Mozilla Public License") && strings.Contains(flat, "2.0") {
		ids = append(ids, "MPL-2.0")
	}
	if strings.Contains(flat, "Apache License") && strings.Contains(flat, "Version 2.0") {
		ids = append(ids, "Apache-2.0")
	}
	if len(ids) == 0 {
		ids = []string{"other"}
	}
	for _, m := range reCopyright.FindAllStringSubmatch(text, -1) {
		holders = append(holders, strings.TrimSpace(m[1]))
	}
	return strings.Join(ids, " and "), text, notice, uniq(holders)
}

// reSection is a release heading of CHANGELOG.md.
var reSection = regexp.MustCompile(`(?m)^## \[([^\]]+)\](?: - (\d{4}-\d\d-\d\d))?\s*$`)

// debianChangelog is changelog.Debian in Debian's format: one entry per
// release of CHANGELOG.md, newest first, each saying what its section's
// subsections hold (the first line of each entry), the version the
// package's own (v.Deb) for the newest, the release's date (the commit's
// for a version without one).
func debianChangelog(pkg, maintainer string, v version, upstream []byte) []byte {
	var out strings.Builder
	idx := reSection.FindAllSubmatchIndex(upstream, -1)
	first := true
	for i, m := range idx {
		name := string(upstream[m[2]:m[3]])
		end := len(upstream)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		body := string(upstream[m[1]:end])
		if cut := strings.Index(body, "\n["); cut >= 0 && i+1 == len(idx) {
			body = body[:cut] // the link references at the end
		}
		when := v.Time
		if m[4] >= 0 {
			if d, err := time.Parse("2006-01-02", string(upstream[m[4]:m[5]])); err == nil {
				when = d
			}
		}
		deb := name
		switch {
		case first:
			deb = v.Deb
		case name == "Unreleased":
			continue
		}
		first = false
		fmt.Fprintf(&out, "%s (%s) unstable; urgency=medium\n\n", pkg, deb)
		for _, item := range changelogItems(pkg, body) {
			fmt.Fprintf(&out, "  * %s\n", item)
		}
		fmt.Fprintf(&out, "\n -- %s  %s\n\n", maintainer, when.UTC().Format("Mon, 02 Jan 2006 15:04:05 -0700"))
	}
	if first {
		// No CHANGELOG.md, or no section: one entry for this version.
		fmt.Fprintf(&out, "%s (%s) unstable; urgency=medium\n\n  * Release %s.\n\n -- %s  %s\n\n", pkg, v.Deb, v.Tag, maintainer, v.Time.UTC().Format("Mon, 02 Jan 2006 15:04:05 -0700"))
	}
	return []byte(strings.TrimSuffix(out.String(), "\n"))
}

// changelogItems is a section's entries, each its subsection ("Added: ")
// and its first sentence, wrapped (continuation lines indented four
// spaces, as dch does).
func changelogItems(pkg, body string) []string {
	var items []string
	sub := ""
	for i, block := range strings.Split(body, "\n- ") {
		lines := strings.Split(block, "\n")
		if i > 0 && sub != "" {
			var text []string
			for _, l := range lines {
				if strings.HasPrefix(l, "#") || strings.TrimSpace(l) == "" {
					break
				}
				text = append(text, strings.TrimSpace(l))
			}
			sentence := strings.ReplaceAll(strings.Join(text, " "), "**", "")
			if j := strings.Index(sentence, ". "); j > 0 {
				sentence = sentence[:j+1]
			}
			items = append(items, wrapItem(sub+": "+sentence))
		}
		// A heading in the block's tail is the next entries'.
		for _, l := range lines {
			if h, ok := strings.CutPrefix(l, "### "); ok {
				sub = h
			}
		}
	}
	if len(items) == 0 {
		items = []string{"See /usr/share/doc/" + pkg + "/changelog.gz."}
	}
	return items
}

// wrapItem wraps an entry at 78 columns after its "  * ".
func wrapItem(s string) string {
	var b strings.Builder
	n := 4
	for i, w := range strings.Fields(s) {
		if i > 0 && n+1+len(w) > 78 {
			b.WriteString("\n    ")
			n = 4
		} else if i > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}
