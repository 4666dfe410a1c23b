package snapsvc

import (
	"os"
	"path/filepath"
	"strings"

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
	// EnvSocket or EnvSnapSocket name them). Nothing need be installed
	// under ROOT ("fakesnapd --root ROOT" serves exactly that layout), so
	// a missing socket there is judged by its directory: a socket missing
	// from ROOT/run is a snapd restarting, waited for as on a real system;
	// with no ROOT/run at all no snapd is there (ErrSnapdNotInstalled).
	// WithSnapdRoot(ROOT) judges by what is installed under ROOT instead.
	EnvRoot = "SNAPPY_GLOBAL_ROOT"
)

// SocketsFromEnv returns the sockets a Client built without WithSocket or
// WithSnapSocket dials, as getenv (nil: os.Getenv) gives the environment:
// EnvSocket and EnvSnapSocket, then the sockets under EnvRoot, then
// snapd's defaults. A program that reports where it looks for snapd (the
// snapsvc command's version) says it from here, so it never disagrees
// with the Client.
func SocketsFromEnv(getenv func(string) string) (socket, snapSocket string) {
	if getenv == nil {
		getenv = os.Getenv
	}
	s := settings{env: getenv}
	s.socketDefaults()
	return s.socket, s.snapSocket
}

// socketDefaults fills the sockets no option set: from EnvSocket and
// EnvSnapSocket, then from EnvRoot, then snapd's defaults.
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
}

// underEnvRoot reports whether socket is in the directory tree of EnvRoot.
func (s *settings) underEnvRoot(socket string) bool {
	root := s.env(EnvRoot)
	if root == "" {
		return false
	}
	rel, err := filepath.Rel(root, socket)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}
