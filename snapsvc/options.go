package snapsvc

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// Option configures a Client.
type Option func(*settings)

type settings struct {
	socket, snapSocket string
	socketSet          bool
	mode               Mode
	cookie             string
	cookieSet          bool
	snapName           string
	hook               string
	hookSet            bool
	logger             *slog.Logger
	ctxLogger          func(context.Context) *slog.Logger
	policy             *retry.Policy
	clock              retry.Clock
	poll               time.Duration
	lockDir            string
	lockDirSet         bool
	noFileLock         bool
	env                func(string) string
	minRestart         time.Duration
	observer           func(Event)
	stateFile          string
	stateFileSet       bool
	budget             *budgetRunner
	transport          func(http.RoundTripper) http.RoundTripper
	snapdRoot          string // WithSnapdRoot (installed.go)
	snapdRootSet       bool
	wall               func(time.Time) time.Time // the machine's wall clock at a reading (tests: export_test.go)
	intents            bool                      // WithIntents (intent.go)
}

// WithSocket sets snapd's main socket (default $SNAPSVC_SOCKET, then
// $SNAPPY_GLOBAL_ROOT/run/snapd.socket, then /run/snapd.socket).
func WithSocket(path string) Option {
	return func(s *settings) { s.socket, s.socketSet = path, true }
}

// WithSnapSocket sets the socket snapctl requests go to (default
// $SNAPSVC_SNAP_SOCKET, then $SNAPPY_GLOBAL_ROOT/run/snapd-snap.socket,
// then /run/snapd-snap.socket).
func WithSnapSocket(path string) Option { return func(s *settings) { s.snapSocket = path } }

// WithMode forces ModeREST or ModeSnapctl instead of detecting it.
func WithMode(m Mode) Option { return func(s *settings) { s.mode = m } }

// WithCookie sets the snapctl context id (default $SNAP_COOKIE, then
// $SNAP_CONTEXT). Setting it implies ModeSnapctl under ModeAuto.
func WithCookie(id string) Option {
	return func(s *settings) { s.cookie, s.cookieSet = id, true }
}

// WithSnap names the snap the client runs inside (default
// $SNAP_INSTANCE_NAME, then $SNAP_NAME). In ModeSnapctl, names of other
// snaps are refused before any request.
func WithSnap(name string) Option { return func(s *settings) { s.snapName = name } }

// WithHook tells the client it runs inside the named hook (for example
// "configure"). Inside "configure" and "default-configure" snapd only
// queues service commands until the hook ends, so operations return a
// queued Result at once instead of waiting (waiting would deadlock).
// By default the hook is detected from the environment where possible.
func WithHook(name string) Option {
	return func(s *settings) { s.hook, s.hookSet = name, true }
}

// WithLogger sets the logger (default: discard). Each line names the snap,
// action, change id and attempt. A logger carried by a call's context
// (ContextWithLogger, WithContextLogger) is used instead for that call.
func WithLogger(l *slog.Logger) Option { return func(s *settings) { s.logger = l } }

// WithPolicy sets the retry policy (default retry.DefaultPolicy()). New
// fails on a policy retry.Policy.Validate rejects.
func WithPolicy(p retry.Policy) Option { return func(s *settings) { s.policy = &p } }

// WithClock sets the clock used for pauses and polling (tests).
func WithClock(c retry.Clock) Option { return func(s *settings) { s.clock = c } }

// WithPollInterval sets how often, at most, a change is polled when snapd
// has no notices API (snapd < 2.62); default 100ms, like the snap command.
// A wait polls faster at first, when most service changes end: every 20ms
// for its first 100ms, every 50ms until 1s, then at this interval (never
// slower than it). Where snapd's state file is watched (WithStateFile) a
// wait reads the changes when snapd rewrites it instead, and otherwise
// only every 500ms, or at this interval if it is longer, as a safety net.
func WithPollInterval(d time.Duration) Option { return func(s *settings) { s.poll = d } }

// WithLockDir sets the directory of the cross-process lock files. The
// default is /run/snapsvc outside a snap (for root; other users get one
// in the temporary directory), $SNAP_COMMON/.snapsvc-lock inside one, and
// a directory beside the socket for a non-default socket (so tests against
// a fake never share locks with the system).
func WithLockDir(dir string) Option {
	return func(s *settings) { s.lockDir, s.lockDirSet = dir, true }
}

// WithoutFileLock disables the cross-process lock; the in-process lock
// and conflict retries remain.
func WithoutFileLock() Option { return func(s *settings) { s.noFileLock = true } }

// WithMinRestartInterval sets the least time between two restarts of the
// same service made through this process (default 0: no limit). It keeps
// bursts of restarts from tripping systemd's start limit.
func WithMinRestartInterval(d time.Duration) Option {
	return func(s *settings) { s.minRestart = d }
}

// withEnv replaces os.Getenv (tests).
func withEnv(f func(string) string) Option { return func(s *settings) { s.env = f } }
