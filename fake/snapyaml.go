package fake

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// snapYAML is the part of meta/snap.yaml the fake models (snap/info_snap_yaml.go).
type snapYAML struct {
	Name        string                 `yaml:"name"`
	Version     string                 `yaml:"version"`
	Summary     string                 `yaml:"summary"`
	Description string                 `yaml:"description"`
	Base        string                 `yaml:"base"`
	Type        string                 `yaml:"type"`
	Confinement string                 `yaml:"confinement"`
	Grade       string                 `yaml:"grade"`
	License     string                 `yaml:"license"`
	Apps        map[string]appYAML     `yaml:"apps"`
	Hooks       map[string]interface{} `yaml:"hooks"`
}

type appYAML struct {
	Daemon      string   `yaml:"daemon"`
	DaemonScope string   `yaml:"daemon-scope"`
	Before      []string `yaml:"before"`
	After       []string `yaml:"after"`
	InstallMode string   `yaml:"install-mode"`
	RefreshMode string   `yaml:"refresh-mode"`
	StopMode    string   `yaml:"stop-mode"`
}

// snapNameRe mirrors snap/naming ValidateSnap: lowercase letters, digits
// and dashes, at least one letter, no leading, trailing or double dash,
// at most 40 characters.
var snapNameRe = regexp.MustCompile(`^(?:[a-z0-9]+-?)*[a-z](?:-?[a-z0-9])*$`)

// appNameRe mirrors snap/naming ValidateApp.
var appNameRe = regexp.MustCompile(`^[a-zA-Z0-9](?:-?[a-zA-Z0-9])*$`)

var (
	daemonTypes  = map[string]bool{"simple": true, "forking": true, "oneshot": true, "notify": true, "dbus": true}
	refreshModes = map[string]bool{"": true, "endure": true, "restart": true, "ignore-running": true}
	stopModes    = map[string]bool{"": true, "sigterm": true, "sigterm-all": true, "sighup": true, "sighup-all": true,
		"sigusr1": true, "sigusr1-all": true, "sigusr2": true, "sigusr2-all": true, "sigint": true, "sigint-all": true}
)

// SnapFromYAML builds a Snap from the contents of a meta/snap.yaml: its
// name, version, summary, description, base, type, confinement and grade,
// its apps (services with their daemon type, daemon-scope and
// before/after ordering; plain apps), and the hooks it declares.
//
// Services start as snapd leaves them after an install: enabled and active,
// except install-mode: disable ones (disabled and inactive) and user
// daemons (enabled for all users, but the fake models no user session, so
// inactive). refresh-mode and stop-mode are checked and otherwise ignored.
// Set the result's Name for a parallel instance ("k8s_test"), its
// durations, FailStart and ConfigureHookDuration as a test needs. Hooks
// shipped only as files in meta/hooks/ (without a "hooks:" entry) are not in
// snap.yaml: SnapFromDir reads both.
func SnapFromYAML(data []byte) (Snap, error) {
	var y snapYAML
	if err := yaml.Unmarshal(data, &y); err != nil {
		return Snap{}, fmt.Errorf("fake snapd: cannot parse snap.yaml: %w", err)
	}
	if y.Name == "" {
		return Snap{}, fmt.Errorf("fake snapd: snap.yaml has no name")
	}
	if len(y.Name) > 40 || !snapNameRe.MatchString(y.Name) {
		return Snap{}, fmt.Errorf("fake snapd: snap.yaml: invalid snap name: %q", y.Name)
	}
	sn := Snap{Name: y.Name, Version: y.Version, Summary: y.Summary, Description: y.Description, Base: y.Base,
		Type: y.Type, Confinement: y.Confinement, Grade: y.Grade, License: y.License}
	var names []string
	for n := range y.Apps {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ay := y.Apps[n]
		if !appNameRe.MatchString(n) {
			return Snap{}, fmt.Errorf("fake snapd: snap.yaml of %q: invalid app name: %q", y.Name, n)
		}
		where := fmt.Sprintf("snap.yaml of %q: app %q", y.Name, n)
		a := App{Name: n, Daemon: ay.Daemon, DaemonScope: ay.DaemonScope,
			Before: ay.Before, After: ay.After}
		if ay.Daemon == "" {
			if ay.DaemonScope != "" || ay.InstallMode != "" || len(ay.Before) > 0 || len(ay.After) > 0 ||
				ay.RefreshMode != "" || ay.StopMode != "" {
				return Snap{}, fmt.Errorf("fake snapd: %s: daemon settings on an app that is not a daemon", where)
			}
			sn.Apps = append(sn.Apps, a)
			continue
		}
		if !daemonTypes[ay.Daemon] {
			return Snap{}, fmt.Errorf("fake snapd: %s: unknown daemon type %q", where, ay.Daemon)
		}
		switch ay.DaemonScope {
		case "":
			a.DaemonScope = "system"
		case "system", "user":
		default:
			return Snap{}, fmt.Errorf("fake snapd: %s: invalid daemon-scope %q", where, ay.DaemonScope)
		}
		if !refreshModes[ay.RefreshMode] {
			return Snap{}, fmt.Errorf("fake snapd: %s: invalid refresh-mode %q", where, ay.RefreshMode)
		}
		if !stopModes[ay.StopMode] {
			return Snap{}, fmt.Errorf("fake snapd: %s: invalid stop-mode %q", where, ay.StopMode)
		}
		for _, dep := range append(append([]string(nil), ay.Before...), ay.After...) {
			d, ok := y.Apps[dep]
			if !ok {
				return Snap{}, fmt.Errorf("fake snapd: %s refers to missing application %q", where, dep)
			}
			if d.Daemon == "" {
				return Snap{}, fmt.Errorf("fake snapd: %s refers to non-service application %q", where, dep)
			}
		}
		switch ay.InstallMode {
		case "", "enable":
			// wrappers: services are enabled and started by the install's
			// start-snap-services task; user daemons are enabled globally
			a.Enabled = true
			a.Active = a.DaemonScope == "system"
		case "disable":
		default:
			return Snap{}, fmt.Errorf("fake snapd: %s: invalid install-mode %q", where, ay.InstallMode)
		}
		sn.Apps = append(sn.Apps, a)
	}
	for h := range y.Hooks {
		sn.Hooks = append(sn.Hooks, h)
	}
	sort.Strings(sn.Hooks)
	return sn, nil
}

// SnapFromDir builds a Snap from an unpacked snap (or a snap's source
// tree): DIR/meta/snap.yaml, plus the executable files in DIR/meta/hooks/
// as hooks, as snapd finds them.
func SnapFromDir(dir string) (Snap, error) {
	data, err := os.ReadFile(filepath.Join(dir, "meta", "snap.yaml"))
	if err != nil {
		return Snap{}, fmt.Errorf("fake snapd: %w", err)
	}
	sn, err := SnapFromYAML(data)
	if err != nil {
		return Snap{}, err
	}
	ents, err := os.ReadDir(filepath.Join(dir, "meta", "hooks"))
	if err != nil && !os.IsNotExist(err) {
		return Snap{}, fmt.Errorf("fake snapd: %w", err)
	}
	have := map[string]bool{}
	for _, h := range sn.Hooks {
		have[h] = true
	}
	for _, e := range ents {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") || have[e.Name()] {
			continue
		}
		if fi, err := e.Info(); err != nil || fi.Mode()&0o111 == 0 {
			continue // snapd runs only executable hooks
		}
		sn.Hooks = append(sn.Hooks, e.Name())
	}
	sort.Strings(sn.Hooks)
	return sn, nil
}
