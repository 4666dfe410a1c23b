package snapservices

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Snap is a handle for one snap's services. It is safe for concurrent
// use; operations of every Snap and snapsvc.Client of a process on the
// same snap are serialised, so they never conflict with each other.
type Snap struct {
	client   *snapsvc.Client
	owned    bool // built by New, closed by Close
	instance string
	ensure   bool
	plain    bool                                              // WithPlainFlags
	run      func(ctx context.Context, command []string) error // WithCommandRunner
	err      error                                             // Open's setup error, returned by every call
}

var _ Control = (*Snap)(nil)

// Option configures New.
type Option func(*config)

type config struct {
	instance   string
	fallback   string
	plain      bool
	run        func(ctx context.Context, command []string) error
	client     *snapsvc.Client
	clientOpts []snapsvc.Option
	snapctl    bool
	ensure     bool
	env        func(string) string
}

// WithInstance names the snap instance (default $SNAP_INSTANCE_NAME, then
// $SNAP_NAME, then WithDefaultInstance's name). An empty name means the
// default, so a caller can pass on a setting that may be unset.
func WithInstance(name string) Option { return func(c *config) { c.instance = name } }

// WithDefaultInstance names the instance to use when WithInstance gives
// none and neither $SNAP_INSTANCE_NAME nor $SNAP_NAME is set: outside a
// snap, in unit tests. k8sd passes "k8s", the name its own code assumed.
func WithDefaultInstance(name string) Option { return func(c *config) { c.fallback = name } }

// WithPlainFlags gives extraSnapArgs the snap command's own meaning:
// StartServices starts without enabling unless "--enable" is passed, and
// StopServices stops without disabling unless "--disable" is passed. By
// default a Snap keeps k8sd's contract, where StartServices always adds
// "--enable" and StopServices "--disable" (ImplyFlags).
func WithPlainFlags() Option { return func(c *config) { c.plain = true } }

// WithCommandRunner makes the handle hand each checked call, as the snap
// command line k8sd would run (Request.Command: "snap start k8s.kubelet
// --enable"), to run instead of acting through snapd; no client is built.
// It is the test seam for code whose tests assert the command line (k8sd's
// mock.Runner): tests keep passing their runner and assertions unchanged.
func WithCommandRunner(run func(ctx context.Context, command []string) error) Option {
	return func(c *config) { c.run = run }
}

// WithClient makes the handle act through c, in c's mode and with c's
// retry policy, instead of building its own client.
func WithClient(c *snapsvc.Client) Option { return func(cfg *config) { cfg.client = c } }

// WithClientOptions adds options for the client New builds (a socket, a
// logger, a policy in place of retry.NestedPolicy, ...). They apply after
// the handle's own, so they win.
func WithClientOptions(opts ...snapsvc.Option) Option {
	return func(c *config) { c.clientOpts = append(c.clientOpts, opts...) }
}

// WithSnapctl makes the client New builds act through snapctl (with
// $SNAP_COOKIE) instead of REST on /run/snapd.socket: the choice for a
// strictly confined snap or a snap hook. snapd answers snapctl start, stop
// and restart only when their change is ready, so "--no-wait" is refused
// with ErrUnsupportedFlag (except in a configure or default-configure
// hook, where snapd queues the command and answers at once).
func WithSnapctl() Option { return func(c *config) { c.snapctl = true } }

// WithEnsureRunning routes "start --enable" through
// snapsvc.Client.EnsureRunning: the services' state is read first and only
// those not active or not enabled are started and enabled, in one change;
// when all are, no change is made. It is the fix for services a snap
// revert left disabled while running, and makes a start at every daemon
// start cheap. A start without "--enable" is a plain start.
func WithEnsureRunning() Option { return func(c *config) { c.ensure = true } }

