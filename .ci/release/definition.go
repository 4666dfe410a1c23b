package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// definition is release.yaml.
type definition struct {
	Project  string   `yaml:"project"`
	Targets  []target `yaml:"targets"`
	Binaries []binary `yaml:"binaries"`
	Archive  struct {
		Files []string `yaml:"files"`
	} `yaml:"archive"`
	// Packages are nfpm configurations, kept as YAML: nfpm parses each
	// itself, with ${VERSION}, ${ARCH} and ${DIST} expanded.
	Packages []yaml.Node `yaml:"packages"`
}

// binary is one command to build.
type binary struct {
	Name string `yaml:"name"`
	// Main is the main package, relative to the repository's root.
	Main string `yaml:"main"`
	// Stamp is the package whose stampedVersion, stampedRevision and
	// stampedTime get the version from git ("" for none).
	Stamp string `yaml:"stamp"`
	// Man: "NAME man DIR", in a build with the manpages tag, writes its
	// man pages. Completion: "NAME completion bash|zsh|fish" prints its
	// completion scripts.
	Man        bool `yaml:"man"`
	Completion bool `yaml:"completion"`
}

// target is a GOOS/GOARCH pair.
type target struct{ OS, Arch string }

func (t target) String() string { return t.OS + "/" + t.Arch }

func (t *target) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	os, arch, ok := strings.Cut(s, "/")
	if !ok || os != "linux" || debArch(arch) == "" {
		return fmt.Errorf("line %d: target %q: want linux/ARCH with ARCH one of amd64, arm64, arm, 386, ppc64le, s390x, riscv64", n.Line, s)
	}
	*t = target{os, arch}
	return nil
}

// debArch is Debian's name of a Go architecture ("" if not one we build).
func debArch(goarch string) string {
	return map[string]string{"amd64": "amd64", "arm64": "arm64", "arm": "armhf", "386": "i386", "ppc64le": "ppc64el", "s390x": "s390x", "riscv64": "riscv64"}[goarch]
}

// loadDefinition reads and checks the definition: every field known, the
// names and targets given, each package an nfpm configuration whose
// version is given as is (version_schema none).
func loadDefinition(path string) (*definition, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var d definition
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case d.Project == "":
		return nil, fmt.Errorf("%s: no project", path)
	case len(d.Targets) == 0 || len(d.Binaries) == 0:
		return nil, fmt.Errorf("%s: needs targets and binaries", path)
	}
	seen := map[string]bool{}
	for _, b := range d.Binaries {
		if b.Name == "" || b.Main == "" || seen[b.Name] {
			return nil, fmt.Errorf("%s: every binary needs a name of its own and a main package (%q)", path, b.Name)
		}
		seen[b.Name] = true
	}
	for i := range d.Packages {
		var p struct {
			Name          string `yaml:"name"`
			VersionSchema string `yaml:"version_schema"`
		}
		if err := d.Packages[i].Decode(&p); err != nil {
			return nil, fmt.Errorf("%s: package %d: %w", path, i+1, err)
		}
		if p.Name == "" || p.VersionSchema != "none" {
			return nil, fmt.Errorf("%s: package %d (%q): needs a name and version_schema: none (the version is Debian's already)", path, i+1, p.Name)
		}
	}
	return &d, nil
}
