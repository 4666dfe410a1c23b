package snapsvc

import "github.com/snapsvc/snapsvc/internal/snapd"

// ErrSnapdNotInstalled matches, with errors.Is, an operation that failed
// at once because snapd's socket does not exist and nothing on the system
// would create it: neither snapd's daemon (/usr/lib/snapd/snapd,
// /usr/libexec/snapd/snapd) nor its snapd.socket unit exists, or systemd,
// which listens on snapd.socket, is not running (no /run/systemd/system).
// It is not retryable. A socket that is missing while snapd is installed
// and systemd runs (snapd restarting, a refresh of the snapd snap) is
// waited for within the policy, as before.
//
// The check applies to the default sockets (/run/snapd.socket,
// /run/snapd-snap.socket) and to any socket when WithSnapdRoot is given.
// A snapd started by hand without systemd is judged absent while its
// socket is missing. A socket under $SNAPPY_GLOBAL_ROOT (EnvRoot) is
// judged by its directory instead: snapd is absent when that is missing
// too, and a socket missing from a directory that exists is waited for.
var ErrSnapdNotInstalled = snapd.ErrNotInstalled

// NotInstalledError is the error behind ErrSnapdNotInstalled: Socket,
// Reason (what is missing) and the dial error.
type NotInstalledError = snapd.NotInstalledError

// WithSnapdRoot checks for an installed snapd under root instead of "/"
// when a socket is missing, for every socket the client dials, default or
// not (tests give a temporary directory; "" turns the check off).
func WithSnapdRoot(root string) Option {
	return func(s *settings) { s.snapdRoot, s.snapdRootSet = root, true }
}

// checkInstalled turns on the missing-snapd check of the client's sockets.
func checkInstalled(c *Client, s *settings) {
	for _, sc := range []*snapd.Client{c.main, c.ctl} {
		switch {
		case sc == nil:
		case s.snapdRootSet:
			sc.CheckInstalled(s.snapdRoot)
		case sc.Socket() == snapd.DefaultSocket || sc.Socket() == snapd.DefaultSnapSocket:
			sc.CheckInstalled("/")
		case s.underEnvRoot(sc.Socket()):
			// A fake's or a container's snapd: nothing need be installed
			// under the root (a restart there was told "not installed").
			sc.CheckServed()
		}
	}
}
