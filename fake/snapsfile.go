package fake

import (
	"bytes"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// A snaps file describes the snaps a fake serves (fakesnapd --snaps FILE),
// in YAML or JSON (a JSON document is YAML too): a list of snaps, or an
// object with a "snaps" list.
//
//	snaps:
//	  - name: k8s
//	    hooks: [configure]
//	    configure-hook-duration: 2s
//	    apps:
//	      - {name: containerd, daemon: notify, before: [kubelet], start-duration: 500ms}
//	      - {name: kubelet, daemon: simple, after: [containerd], enabled: true, active: true}
//	      - {name: broken, daemon: oneshot, fail-start: true}
//	      - {name: k8s}
//
// Durations are Go durations ("1.5s"). fail-start is systemctl's stderr, or
// true for the usual "Job for ... failed" text; dies-after-start: true is
// App.DiesAfterStart. Keys are checked: a misspelt one is an error.
type snapsFile struct {
	Snaps []snapSpec `yaml:"snaps"`
}

type snapSpec struct {
	Name                  string         `yaml:"name"`
	Version               string         `yaml:"version"`
	Revision              string         `yaml:"revision"`
	Summary               string         `yaml:"summary"`
	Description           string         `yaml:"description"`
	Base                  string         `yaml:"base"`
	Confinement           string         `yaml:"confinement"`
	Grade                 string         `yaml:"grade"`
	Type                  string         `yaml:"type"`
	TrackingChannel       string         `yaml:"tracking-channel"`
	License               string         `yaml:"license"`
	Cookie                string         `yaml:"cookie"`
	Hooks                 []string       `yaml:"hooks"`
	ConfigureHookDuration duration       `yaml:"configure-hook-duration"`
	ConfigureHookSleepKey string         `yaml:"configure-hook-sleep-key"`
	Config                map[string]any `yaml:"config"`
	Apps                  []appSpec      `yaml:"apps"`
}

type appSpec struct {
	Name          string    `yaml:"name"`
	Daemon        string    `yaml:"daemon"`
	DaemonScope   string    `yaml:"daemon-scope"`
	Enabled       bool      `yaml:"enabled"`
	Active        bool      `yaml:"active"`
	Before        []string  `yaml:"before"`
	After         []string  `yaml:"after"`
	StartDuration duration  `yaml:"start-duration"`
	StopDuration  duration  `yaml:"stop-duration"`
	FailStart     failStart `yaml:"fail-start"`
	DiesAfter     bool      `yaml:"dies-after-start"`
}

type duration time.Duration

func (d *duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*d = duration(v)
	return nil
}

// failStart is a string, or true for SystemctlJobFailed.
type failStart struct {
	text    string
	generic bool
}

func (f *failStart) UnmarshalYAML(n *yaml.Node) error {
	var b bool
	if n.Tag == "!!bool" && n.Decode(&b) == nil {
		f.generic = b
		return nil
	}
	return n.Decode(&f.text)
}

// ParseSnaps reads a snaps file (see the format above) into Snaps.
func ParseSnaps(data []byte) ([]Snap, error) {
	var f snapsFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var root yaml.Node
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("fake snapd: snaps file: %w", err)
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	// re-decode strictly from the node: a list of snaps or {snaps: [...]}
	strict := func(v any) error {
		b, err := yaml.Marshal(doc)
		if err != nil {
			return err
		}
		d := yaml.NewDecoder(bytes.NewReader(b))
		d.KnownFields(true)
		return d.Decode(v)
	}
	var err error
	if doc.Kind == yaml.SequenceNode {
		err = strict(&f.Snaps)
	} else {
		err = strict(&f)
	}
	if err != nil {
		return nil, fmt.Errorf("fake snapd: snaps file: %w", err)
	}
	if len(f.Snaps) == 0 {
		return nil, fmt.Errorf("fake snapd: snaps file lists no snaps")
	}
	var out []Snap
	seen := map[string]bool{}
	for i, ss := range f.Snaps {
		if ss.Name == "" {
			return nil, fmt.Errorf("fake snapd: snaps file: snap %d has no name", i+1)
		}
		if seen[ss.Name] {
			return nil, fmt.Errorf("fake snapd: snaps file: snap %q listed twice", ss.Name)
		}
		seen[ss.Name] = true
		sn := Snap{Name: ss.Name, Version: ss.Version, Revision: ss.Revision, Summary: ss.Summary,
			Description: ss.Description, Base: ss.Base, Confinement: ss.Confinement, Grade: ss.Grade,
			Type: ss.Type, TrackingChannel: ss.TrackingChannel, License: ss.License, Cookie: ss.Cookie, Hooks: ss.Hooks,
			ConfigureHookDuration: time.Duration(ss.ConfigureHookDuration),
			ConfigureHookSleepKey: ss.ConfigureHookSleepKey, Config: ss.Config}
		apps := map[string]bool{}
		for _, as := range ss.Apps {
			if as.Name == "" {
				return nil, fmt.Errorf("fake snapd: snaps file: snap %q has an app without a name", ss.Name)
			}
			if apps[as.Name] {
				return nil, fmt.Errorf("fake snapd: snaps file: app %s.%s listed twice", ss.Name, as.Name)
			}
			apps[as.Name] = true
			if as.Daemon != "" && !daemonTypes[as.Daemon] {
				return nil, fmt.Errorf("fake snapd: snaps file: app %s.%s: unknown daemon type %q", ss.Name, as.Name, as.Daemon)
			}
			a := App{Name: as.Name, Daemon: as.Daemon, DaemonScope: as.DaemonScope, Enabled: as.Enabled,
				Active: as.Active, Before: as.Before, After: as.After,
				StartDuration: time.Duration(as.StartDuration), StopDuration: time.Duration(as.StopDuration),
				FailStart: as.FailStart.text, DiesAfterStart: as.DiesAfter}
			if as.FailStart.generic {
				a.FailStart = SystemctlJobFailed(ss.Name, as.Name)
			}
			sn.Apps = append(sn.Apps, a)
		}
		out = append(out, sn)
	}
	return out, nil
}
