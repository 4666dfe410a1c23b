package snapd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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

// Error says it in one short line: the dial error only repeats the
// socket's path (Unwrap returns it).
func (e *NotInstalledError) Error() string {
	return fmt.Sprintf("%v: no socket at %s and %s", ErrNotInstalled, e.Socket, e.Reason)
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
		// Short: the paths looked at are the package's documentation
		// (snapsvc.ErrSnapdNotInstalled), not every message's.
		return true, "neither snapd nor its snapd.socket unit is installed"
	}
	if !exists(systemdRun) {
		return true, "systemd is not running (it starts snapd on its socket)"
	}
	return false, ""
}

// CheckInstalled makes a failed dial to a socket that does not exist look
// under root for what would create it: when nothing would (Absent), the
// error wraps a *NotInstalledError, and retrying cannot help. An empty
// root turns the check off.
func (c *Client) CheckInstalled(root string) { c.installRoot, c.servedOnly = root, false }

// CheckServed makes a failed dial to a socket that does not exist judge
// snapd absent only when the socket's directory is missing too: for a
// snapd under another root (SNAPPY_GLOBAL_ROOT: a fake, a container's
// file system), where nothing need be installed under the root, a missing
// socket in a directory that exists is a snapd restarting and is waited
// for, and a root with no such directory has no snapd at all.
func (c *Client) CheckServed() { c.installRoot, c.servedOnly = "", true }

// notInstalled returns a *NotInstalledError for a dial error when the
// socket is missing and snapd absent, else nil.
func (c *Client) notInstalled(err error) error {
	if c.servedOnly {
		dir := filepath.Dir(c.socket)
		if _, serr := os.Stat(dir); errors.Is(serr, fs.ErrNotExist) {
			return &NotInstalledError{Socket: c.socket, Reason: "no directory " + dir, Err: err}
		}
		return nil
	}
	if c.installRoot == "" {
		return nil
	}
	if absent, why := Absent(c.installRoot); absent {
		return &NotInstalledError{Socket: c.socket, Reason: why, Err: err}
	}
	return nil
}
