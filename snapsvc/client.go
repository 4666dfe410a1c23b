package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// Mode selects how the client asks snapd to act on services.
type Mode int

const (
	// ModeAuto, the default, uses ModeSnapctl inside a snap (SNAP_COOKIE
	// or SNAP_CONTEXT set, or WithCookie given) and ModeREST outside. Every
	// process snapd starts for a snap has SNAP_COOKIE, classic daemons
	// included, so a daemon that drives its services the way the snap
	// command does (REST on /run/snapd.socket) must ask for ModeREST.
	ModeAuto Mode = iota
	// ModeREST posts to /v2/apps on snapd's main socket (root, or a snap
	// with snapd-control, or a classic snap).
	ModeREST
	// ModeSnapctl runs snapctl through POST /v2/snapctl on the snap socket
	// with the snap's (or the hook's) cookie.
	ModeSnapctl
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeREST:
		return "rest"
	case ModeSnapctl:
		return "snapctl"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Client starts, stops and restarts snap services through snapd, waiting
// for the changes it makes and absorbing change conflicts. A Client is safe
// for concurrent use. Every Client in a process that reaches the same snapd
// shares one lock per snap, so operations of separately built clients never
// conflict with each other.
type Client struct {
	mode       Mode
	main       *snapd.Client // /v2/apps, changes, notices
	ctl        *snapd.Client // /v2/snapctl (ModeSnapctl only)
	cookie     string
	ownSnap    string // inside a snap: the snap's instance name
	hook       string
	logger     *slog.Logger
	ctxLogger  func(context.Context) *slog.Logger // WithContextLogger
	policy     retry.Policy
	clock      retry.Clock
	poll       time.Duration
	lockDir    string // "" disables the cross-process lock
	instance   string // identifies the snapd (for the lock registry)
	notices    atomic.Int32
	minRestart time.Duration
	observer   func(Event)
	state      *stateWatch   // snapd's state file (WithStateFile); nil: none
	budget     *budgetRunner // WithRestartBudget; nil: none
	blind      blindState    // cadence.go
	pace       paceState     // owncursor.go
	seenID     atomic.Int64  // the highest change id snapd reported (find.go)
	clockKey   string        // watcher.go: "real", or unique to a Client built WithClock
	bg         *background   // work owed after calls returned; ended by Close
}

// notice support states.
const (
	noticesUnknown int32 = iota
	noticesYes
	noticesNo
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

// New builds a Client. It sends no request.
//
// The mode defaults to ModeAuto: snapctl inside a snap, REST outside.
// snapctl is the default inside because it is the one path every snap
// has: a strictly confined snap cannot reach /run/snapd.socket's
// /v2/apps without snapd-control, and only snapctl carries a hook's
// context, so that snapd queues a configure hook's commands instead of
// refusing them as a conflict with the hook's own change. Its costs: it
// controls only the calling snap's services, snapd answers start, stop
// and restart only once their change is ready (overlord/hookstate/ctlcmd;
// the Async forms then return when the change is done), and reading
// changes and notices needs snap-refresh-observe. A classic or root daemon
// that runs the snap command today (k8sd is one) should pass
// WithMode(ModeREST), or use package snapservices, whose default is REST:
// SNAP_COOKIE is set in every process of a snap, daemons included, so
// ModeAuto would switch it to snapctl.
func New(opts ...Option) (*Client, error) {
	s := settings{env: os.Getenv}
	for _, o := range opts {
		o(&s)
	}
	if !s.cookieSet {
		s.cookie = s.env("SNAP_COOKIE")
		if s.cookie == "" {
			s.cookie = s.env("SNAP_CONTEXT")
		}
	}
	if s.snapName == "" {
		s.snapName = s.env("SNAP_INSTANCE_NAME")
		if s.snapName == "" {
			s.snapName = s.env("SNAP_NAME")
		}
	}
	if !s.hookSet {
		s.hook = detectHook(s.env)
	}
	mode := s.mode
	if mode == ModeAuto {
		mode = ModeREST
		if s.cookie != "" {
			mode = ModeSnapctl
		}
	}
	if mode == ModeSnapctl && s.cookie == "" {
		return nil, errors.New("snapsvc: snapctl mode needs a cookie: set SNAP_COOKIE or use WithCookie")
	}
	s.socketDefaults() // env.go: SNAPSVC_SOCKET, SNAPSVC_SNAP_SOCKET, SNAPPY_GLOBAL_ROOT
	if s.logger == nil {
		s.logger = slog.New(discardHandler{})
	}
	policy := retry.DefaultPolicy()
	if s.policy != nil {
		if err := s.policy.Validate(); err != nil {
			return nil, fmt.Errorf("snapsvc: WithPolicy: %w", err)
		}
		policy = *s.policy
	}
	if s.clock != nil {
		policy.Clock = s.clock
	}
	if policy.Clock == nil {
		policy.Clock = retry.RealClock()
	}
	if s.poll <= 0 {
		s.poll = 100 * time.Millisecond
	}
	c := &Client{
		mode:       mode,
		main:       snapd.New(s.socket),
		cookie:     s.cookie,
		ownSnap:    s.snapName,
		hook:       s.hook,
		logger:     s.logger,
		ctxLogger:  s.ctxLogger,
		policy:     policy,
		clock:      policy.Clock,
		poll:       s.poll,
		minRestart: s.minRestart,
		observer:   s.observer,
		budget:     s.budget,
		bg:         newBackground(),
	}
	if c.budget != nil {
		c.budget.init(c)
	}
	if !s.stateFileSet && s.socket == snapd.DefaultSocket && mode == ModeREST {
		s.stateFile = DefaultStateFile
	}
	c.state = newStateWatch(s.stateFile)
	c.clockKey = "real"
	if s.clock != nil || (s.policy != nil && s.policy.Clock != nil) {
		c.clockKey = fmt.Sprintf("clock%d", clockKeys.Add(1))
	}
	// In snapctl mode changes and notices are read on the snap socket
	// (snapd allows that to snaps with snap-refresh-observe connected,
	// daemon/api_general.go), unless WithSocket named a main socket the
	// snap can reach (a classic snap, or one with snapd-control).
	if mode == ModeSnapctl {
		c.ctl = snapd.New(s.snapSocket)
		if !s.socketSet {
			c.main = c.ctl
		}
	}
	s.wrapTransports(c) // WithTransport
	checkInstalled(c, &s)
	c.instance = instanceKey(c.actingSocket())
	switch {
	case s.noFileLock:
	case s.lockDirSet:
		c.lockDir = s.lockDir
	default:
		c.lockDir = defaultLockDir(c.actingSocket(), s.env)
	}
	return c, nil
}

// actingSocket is the socket the client's actions go to.
func (c *Client) actingSocket() string {
	if c.mode == ModeSnapctl {
		return c.ctl.Socket()
	}
	return c.main.Socket()
}

// Mode returns the mode the client acts in.
func (c *Client) Mode() Mode { return c.mode }

// Hook returns the hook the client believes it runs in ("" for none).
func (c *Client) Hook() string { return c.hook }

// instanceKey identifies a snapd by the directory of its sockets: both
// sockets of one snapd live side by side (/run on a real system, one temp
// directory for a fake), so a REST client and a snapctl client of one
// process share their per-snap locks.
func instanceKey(socket string) string {
	abs, err := filepath.Abs(socket)
	if err != nil {
		abs = socket
	}
	return filepath.Dir(abs)
}

func defaultLockDir(socket string, env func(string) string) string {
	if socket != snapd.DefaultSocket && socket != snapd.DefaultSnapSocket {
		return filepath.Join(instanceKey(socket), ".snapsvc-lock")
	}
	if common := env("SNAP_COMMON"); common != "" && env("SNAP_NAME") != "" {
		return filepath.Join(common, ".snapsvc-lock")
	}
	// Not /run/lock: any user may create entries there (mode 1777), and
	// one who made /run/lock/snapsvc first could lock root out of every
	// operation. /run is root's alone.
	if os.Geteuid() == 0 {
		return "/run/snapsvc"
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("snapsvc-%d", os.Geteuid()))
}

// detectHook finds the hook being run. SNAPSVC_HOOK names it explicitly.
// Otherwise, inside a snap, snapd runs a hook as $SNAP/meta/hooks/NAME
// (snap/hooks/NAME for snapcraft's wrappers), and a hook often runs a
// helper program: the command lines of this process and its nearest
// ancestors are searched for such a path.
func detectHook(env func(string) string) string {
	if h := env("SNAPSVC_HOOK"); h != "" {
		return h
	}
	if env("SNAP_COOKIE") == "" && env("SNAP_CONTEXT") == "" {
		return ""
	}
	if h := hookFromArgs(os.Args); h != "" {
		return h
	}
	pid := os.Getppid()
	for depth := 0; depth < 4 && pid > 1; depth++ {
		if h := hookFromArgs(procCmdline(pid)); h != "" {
			return h
		}
		pid = procParent(pid)
	}
	return ""
}

// hookFromArgs returns NAME when an argument is a path .../hooks/NAME
// below meta/ or snap/.
func hookFromArgs(args []string) string {
	for _, a := range args {
		dir, base := filepath.Split(a)
		dir = filepath.Clean(dir)
		if base != "" && (strings.HasSuffix(dir, "/meta/hooks") || strings.HasSuffix(dir, "/snap/hooks")) {
			return base
		}
	}
	return ""
}

func procCmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// procParent returns the parent pid from /proc/PID/stat (field 4, after
// the parenthesised command name), or 0.
func procParent(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	var state string
	var ppid int
	if _, err := fmt.Sscan(s[i+1:], &state, &ppid); err != nil {
		return 0
	}
	return ppid
}

// queuesInHook reports whether snapd only queues service commands in the
// current hook (ctlcmd queueCommand / queueDefaultConfigureHookCommand).
func (c *Client) queuesInHook() bool {
	return c.mode == ModeSnapctl && (c.hook == "configure" || c.hook == "default-configure")
}

// Close releases idle connections (and, with WithRestartBudget, the
// slots the Client still holds), ends the state file's watch and the
// background look-ups the Client owns, and waits for them. It is safe
// concurrently with every call: a call racing it, or made after it, still
// works, but keeps no connection or watch open once it returns.
func (c *Client) Close() error {
	if c.budget != nil {
		c.budget.close()
	}
	c.bg.close()
	c.main.Close()
	if c.ctl != nil {
		c.ctl.Close()
	}
	c.state.close()
	return nil
}

// ctxErr wraps a context's end with what was being waited for.
func ctxErr(ctx context.Context, what string) error {
	return fmt.Errorf("%s: %w", what, context.Cause(ctx))
}
