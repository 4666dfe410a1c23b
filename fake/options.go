package fake

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// App describes one app of a snap in the fake, as snap.yaml would.
type App struct {
	// Name is the app name (the part after "snap.").
	Name string
	// Daemon is the daemon type: "simple", "forking", "oneshot", "notify",
	// "dbus". Empty means the app is not a service.
	Daemon string
	// DaemonScope is "system" (the default for daemons) or "user".
	DaemonScope string
	// Enabled and Active are the service's initial state.
	Enabled, Active bool
	// Before and After order services within one request, as in snap.yaml.
	Before, After []string
	// StartDuration and StopDuration are how long "systemctl start/stop"
	// takes, measured on the fake's Clock. Zero is instantaneous.
	StartDuration, StopDuration time.Duration
	// FailStart, when non-empty, makes starting the service fail; it is
	// systemctl's stderr text (see SystemctlJobFailed for the usual one).
	FailStart string
	// DiesAfterStart makes the service's process exit as soon as it has
	// started: systemctl start succeeds (a simple daemon is started once
	// its process runs), so the change that started it ends Done, but the
	// service is inactive right after. A service that never becomes ready.
	DiesAfterStart bool
}

// Snap describes an installed snap.
type Snap struct {
	// Name is the snap's instance name.
	Name string
	// Apps are its apps, services or not.
	Apps []App
	// Cookie is the snap's ephemeral context id (what snap-confine puts in
	// SNAP_COOKIE). Empty derives one from the name; see Server.Cookie.
	Cookie string

	// Version, Revision, Summary, Description, Base, Confinement, Grade,
	// Type, TrackingChannel and License are what GET /v2/snaps serves (snap list,
	// snap info). Defaults: version "1", revision "x1" (a sideloaded
	// snap), confinement "strict", grade "stable", type "app".
	Version, Revision, Summary, Description string
	Base, Confinement, Grade, Type          string
	TrackingChannel, License                string

	// Hooks are the snap's hooks (snap.yaml "hooks:" or meta/hooks/). A
	// snap without "configure" makes PUT /v2/snaps/{name}/conf fail as
	// snapd does: the change ends in Error with `snap "x" has no
	// "configure" hook`.
	Hooks []string
	// ConfigureHookDuration is how long the configure hook that PUT
	// /v2/snaps/{name}/conf runs takes, on the fake's Clock. A negative
	// duration holds the configure-snap change until the test finishes
	// it (Change.Finish/Fail).
	ConfigureHookDuration time.Duration
	// ConfigureHookSleepKey, when set, names a configuration key whose
	// integer value (after the patch) is the hook's duration in seconds,
	// as the integration suite's svcdemo hook sleeps $(snapctl get
	// hook-sleep); it overrides ConfigureHookDuration when the key is set.
	ConfigureHookSleepKey string
	// Config is the snap's initial configuration (nested maps for dotted
	// keys: {"a": {"b": 1}} is a.b=1).
	Config map[string]any
}

// hasHook reports whether the snap declares hook.
func (sn Snap) hasHook(hook string) bool {
	for _, h := range sn.Hooks {
		if h == hook {
			return true
		}
	}
	return false
}

// SystemctlJobFailed returns the stderr text systemctl prints when a
// service's start job fails, e.g. for FailStart.
func SystemctlJobFailed(snap, app string) string {
	unit := "snap." + snap + "." + app + ".service"
	return "Job for " + unit + " failed because the control process exited with error code.\n" +
		"See \"systemctl status " + unit + "\" and \"journalctl -xeu " + unit + "\" for details.\n"
}

// Version selects which snapd release the fake imitates. It is a version
// string; behaviour switches at the releases that changed the wire protocol.
type Version string

