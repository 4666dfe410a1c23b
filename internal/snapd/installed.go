package snapd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// ErrNotInstalled matches, with errors.Is, a failure to reach snapd when
// its socket does not exist and nothing on the system would create it:
// snapd is not installed, or it is but systemd, which listens on
// snapd.socket for it, is not running. Waiting cannot help.
var ErrNotInstalled = errors.New("snapd is not installed here")

// NotInstalledError says why snapd was judged absent. It matches
// ErrNotInstalled.
type NotInstalledError struct {
	// Socket is the socket that does not exist.
	Socket string
	// Reason says what is missing.
	Reason string
	// Err is the dial error.
	Err error
}

func (e *NotInstalledError) Error() string {
	return fmt.Sprintf("%v: no socket at %s and %s: %v", ErrNotInstalled, e.Socket, e.Reason, e.Err)
}

// Is reports whether target is ErrNotInstalled.
func (e *NotInstalledError) Is(target error) bool { return target == ErrNotInstalled }

// Unwrap returns the dial error.
func (e *NotInstalledError) Unwrap() error { return e.Err }

// Where snapd's packaging puts what would create its socket. The daemon is
// in the distribution's libexec directory: /usr/lib/snapd on Debian and
// Ubuntu, /usr/libexec/snapd on Fedora, openSUSE and others (snapd's
// dirs/dirs.go DistroLibExecDir; packaging/*/snapd.install). snapd.socket
// is a systemd unit of the package (data/systemd/snapd.socket, installed
// in /lib or /usr/lib/systemd/system) or, on Ubuntu Core and wherever the
// snapd snap provides snapd, written by snapd to /etc/systemd/system
// (dirs.SnapServicesDir). Without systemd as init (sd_booted: no
// /run/systemd/system) nothing listens on snapd.socket.
var (
	daemonPaths = []string{"usr/lib/snapd/snapd", "usr/libexec/snapd/snapd"}
	unitPaths   = []string{"lib/systemd/system/snapd.socket", "usr/lib/systemd/system/snapd.socket", "etc/systemd/system/snapd.socket"}
	systemdRun  = "run/systemd/system"
)

// Absent reports whether nothing under root (the file system's root, "/"
// on a real system) would create snapd's socket, and why: neither snapd's
// daemon nor its socket unit exists, or systemd is not running. It only
// reads the file system; a snapd that is restarting, or whose socket unit
// is waiting to be started, is not absent.
func Absent(root string) (bool, string) {
	exists := func(p string) bool {
		_, err := os.Stat(filepath.Join(root, p))
		return err == nil || !errors.Is(err, fs.ErrNotExist)
	}
	installed := false
	for _, p := range append(append([]string(nil), daemonPaths...), unitPaths...) {
		if exists(p) {
			installed = true
			break
		}
	}
	if !installed {
		looked := make([]string, 0, len(daemonPaths)+len(unitPaths))
		for _, p := range append(append([]string(nil), daemonPaths...), unitPaths...) {
			looked = append(looked, filepath.Join(root, p))
		}
		return true, "neither snapd's daemon nor its socket unit exists (" + strings.Join(looked, ", ") + ")"
	}
	if !exists(systemdRun) {
		return true, "systemd is not running (no " + filepath.Join(root, systemdRun) + "), so nothing listens on snapd.socket to start snapd"
	}
	return false, ""
}

// CheckInstalled makes a failed dial to a socket that does not exist look
// under root for what would create it: when nothing would (Absent), the
// error wraps a *NotInstalledError, and retrying cannot help. An empty
// root turns the check off.
func (c *Client) CheckInstalled(root string) { c.installRoot = root }

// notInstalled returns a *NotInstalledError for a dial error when the
// socket is missing and snapd absent, else nil.
func (c *Client) notInstalled(err error) error {
	if c.installRoot == "" {
		return nil
	}
	if absent, why := Absent(c.installRoot); absent {
		return &NotInstalledError{Socket: c.socket, Reason: why, Err: err}
	}
	return nil
}
