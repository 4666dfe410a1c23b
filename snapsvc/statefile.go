package snapsvc

import (
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DefaultStateFile is where snapd keeps its state (dirs.SnapStateFile).
// snapd rewrites it, atomically, each time its state changes — a task
// starting or ending, a change becoming ready — before anyone can read
// the new state (overlord/state/state.go: Unlock checkpoints).
const DefaultStateFile = "/var/lib/snapd/state.json"

// WithStateFile names snapd's state file, which a wait for changes watches
// (inotify on its directory) where snapd has no notices API (before 2.62):
// a rewrite wakes the wait to read the changes at once, instead of after a
// poll interval. The file is never read; watching its directory needs no
// more than search permission on it (/var/lib/snapd is world-readable; a
// strictly confined snap cannot see it, and then polls). The default is
// DefaultStateFile with the default socket, none otherwise; "" disables
// the watch. fake.WithStateFile makes the fake keep one.
func WithStateFile(path string) Option {
	return func(s *settings) { s.stateFile, s.stateFileSet = path, true }
}

// newStateWatch watches snapd's state file at path (nil for ""): a rename
// over it (snapd's atomic write) or a write in place.
func newStateWatch(path string) *dirWatch {
	if path == "" {
		return nil
	}
	name := filepath.Base(path)
	return newDirWatch(filepath.Dir(path), unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE, func(n string) bool { return n == name })
}
