package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
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
	mode      Mode
	main      *snapd.Client // /v2/apps, changes, notices
	ctl       *snapd.Client // /v2/snapctl (ModeSnapctl only)
	cookie    string
	ownSnap   string // inside a snap: the snap's instance name
	hook      string
	logger    *slog.Logger
	ctxLogger func(context.Context) *slog.Logger // WithContextLogger
	policy    retry.Policy
	clock     retry.Clock
	poll      time.Duration
	lockDirs  *lockDirs       // where each snap's lock directory is (lockdir.go); none: no cross-process lock
	machine   machine         // what the machine's processes share there (machinewait.go)
	instance  string          // identifies the snapd (for the lock registry)
	snaps     processSnaps    // this process's registry of the snapd's snaps (lock.go)
	interval  restartInterval // WithMinRestartInterval (lock.go)
	events    events          // WithObserver (reporting.go)
	state     *dirWatch       // snapd's state file (WithStateFile); nil: none
	budget    *budgetRunner   // WithRestartBudget; nil: none
	timings   ownTimings      // owntiming.go
	view      snapdView       // what snapd has told the Client (snapdview.go)
	clockKey  string          // processwait.go: "real", or unique to a Client built WithClock
	bg        *background     // work owed after calls returned; ended by Close
	intents   bool            // WithIntents (intent.go)
	startup   *replayRun      // WithIntents: the replay New began (replay.go)
}

// New builds a Client. It sends no request (but, with WithIntents, the
// replay of what a dead process left, in the background).
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
		s.poll = defaultPollInterval
	}
	c := &Client{
		mode:      mode,
		main:      snapd.New(s.socket),
		cookie:    s.cookie,
		ownSnap:   s.snapName,
		hook:      s.hook,
		logger:    s.logger,
		ctxLogger: s.ctxLogger,
		policy:    policy,
		clock:     policy.Clock,
		poll:      s.poll,
		budget:    s.budget,
		bg:        newBackground(),
	}
	c.view.clock.wall = s.wall
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
	c.snaps = processSnaps{instance: c.instance}
	c.interval = restartInterval{snaps: c.snaps, min: s.minRestart, clock: c.clock}
	c.events = events{observer: s.observer, clock: c.clock}
	switch {
	case s.noFileLock:
		c.lockDirs = &lockDirs{}
	case s.lockDirSet:
		c.lockDirs = &lockDirs{fixed: s.lockDir}
	default:
		c.lockDirs = defaultLockDirs(c.actingSocket(), s.env)
	}
	c.machine = newMachine(c.lockDirs, c.hook, c.clockKey == "real")
	if s.intents {
		if c.lockDirs.none() {
			return nil, errors.New("snapsvc: WithIntents needs a lock directory, where intents are recorded: it cannot be used with WithoutFileLock")
		}
		c.intents = true
		c.startReplay()
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

// Close releases idle connections (and, with WithRestartBudget, the
// slots the Client still holds), ends the state file's watch and the
// background look-ups the Client owns, and waits for them. It is safe
// concurrently with every call: a call racing it, or made after it, still
// works, but keeps no connection or watch open once it returns.
func (c *Client) Close() error {
	c.bg.stop() // the background look-ups end at once; budget holds and releases, below
	if c.budget != nil {
		c.budget.close()
	}
	c.bg.close()
	c.main.Close()
	if c.ctl != nil {
		c.ctl.Close()
	}
	c.state.close()
	c.machine.close()
	return nil
}

// ctxErr wraps a context's end with what was being waited for.
func ctxErr(ctx context.Context, what string) error {
	return fmt.Errorf("%s: %w", what, context.Cause(ctx))
}