// New builds a handle for one snap. Unless WithClient or WithCommandRunner
// is given it builds a snapsvc.Client in REST mode on /run/snapd.socket
// (WithSnapctl for snapctl) with retry.NestedPolicy, since callers of this
// interface keep their own retry loop. It sends no request. The errors it
// returns are the setup's: no instance name, an invalid one, client
// options that do not fit; they wrap ErrSetup.
func New(opts ...Option) (*Snap, error) {
	cfg := config{env: os.Getenv}
	for _, o := range opts {
		o(&cfg)
	}
	return build(cfg)
}

// Open is New for callers that cannot handle an error where they build
// the handle (k8sd's NewSnap returns no error): a setup error is kept and
// returned by every call, as a non-retryable *snapsvc.OpError wrapping
// ErrSetup and the cause; Err reports it at once.
func Open(opts ...Option) *Snap {
	cfg := config{env: os.Getenv}
	for _, o := range opts {
		o(&cfg)
	}
	s, err := build(cfg)
	if err != nil {
		return &Snap{instance: cfg.instance, err: err}
	}
	return s
}

// ErrSetup: the handle could not be set up (see New); retrying the call
// cannot help.
var ErrSetup = errors.New("snapservices: handle not set up")

func build(cfg config) (*Snap, error) {
	for _, name := range []string{cfg.env("SNAP_INSTANCE_NAME"), cfg.env("SNAP_NAME"), cfg.fallback} {
		if cfg.instance == "" {
			cfg.instance = name
		}
	}
	if cfg.instance == "" {
		return nil, fmt.Errorf("%w: no snap instance name: $SNAP_INSTANCE_NAME and $SNAP_NAME are unset (not running inside a snap?); use WithInstance or WithDefaultInstance", ErrSetup)
	}
	if snap, app, err := snapsvc.ValidateName(cfg.instance); err != nil || app != "" || snap != cfg.instance {
		return nil, fmt.Errorf("%w: %w %q: not a snap instance name", ErrSetup, snapsvc.ErrInvalidName, cfg.instance)
	}
	s := &Snap{client: cfg.client, instance: cfg.instance, ensure: cfg.ensure, plain: cfg.plain, run: cfg.run}
	if s.client == nil && s.run == nil {
		mode := snapsvc.ModeREST
		if cfg.snapctl {
			mode = snapsvc.ModeSnapctl
		}
		base := []snapsvc.Option{snapsvc.WithMode(mode), snapsvc.WithSnap(cfg.instance), snapsvc.WithPolicy(retry.NestedPolicy())}
		c, err := snapsvc.New(append(base, cfg.clientOpts...)...)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		s.client, s.owned = c, true
	}
	return s, nil
}

// Err returns the setup error Open kept, or nil.
func (s *Snap) Err() error { return s.err }

// Instance returns the snap instance the handle controls.
func (s *Snap) Instance() string { return s.instance }

// Client returns the client the handle acts through (nil with
// WithCommandRunner, or after a setup error).
func (s *Snap) Client() *snapsvc.Client { return s.client }

// Close releases the idle connections of a client New built; a client
// given with WithClient is left alone.
func (s *Snap) Close() error {
	if s.owned && s.client != nil {
		return s.client.Close()
	}
	return nil
}

// StartServices starts and enables the snap's services, like "snap start
// --enable [--no-wait] <instance>.<service>..." (k8sd's contract; with
// WithPlainFlags it enables only when "--enable" is passed). It returns
// once the change is done (or, with --no-wait, accepted).
func (s *Snap) StartServices(ctx context.Context, services []string, extraSnapArgs ...string) error {
	req, err := s.parse(ctx, "start", services, extraSnapArgs)
	if err != nil || s.run != nil {
		return err
	}
	opts := snapsvc.StartOptions{Enable: req.Enable}
	switch {
	case s.ensure && req.Enable && req.NoWait:
		return s.ensureRunningAsync(ctx, req.Names)
	case s.ensure && req.Enable:
		_, err = s.client.EnsureRunning(ctx, req.Names)
	case req.NoWait:
		_, err = s.client.StartAsync(ctx, req.Names, opts)
	default:
		_, err = s.client.Start(ctx, req.Names, opts)
	}
	return err
}