// Version profiles. The ones with a patch level were captured from a real
// snapd (see testsupport/conformance/testdata and fake/testdata).
const (
	// Version257 is snapd 2.57.6 (Debian 12): no notices API (404 "not
	// found"), snapctl errors prefixed "error running snapctl: ", tasks
	// without "data".
	Version257 Version = "2.57.6"
	// Version262 is the first release with the notices API and
	// change-update notices.
	Version262 Version = "2.62"
	// Version268 is snapd 2.68.3 (Debian 13): tasks carry
	// data.affected-snaps.
	Version268 Version = "2.68.3"
	// Version270 is the first release whose snapctl errors are prefixed
	// "snapctl: " (canonical/snapd commit fe184bf2aa08).
	Version270 Version = "2.70"
	// Version277 is snapd 2.77.1 (Debian sid), the newest captured.
	Version277 Version = "2.77.1"
)

// atLeast reports whether v is the same release as or newer than o.
func (v Version) atLeast(o Version) bool {
	a, b := parseVersion(string(v)), parseVersion(string(o))
	for i := 0; i < 3; i++ {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}

func parseVersion(s string) [3]int {
	var out [3]int
	s, _, _ = strings.Cut(s, "-")
	s, _, _ = strings.Cut(s, "+")
	for i, p := range strings.SplitN(s, ".", 3) {
		n, _ := strconv.Atoi(p)
		out[i] = n
	}
	return out
}

// logsRefuseNonPositive: from 2.73 GET /v2/logs refuses n <= 0 other
// than -1 ("all"): canonical/snapd 337d069c7a, "daemon: reject
// /v2/logs?n=N where N <= 0, except -1".
func (v Version) logsRefuseNonPositive() bool { return v.atLeast("2.73") }

// hasNotices: the notices API and change-update notices came with 2.62.
func (v Version) hasNotices() bool { return v.atLeast(Version262) }

// snapctlPrefix: daemon/api_snapctl.go wraps errors with "error running
// snapctl: " until 2.70 and with "snapctl: " from 2.70 on.
func (v Version) snapctlPrefix() string {
	if v.atLeast(Version270) {
		return "snapctl: "
	}
	return "error running snapctl: "
}

// taskData: 2.57.6 serves tasks without "data"; 2.68.3 and 2.77.1 add
// data.affected-snaps. The exact release in between is not pinned down
// (golden data exists only for these three); 2.68 is used as the switch.
func (v Version) taskData() bool { return v.atLeast(Version268) }

// systemctlStderrPrefix: 2.68.3 and 2.77.1 format a failed systemctl call
// as "...: stderr:\n<text>" without the trailing newline, 2.57.6 as
// "...: <text>" (integration/testdata/captured/*/change-start-broken.json).
// The release that changed it lies between 2.57.6 and 2.68.3 and is not
// pinned down; 2.68 is used as the switch.
func (v Version) systemctlStderrPrefix() bool { return v.atLeast(Version268) }

// unknownCommandList is the go-flags list in "Unknown command" errors.
// 2.68.3 added install and remove to 2.57.6's list (the release in between
// that did is not pinned down; 2.68 is used as the switch).
func (v Version) unknownCommandList() string {
	switch {
	case v.atLeast(Version270):
		// captured from 2.77.1 (testdata/snapd-golden/2.77.1/snapctl-unknown-cmd.json)
		return "change, fde-setup-request, fde-setup-result, get, install, is-connected, is-ready, kmod, model, mount, reboot, remove, restart, services, set, set-health, start, stop, system-mode, tasks, umount, unset or version"
	case v.atLeast(Version268):
		// captured from 2.68.3 (integration/testdata/captured/2.68.3/snapctl-unknown-cmd.json)
		return "fde-setup-request, fde-setup-result, get, install, is-connected, kmod, model, mount, reboot, remove, restart, services, set, set-health, start, stop, system-mode, umount or unset"
	}
	// captured from 2.57.6
	return "fde-setup-request, fde-setup-result, get, is-connected, kmod, model, mount, reboot, restart, services, set, set-health, start, stop, system-mode, umount or unset"
}

// observeDeniedMessage is the 403 message for a non-snap caller reading
// changes or notices on the snap socket: 2.57.6 answers "access denied"
// (no snap-refresh-observe check), 2.68.3 "could not determine snap name
// for pid: ..." (integration/testdata/captured/*/changes-snap-socket.json).
// The release that changed it lies between 2.57.6 and 2.68.3 and is not
// pinned down; 2.68 is used as the switch.
func (v Version) observeDeniedMessage(pid int) string {
	if v.atLeast(Version268) {
		return fmt.Sprintf("could not determine snap name for pid: cannot find a snap for pid %d", pid)
	}
	return "access denied"
}

type config struct {
	snaps            []Snap
	version          Version
	clock            Clock
	conflictAs409    bool
	dir              string
	snapctlTimeout   time.Duration
	notListening     bool
	snapSocketDenied bool
	noRefreshObserve bool
	stateFile        bool
	store            []storeEntry
	allowNonRoot     bool
	peerUID          *int // tests: the uid every caller is taken to have
}

// Option configures a Server.
type Option func(*config)

// WithSnaps installs snaps in the fake.
func WithSnaps(s ...Snap) Option { return func(c *config) { c.snaps = append(c.snaps, s...) } }

// WithVersion selects the snapd release to imitate (default Version277).
func WithVersion(v Version) Option { return func(c *config) { c.version = v } }

// WithClock sets the clock (default RealClock()).
func WithClock(cl Clock) Option { return func(c *config) { c.clock = cl } }

// WithConflictAs409 makes POST /v2/apps answer conflicts as 409
// snap-change-conflict (as other snapd endpoints do) instead of snapd's real
// 400 without kind.
func WithConflictAs409() Option { return func(c *config) { c.conflictAs409 = true } }

// WithDir puts the sockets in dir instead of a fresh temporary directory.
func WithDir(dir string) Option { return func(c *config) { c.dir = dir } }

// WithSnapctlTimeout sets how long snapctl start/stop/restart waits for its
// change before answering "<action> command is taking too long" (default
// 2m30s, half of snapd's default configure hook timeout).
func WithSnapctlTimeout(d time.Duration) Option {
	return func(c *config) { c.snapctlTimeout = d }
}

// WithoutListening starts the server with no sockets; StartListening creates
// them (a socket that appears late, e.g. snapd still starting at boot).
func WithoutListening() Option { return func(c *config) { c.notListening = true } }

// WithSnapSocketObserveDenied makes GET /v2/changes and /v2/notices on the
// snap socket answer 403 login-required, as real snapd does for a caller it
// cannot map to a snap with snap-refresh-observe (message "access denied"
// before Version268, "could not determine snap name for pid: ..." from it on). By default the fake lets
// the snap socket read them (as if the caller plugged snap-refresh-observe).
func WithSnapSocketObserveDenied() Option { return func(c *config) { c.snapSocketDenied = true } }

// WithoutRefreshObserve makes the snap socket refuse change and notice
// reads (GET /v2/changes, /v2/changes/{id}, /v2/notices, /v2/snaps) as
// snapd refuses a snap whose snap-refresh-observe plug is not connected:
// 403 {"message":"access denied","kind":"login-required"} on every
// version (daemon/access.go requireInterfaceApiAccess: the caller's snap
// has no matching connection). Service commands through snapctl still
// work, and a client can only retry them blind.
func WithoutRefreshObserve() Option { return func(c *config) { c.noRefreshObserve = true } }

// AllowNonRoot lets a caller who is not root do what snapd lets only root
// do (or a user polkit authorises, or one logged in to the store; the fake
// models neither): POST /v2/apps (start, stop, restart), POST
// /v2/changes/{id} (abort), GET /v2/logs, GET and PUT
// /v2/snaps/{name}/conf, POST /v2/warnings, and snapctl's start, stop,
// restart, set and unset. Without it the fake reads each caller's uid from
// the socket (SO_PEERCRED) and refuses one who is not root as snapd does:
// 401 {"message":"access denied","kind":"login-required"} (snapctl: 403
// "cannot use \"restart\" with uid 1000, try with sudo"), which the snap
// client prints as "access denied (try with sudo)".
//
// Use it where the code under test runs as root in production (a daemon,
// a snap's hook, a command run with sudo) but the tests run as you: go
// test run by a user who is not root. Leave it out to see what that user
// would meet.
func AllowNonRoot() Option { return func(c *config) { c.allowNonRoot = true } }
