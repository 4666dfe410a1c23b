package fake

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"

	"golang.org/x/sys/unix"
)

// Who may do what, as snapd decides it from the caller's peer credentials
// (daemon/access.go, daemon/daemon.go Command.ServeHTTP): snapd reads the
// uid of the process at the other end of the Unix socket (SO_PEERCRED) and
// checks it against the route's access level after the method check and
// the socket check, before the handler runs:
//
//   - openAccess (and interfaceOpenAccess on snapd.socket): anyone. GET
//     /v2/apps, /v2/changes, /v2/changes/{id}, /v2/notices, /v2/snaps,
//     /v2/snaps/{name}, /v2/find, /v2/warnings, /v2/system-info.
//   - authenticatedAccess (interfaceAuthenticatedAccess on snapd.socket):
//     root, a user logged in with a macaroon, or one polkit authorises;
//     anyone else gets Unauthorized("access denied"): 401, kind
//     login-required. POST /v2/apps, POST /v2/changes/{id} (abort), GET
//     /v2/logs, GET and PUT /v2/snaps/{name}/conf, POST /v2/warnings, POST
//     /v2/snaps and /v2/snaps/{name}.
//   - snapAccess: anyone on snapd-snap.socket (POST /v2/snapctl); the
//     command itself then refuses a caller who is not root unless it is
//     one of ctlcmd's nonRootAllowed (snapctlAllowed).
//
// Every version the fake imitates answers a refused caller the same body:
// 2.57.6 checked POST /v2/apps and /v2/snaps/{name}/conf without a polkit
// action (authenticatedAccess{}), later releases ask polkit
// (polkitActionManage, polkitActionManageConfiguration) and 2.77 also lets
// a snap plugging ros-snapd-support in on the snap socket, but polkit
// failing or saying no ends in the same Unauthorized("access denied").
// daemon/errors.go makeErrorResponder gives 401 and 403 the kind
// login-required; the access check's answer is served as it is, without
// "maintenance" or warning counts.
//
// Not modelled: polkit (no authorisation agent: every non-root caller is
// refused, where snapd may let a user polkit authorises in, or answer 403
// auth-cancelled "cancelled" when the user dismisses the prompt) and
// logged-in users (an Authorization header is ignored).

// peerKey is the request context key of the caller's credentials.
type peerKey struct{}

// peer is a connection's peer credentials (SO_PEERCRED). ok is false when
// they could not be read.
type peer struct {
	uid, pid int
	ok       bool
}

// connContext stores the peer credentials of a new connection in its
// context (http.Server.ConnContext).
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, peerKey{}, peerOf(c))
}

// peerOf reads SO_PEERCRED: the credentials the connecting process had
// when it called connect(2).
func peerOf(c net.Conn) peer {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peer{}
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peer{}
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return peer{}
	}
	return peer{uid: int(cred.Uid), pid: int(cred.Pid), ok: true}
}

// callerOf is the credentials of the request's caller, as the fake judges
// them: the peer's, or the test override (withPeerUID).
func (s *Server) callerOf(r *http.Request) peer {
	p, _ := r.Context().Value(peerKey{}).(peer)
	if s.cfg.peerUID != nil {
		p.uid, p.ok = *s.cfg.peerUID, true
	}
	return p
}

// requireAuthenticated is authenticatedAccess's check on snapd.socket (the
// socket is checked before): nil for root, or for anyone with AllowNonRoot.
func (s *Server) requireAuthenticated(r *http.Request) *response {
	p := s.callerOf(r)
	switch {
	case !p.ok:
		// daemon/access.go requireSockets: no ucred, no access.
		return forbidden("access denied")
	case p.uid == 0 || s.cfg.allowNonRoot:
		return nil
	}
	return unauthorized("access denied")
}

// snapctlAllowed mirrors overlord/hookstate/ctlcmd isAllowedToRun: root
// may run every command; anyone else only those in nonRootAllowed (as
// first argument) or asking for help (-h/--help anywhere; from 2.64 not
// after a "--").
func (v Version) snapctlAllowed(uid int, args []string) bool {
	if uid == 0 {
		return true
	}
	allowed := []string{"get", "services", "set-health", "is-connected", "system-mode", "model"}
	// added to nonRootAllowed in 2.73 (version), 2.74 (refresh), 2.76
	// (is-ready) and 2.77 (tasks, change)
	for _, add := range []struct {
		since Version
		cmds  []string
	}{{"2.73", []string{"version"}}, {"2.74", []string{"refresh"}}, {"2.76", []string{"is-ready"}}, {"2.77", []string{"tasks", "change"}}} {
		if v.atLeast(add.since) {
			allowed = append(allowed, add.cmds...)
		}
	}
	for i, a := range args {
		if i == 0 && slices.Contains(allowed, a) {
			return true
		}
		if a == "-h" || a == "--help" {
			return true
		}
		if a == "--" && v.atLeast("2.64") {
			break
		}
	}
	return false
}

// snapctlForbidden is ctlcmd's ForbiddenCommandError, which
// daemon/api_snapctl.go answers with Forbidden: 403 login-required.
func snapctlForbidden(cmd string, uid int) *response {
	return errResp(403, "login-required", nil, "%s", fmt.Sprintf("cannot use %q with uid %d, try with sudo", cmd, uid))
}