// StopServices stops and disables the snap's services, like "snap stop
// --disable [--no-wait] <instance>.<service>..." (k8sd's contract; with
// WithPlainFlags it disables only when "--disable" is passed).
func (s *Snap) StopServices(ctx context.Context, services []string, extraSnapArgs ...string) error {
	req, err := s.parse(ctx, "stop", services, extraSnapArgs)
	if err != nil || s.run != nil {
		return err
	}
	opts := snapsvc.StopOptions{Disable: req.Disable}
	if req.NoWait {
		_, err = s.client.StopAsync(ctx, req.Names, opts)
	} else {
		_, err = s.client.Stop(ctx, req.Names, opts)
	}
	return err
}

// RestartServices restarts the snap's services, like "snap restart
// [--reload] [--no-wait] <instance>.<service>...".
func (s *Snap) RestartServices(ctx context.Context, services []string, extraSnapArgs ...string) error {
	req, err := s.parse(ctx, "restart", services, extraSnapArgs)
	if err != nil || s.run != nil {
		return err
	}
	opts := snapsvc.RestartOptions{Reload: req.Reload}
	if req.NoWait {
		_, err = s.client.RestartAsync(ctx, req.Names, opts)
	} else {
		_, err = s.client.Restart(ctx, req.Names, opts)
	}
	return err
}

// parse checks a call, adds the implied flag and refuses --no-wait where
// it cannot return at once. With a command runner it also runs the
// command: the error returned is then the runner's.
func (s *Snap) parse(ctx context.Context, action string, services, extraSnapArgs []string) (Request, error) {
	if s.err != nil {
		return Request{}, &snapsvc.OpError{Op: action, Snap: s.instance, Names: services, Err: s.err}
	}
	if !s.plain {
		extraSnapArgs = ImplyFlags(action, extraSnapArgs)
	}
	req, err := ParseRequest(s.instance, action, services, extraSnapArgs...)
	if err != nil {
		return req, err
	}
	if s.run != nil {
		return req, s.run(ctx, req.Command())
	}
	if req.NoWait && !s.noWaitReturnsAtOnce() {
		return req, &snapsvc.OpError{Op: action, Snap: s.instance, Names: req.Names, Err: fmt.Errorf(
			"%w --no-wait: in snapctl mode snapd answers %s only once its change is ready (overlord/hookstate/ctlcmd), so it would not return at once; use REST mode (the default) or drop --no-wait",
			ErrUnsupportedFlag, action)}
	}
	return req, nil
}

// noWaitReturnsAtOnce reports whether the client can return before the
// change is done: over REST, or inside a configure or default-configure
// hook, where snapd only queues snapctl's commands until the hook ends.
func (s *Snap) noWaitReturnsAtOnce() bool {
	if s.client.Mode() != snapsvc.ModeSnapctl {
		return true
	}
	h := s.client.Hook()
	return h == "configure" || h == "default-configure"
}

// ensureRunningAsync is EnsureRunning's rule (start and enable what is
// inactive or disabled) with a start that returns once snapd accepted it.
func (s *Snap) ensureRunningAsync(ctx context.Context, names []string) error {
	svcs, err := s.client.Services(ctx, names...)
	if err != nil {
		return &snapsvc.OpError{Op: "ensure start", Snap: s.instance, Names: names, Err: err}
	}
	var todo []string
	for _, sv := range svcs {
		if !sv.Active || !sv.Enabled {
			todo = append(todo, sv.FullName())
		}
	}
	if len(todo) == 0 {
		return nil
	}
	_, err = s.client.StartAsync(ctx, todo, snapsvc.StartOptions{Enable: true})
	return err
}
