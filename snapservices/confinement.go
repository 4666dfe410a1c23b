package snapservices

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// Confinement reads the confinement of the snap installed at snapDir (a
// snap's $SNAP) from its meta/snap.yaml, the file snapd installs with
// every revision: "strict", "classic" or "devmode". A snap.yaml without
// the key is "strict", snapd's default (snap/info_snap_yaml.go). The
// error matches fs.ErrNotExist when there is no snap.yaml there (not
// inside a snap, a unit test).
func Confinement(snapDir string) (string, error) {
	path := filepath.Join(snapDir, "meta", "snap.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("snapservices: reading the snap's confinement: %w", err)
	}
	// snap.yaml is a YAML mapping; confinement is a top-level scalar
	// ("confinement: classic"), so a line scan reads it without a YAML
	// parser in the module's shipped code.
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || key != "confinement" {
			continue
		}
		val, _, _ = strings.Cut(val, "#")
		val = strings.Trim(strings.TrimSpace(val), `"'`)
		switch val {
		case "strict", "classic", "devmode":
			return val, nil
		}
		return "", fmt.Errorf("snapservices: %s: unknown confinement %q (want strict, classic or devmode)", path, val)
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("snapservices: reading %s: %w", path, err)
	}
	return "strict", nil
}

// ModeFor returns the mode a snap's own code acts in under a confinement:
// REST for a classic snap (it reaches /run/snapd.socket as the snap
// command does, sees every change that blocks it, and gets change ids),
// snapctl for a strict or devmode one (/v2/apps needs snapd-control
// there; snapctl is the snap's own path).
func ModeFor(confinement string) snapsvc.Mode {
	if confinement == "classic" {
		return snapsvc.ModeREST
	}
	return snapsvc.ModeSnapctl
}

// modeFromSnap picks the mode from the snap's snap.yaml under dir. With
// no snap.yaml to read (outside a snap: unit tests, a developer's machine)
// it is snapctl, the mode callers of this kind were written for: a command
// runner sees snapctl lines, and a client needs $SNAP_COOKIE (cmd/fakesnapd
// gives one: "fakesnapd ctl cookie SNAP").
func modeFromSnap(dir string) (snapsvc.Mode, error) {
	if dir == "" {
		return snapsvc.ModeSnapctl, nil
	}
	c, err := Confinement(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return snapsvc.ModeSnapctl, nil
	}
	if err != nil {
		return 0, err
	}
	return ModeFor(c), nil
}
