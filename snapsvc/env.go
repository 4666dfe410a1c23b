package snapsvc

import (
	"path/filepath"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Environment variables that point a client at another snapd than the
// system's, such as cmd/fakesnapd, without code: every Client New builds
// (and so every snapservices handle, and the snapsvc CLI) reads them for
// the paths no option set. WithSocket, WithSnapSocket and WithSnapdRoot win
// over them.
const (
	// EnvSocket names snapd's main socket (default /run/snapd.socket).
	EnvSocket = "SNAPSVC_SOCKET"
	// EnvSnapSocket names the socket snapctl requests go to (default
	// /run/snapd-snap.socket).
	EnvSnapSocket = "SNAPSVC_SNAP_SOCKET"
	// EnvRoot is the root directory snap's own client honours for tests
	// (snapd's dirs.SetRootDir reads SNAPPY_GLOBAL_ROOT): the sockets are
	// ROOT/run/snapd.socket and ROOT/run/snapd-snap.socket (unless
	// EnvSocket or EnvSnapSocket name them), and a missing socket is judged
	// against what is installed under ROOT, as WithSnapdRoot(ROOT) does.
	// "fakesnapd --root ROOT" serves exactly that layout.
	EnvRoot = "SNAPPY_GLOBAL_ROOT"
)

// socketDefaults fills the sockets (and the root for the missing-snapd
// check) no option set: from EnvSocket and EnvSnapSocket, then from
// EnvRoot, then snapd's defaults.
func (s *settings) socketDefaults() {
	root := s.env(EnvRoot)
	pick := func(set, env, def string) string {
		switch {
		case set != "":
			return set
		case s.env(env) != "":
			return s.env(env)
		case root != "":
			return filepath.Join(root, def)
		}
		return def
	}
	s.socket = pick(s.socket, EnvSocket, snapd.DefaultSocket)
	s.snapSocket = pick(s.snapSocket, EnvSnapSocket, snapd.DefaultSnapSocket)
	if root != "" && !s.snapdRootSet {
		s.snapdRoot, s.snapdRootSet = root, true
	}
}
