package snapservices

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Snap is a handle for one snap's services. It is safe for concurrent
// use; operations of every Snap and snapsvc.Client of a process on the
// same snap are serialised, so they never conflict with each other.
type Snap struct {
	client   *snapsvc.Client
	owned    bool   // built by New, closed by Close
	instance string // "" with SnapctlStyle outside a snap: each call's names give it
	mode     snapsvc.Mode
	ensure   bool
	plain    bool                                                        // WithPlainFlags
	run      func(ctx context.Context, command []string) error           // WithCommandRunner
	output   func(ctx context.Context, command []string) (string, error) // WithCommandOutput
	logs     logs
	err      error   // Open's setup error, returned by every call
	atOnce   *atOnce // WithGiveUp(0)
}

var _ Control = (*Snap)(nil)

// Option configures New.
type Option func(*config)

type config struct {
	instance      string
	fallback      string
	fromNames     bool // SnapctlStyle: no instance outside a snap; the names give it
	plain         bool
	run           func(ctx context.Context, command []string) error
	output        func(ctx context.Context, command []string) (string, error)
	client        *snapsvc.Client
	clientOpts    []snapsvc.Option
	sockets       []snapsvc.Option // WithSocket, WithSnapSocket
	snapctl       bool
	fromSnap      bool // WithModeFromConfinement
	snapDir       string
	snapDirSet    bool
	defaultPolicy bool
	giveUp        *time.Duration // WithGiveUp
	ensure        bool
	logs          logs
	env           func(string) string
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

// WithCommandRunner makes the handle hand each checked call, as the
// command line it stands for in the handle's mode (Request.CommandFor:
// "snap start k8s.kubelet --enable" by default, as k8sd builds it;
// "snapctl restart --reload microceph.rgw" in snapctl mode), to run
// instead of acting through snapd; no client is built. It is the test seam
// for code whose tests assert the command line (k8sd's mock.Runner,
// microceph's mocked snapctl calls): tests keep passing their runner and
// assertions unchanged. Services (and WithEnsureRunning's read) need the
// command's output: give WithCommandOutput instead, or as well.
func WithCommandRunner(run func(ctx context.Context, command []string) error) Option {
	return func(c *config) { c.run = run }
}

// WithCommandOutput is WithCommandRunner for runners that return the
// command's output, as exec-based code has them (microceph's
// RunCommand(name, args...) (string, error)): actions are handed over as
// with WithCommandRunner (when both are given, actions go to that one),
// and Services runs "snap services NAMES" or "snapctl services NAMES" and
// reads the table it prints (see Services), so the status call and
// WithEnsureRunning work under the seam too.
func WithCommandOutput(run func(ctx context.Context, command []string) (string, error)) Option {
	return func(c *config) { c.output = run }
}

// WithClient makes the handle act through c, in c's mode and with c's
// retry policy, instead of building its own client.
func WithClient(c *snapsvc.Client) Option { return func(cfg *config) { cfg.client = c } }

// WithClientOptions adds options for the client New builds (a lock
// directory, a policy in place of retry.NestedPolicy, a restart budget,
// ...; the sockets have WithSocket and WithSnapSocket). They apply after
// the handle's own, so they win.
func WithClientOptions(opts ...snapsvc.Option) Option {
	return func(c *config) { c.clientOpts = append(c.clientOpts, opts...) }
}

// WithSocket sets snapd's main socket, the one REST mode dials (default
// as snapsvc.WithSocket's: $SNAPSVC_SOCKET, then
// $SNAPPY_GLOBAL_ROOT/run/snapd.socket, then /run/snapd.socket): a test's
// fake.Server.SocketPath, say. It applies to the client New builds;
// with WithClient, whose client has its socket, New fails.
func WithSocket(path string) Option {
	return func(c *config) { c.sockets = append(c.sockets, snapsvc.WithSocket(path)) }
}

// WithSnapSocket sets the socket snapctl mode dials (default as
// snapsvc.WithSnapSocket's: $SNAPSVC_SNAP_SOCKET, then
// $SNAPPY_GLOBAL_ROOT/run/snapd-snap.socket, then
// /run/snapd-snap.socket). Like WithSocket, it applies to the client New
// builds.
func WithSnapSocket(path string) Option {
	return func(c *config) { c.sockets = append(c.sockets, snapsvc.WithSnapSocket(path)) }
}

// WithSnapctl makes the handle act through snapctl (with $SNAP_COOKIE)
// instead of REST on /run/snapd.socket: the choice for a strictly
// confined snap or a snap hook. snapd answers snapctl start, stop and
// restart only when their change is ready, so "--no-wait" is refused
// with ErrUnsupportedFlag (except in a configure or default-configure
// hook, where snapd queues the command and answers at once).
func WithSnapctl() Option { return func(c *config) { c.snapctl = true } }

// WithModeFromConfinement picks the mode from the snap's own confinement,
// read from meta/snap.yaml under $SNAP (or WithSnapDir): classic → REST,
// strict or devmode → snapctl (Confinement, ModeFor). Outside a snap,
// where there is no snap.yaml to read, the mode is snapctl. WithSnapctl
// and WithClient win over it.
func WithModeFromConfinement() Option { return func(c *config) { c.fromSnap = true } }

// WithSnapDir names the directory the snap is installed in, whose
// meta/snap.yaml WithModeFromConfinement reads (default $SNAP). Code that
// is handed its $SNAP (microk8s-cluster-agent's NewSnap) passes it on.
func WithSnapDir(dir string) Option {
	return func(c *config) { c.snapDir, c.snapDirSet = dir, true }
}

// WithDefaultPolicy makes the client New builds use snapsvc's own default
// policy (retry.DefaultPolicy: conflicts absorbed for up to 5 minutes)
// instead of retry.NestedPolicy, for callers with no retry loop of their
// own.
func WithDefaultPolicy() Option { return func(c *config) { c.defaultPolicy = true } }

// WithGiveUp bounds how long each call waits before snapd accepts it, so
// that the handle gives up when its caller needs it to, with a retryable
// error naming what held the snap (or that snapd stayed unreachable):
//
//   - d > 0: a change of someone else's that holds the snap is waited out
//     for up to d, snapd unreachable for up to d (or the policy's own
//     MaxUnreachable when shorter). For a caller that must answer within
//     a bound: an HTTP handler whose client waits, a hook, a daemon's
//     start. snapd's default 5 minutes would hold them far longer.
//   - d == 0: one attempt; a snap held by someone else, or snapd
//     unreachable, fails the call at once. For code inside a retry loop
//     that pauses after every failure whatever the attempt took (k8sd's
//     control.RetryFor kept as it is): the loop's pauses are then the
//     wait, and the loop gives up when it did before the port, where
//     any wait inside each call would add to it.
//
// Either way the call's own change, once snapd accepted it, is waited for
// as long as the context allows (the policy's ChangeWait is negative), as
// the snap command waited for it: a slow service start is not a failure.
// WithGiveUp applies to the client New builds; a caller's context may
// bound a call further (an HTTP request's).
func WithGiveUp(d time.Duration) Option {
	return func(c *config) {
		if d < 0 {
			d = 0
		}
		c.giveUp = &d
	}
}

// giveUpPolicy is p bounded as WithGiveUp(d) says. For d == 0 the
// policy gives up at the first failed connection, and a conflict ends the
// call through the client's observer (atOnce): the policy has no bound
// that stops a wait for a blocker before it begins.
func giveUpPolicy(p retry.Policy, d time.Duration) retry.Policy {
	p.ChangeWait = -1
	if d == 0 {
		p.MaxUnreachable = time.Nanosecond
		return p
	}
	p.MaxElapsedTime = d
	if p.MaxUnreachable <= 0 || p.MaxUnreachable > d {
		p.MaxUnreachable = d
	}
	if p.MaxInterval > d {
		p.MaxInterval = d
	}
	if p.MaxInterval > 0 {
		// MaxInterval caps every pause (retry.Policy.Validate): a bound
		// below the first pause, WithGiveUp(100*time.Millisecond), cuts
		// them all.
		p.InitialInterval = min(p.InitialInterval, p.MaxInterval)
		p.MaxConflictInterval = min(p.MaxConflictInterval, p.MaxInterval)
		p.RedialInterval = min(p.RedialInterval, p.MaxInterval)
	}
	return p
}

// SnapctlStyle sets a handle up the way code written around snapctl
// calls it (microceph, microovn, microk8s-cluster-agent):
//
//   - plain flags (WithPlainFlags): "--enable" and "--disable" only when
//     passed, as snapctl;
//   - the library's default policy (WithDefaultPolicy): such code has no
//     retry loop of its own, so conflicts are absorbed for up to 5
//     minutes;
//   - the instance from the environment ($SNAP_INSTANCE_NAME, $SNAP_NAME)
//     or, outside a snap (a unit test), from the names each call gives
//     ("microceph.rgw": every name of a call must then name one snap);
//   - the mode from the snap's confinement (WithModeFromConfinement):
//     REST for a classic snap, snapctl for a strict one and outside a
//     snap, so a command runner sees the snapctl lines the code ran.
//
// Options given after it still apply (WithInstance, WithSnapctl,
// WithClientOptions(snapsvc.WithPolicy(...)), ...).
func SnapctlStyle() Option {
	return func(c *config) {
		c.plain, c.defaultPolicy, c.fromNames, c.fromSnap = true, true, true, true
	}
}

// WithEnsureRunning routes "start --enable" through
// snapsvc.Client.EnsureRunning: the services' state is read first and only
// those not active or not enabled are started and enabled, in one change;
// when all are, no change is made. It is the fix for services a snap
// revert left disabled while running, and makes a start at every daemon
// start cheap. A start without "--enable" is a plain start. Under a
// command runner it reads the state with Services (WithCommandOutput) and
// hands over the start of the difference.
func WithEnsureRunning() Option { return func(c *config) { c.ensure = true } }

// New builds a handle for one snap. Unless WithClient, WithCommandRunner
// or WithCommandOutput is given it builds a snapsvc.Client in REST mode on
// /run/snapd.socket (WithSnapctl for snapctl, WithModeFromConfinement to
// follow the snap's confinement) with retry.NestedPolicy, since callers of
// this interface keep their own retry loop (SnapctlStyle and
// WithDefaultPolicy for those that do not). It sends no request. The
// errors it returns are the setup's: no instance name, an invalid one, an
// unreadable snap.yaml, client options that do not fit; they wrap
// ErrSetup.
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
	if cfg.instance == "" && !cfg.fromNames {
		return nil, fmt.Errorf("%w: no snap instance name: $SNAP_INSTANCE_NAME and $SNAP_NAME are unset (not running inside a snap?); use WithInstance or WithDefaultInstance", ErrSetup)
	}
	if cfg.instance != "" {
		if snap, app, err := snapsvc.ValidateName(cfg.instance); err != nil || app != "" || snap != cfg.instance {
			return nil, fmt.Errorf("%w: %w %q: not a snap instance name", ErrSetup, snapsvc.ErrInvalidName, cfg.instance)
		}
	}
	if cfg.client != nil && len(cfg.sockets) > 0 {
		return nil, fmt.Errorf("%w: WithSocket or WithSnapSocket with WithClient: the client given dials its own sockets", ErrSetup)
	}
	mode := snapsvc.ModeREST
	switch {
	case cfg.client != nil:
		mode = cfg.client.Mode()
	case cfg.snapctl:
		mode = snapsvc.ModeSnapctl
	case cfg.fromSnap:
		dir := cfg.snapDir
		if !cfg.snapDirSet {
			dir = cfg.env("SNAP")
		}
		m, err := modeFromSnap(dir)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		mode = m
	}
	s := &Snap{client: cfg.client, instance: cfg.instance, mode: mode, ensure: cfg.ensure, plain: cfg.plain,
		run: cfg.run, output: cfg.output, logs: cfg.logs}
	if cfg.giveUp != nil && *cfg.giveUp == 0 {
		s.atOnce = &atOnce{calls: map[*atOnceCall]bool{}}
	}
	if s.client == nil && !s.seam() {
		policy := retry.NestedPolicy()
		if cfg.defaultPolicy {
			policy = retry.DefaultPolicy()
		}
		if cfg.giveUp != nil {
			policy = giveUpPolicy(policy, *cfg.giveUp)
		}
		base := []snapsvc.Option{snapsvc.WithMode(mode), snapsvc.WithPolicy(policy), snapsvc.WithContextLogger(s.logs.client)}
		if s.atOnce != nil {
			base = append(base, snapsvc.WithObserver(s.atOnce.observe))
		}
		if cfg.instance != "" {
			base = append(base, snapsvc.WithSnap(cfg.instance))
		}
		base = append(base, cfg.sockets...)
		c, err := snapsvc.New(append(base, cfg.clientOpts...)...)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSetup, err)
		}
		s.client, s.owned = c, true
	}
	return s, nil
}

// seam reports whether calls go to a command runner instead of snapd.
func (s *Snap) seam() bool { return s.run != nil || s.output != nil }

// Err returns the setup error Open kept, or nil.
func (s *Snap) Err() error { return s.err }

// Instance returns the snap instance the handle controls ("" for a
// SnapctlStyle handle outside a snap, whose calls name it).
func (s *Snap) Instance() string { return s.instance }

// Mode returns the mode the handle acts in, or renders commands in under
// a command runner: snapsvc.ModeREST or snapsvc.ModeSnapctl.
func (s *Snap) Mode() snapsvc.Mode { return s.mode }

// Client returns the client the handle acts through (nil under a command
// runner, or after a setup error).
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
	return s.act(ctx, "start", services, extraSnapArgs)
}

// StopServices stops and disables the snap's services, like "snap stop
// --disable [--no-wait] <instance>.<service>..." (k8sd's contract; with
// WithPlainFlags it disables only when "--disable" is passed).
func (s *Snap) StopServices(ctx context.Context, services []string, extraSnapArgs ...string) error {
	return s.act(ctx, "stop", services, extraSnapArgs)
}

// RestartServices restarts the snap's services, like "snap restart
// [--reload] [--no-wait] <instance>.<service>...".
func (s *Snap) RestartServices(ctx context.Context, services []string, extraSnapArgs ...string) error {
	return s.act(ctx, "restart", services, extraSnapArgs)
}

// Services returns the state of services named as for StartServices (bare,
// prefixed with the instance, or the instance alone for every service of
// the snap), like "snap services" or "snapctl services": whether each is
// enabled and active. It is the status call of code that ran "snapctl
// services microceph.rgw" and looked for "inactive". Through snapd it
// reads GET /v2/apps (REST) or snapctl services (snapctl mode). Under
// WithCommandOutput it runs "snap services NAMES" or "snapctl services
// NAMES" and reads the table printed (a header, then NAME STARTUP CURRENT
// NOTES per service); when a single service was asked for and no line
// names it, the words enabled/disabled and active/inactive in the output
// say its state (a test's canned "inactive"). Unknown services fail with
// an error matching snapsvc.ErrNotFound through snapd.
func (s *Snap) Services(ctx context.Context, services []string) ([]snapsvc.Service, error) {
	instance, names, err := s.names("services", services)
	if err != nil {
		return nil, err
	}
	if !s.seam() {
		return s.client.Services(ctx, names...)
	}
	if s.output == nil {
		return nil, &snapsvc.OpError{Op: "services", Snap: instance, Names: names, Err: fmt.Errorf(
			"%w: reading services under a command runner needs its output: use WithCommandOutput", ErrSetup)}
	}
	cmd := ServicesCommand(s.mode, names)
	out, err := s.output(ctx, cmd)
	if err != nil {
		return nil, err
	}
	svcs, err := parseServicesOutput(out, names)
	if err != nil {
		return nil, &snapsvc.OpError{Op: "services", Snap: instance, Names: names, Err: fmt.Errorf("%q printed %q: %w", strings.Join(cmd, " "), out, err)}
	}
	return svcs, nil
}

// outcome is what an action did, for its log line.
type outcome struct {
	change    string
	conflicts int // blocking changes waited out (Result.Conflicts)
	attempts  int // requests sent to act (Result.Attempts), when the call's own
	waited    []string
	queued    bool
	unchanged bool     // WithEnsureRunning: nothing to start
	names     []string // the services acted on, when fewer than asked
	command   []string // under a command runner
}

// act checks a call and performs it, through snapd or a command runner,
// and logs it.
func (s *Snap) act(ctx context.Context, action string, services, extraSnapArgs []string) error {
	req, err := s.parse(action, services, extraSnapArgs)
	if err != nil {
		return err
	}
	began := time.Now()
	var out outcome
	if s.seam() {
		out, err = s.perform(ctx, req)
	} else if s.atOnce != nil {
		out, err = s.atOnce.do(ctx, req, s.instance, s.do)
	} else {
		out, err = s.do(ctx, req)
	}
	s.logs.action(ctx, req, out, err, time.Since(began))
	return err
}

// perform hands a checked call to the command runner.
func (s *Snap) perform(ctx context.Context, req Request) (outcome, error) {
	if s.ensure && req.Action == "start" && req.Enable {
		svcs, err := s.Services(ctx, req.Names)
		if err != nil {
			return outcome{}, err
		}
		todo := notRunning(svcs)
		if len(todo) == 0 {
			return outcome{unchanged: true}, nil
		}
		req.Names = todo
	}
	cmd := req.CommandFor(s.mode)
	out := outcome{command: cmd, names: req.Names}
	if s.run != nil {
		return out, s.run(ctx, cmd)
	}
	_, err := s.output(ctx, cmd)
	return out, err
}

// do acts through the client.
func (s *Snap) do(ctx context.Context, req Request) (outcome, error) {
	var (
		res *snapsvc.Result
		op  *snapsvc.Operation
		err error
	)
	switch req.Action {
	case "start":
		opts := snapsvc.StartOptions{Enable: req.Enable}
		switch {
		case s.ensure && req.Enable && req.NoWait:
			return s.ensureRunningAsync(ctx, req.Names)
		case s.ensure && req.Enable:
			var er *snapsvc.EnsureResult
			if er, err = s.client.EnsureRunning(ctx, req.Names); err == nil && er.Result == nil {
				return outcome{unchanged: true}, nil
			} else if err == nil {
				out := resultOutcome(er.Result)
				out.names = er.Changed
				return out, nil
			}
		case req.NoWait:
			op, err = s.client.StartAsync(ctx, req.Names, opts)
		default:
			res, err = s.client.Start(ctx, req.Names, opts)
		}
	case "stop":
		opts := snapsvc.StopOptions{Disable: req.Disable}
		if req.NoWait {
			op, err = s.client.StopAsync(ctx, req.Names, opts)
		} else {
			res, err = s.client.Stop(ctx, req.Names, opts)
		}
	case "restart":
		opts := snapsvc.RestartOptions{Reload: req.Reload}
		if req.NoWait {
			op, err = s.client.RestartAsync(ctx, req.Names, opts)
		} else {
			res, err = s.client.Restart(ctx, req.Names, opts)
		}
	}
	if op != nil {
		r := op.Result()
		res = &r
	}
	return resultOutcome(res), err
}

func resultOutcome(res *snapsvc.Result) outcome {
	if res == nil {
		return outcome{}
	}
	out := outcome{change: res.ChangeID, conflicts: res.Conflicts, waited: res.WaitedFor, queued: res.Queued}
	if !res.Shared { // a shared restart's requests were another call's
		out.attempts = res.Attempts
	}
	return out
}

// names maps the names of a call to snapd's, with the call's instance.
func (s *Snap) names(op string, services []string) (string, []string, error) {
	if s.err != nil {
		return s.instance, nil, &snapsvc.OpError{Op: op, Snap: s.instance, Names: services, Err: s.err}
	}
	instance, err := s.instanceFor(op, services)
	if err != nil {
		return instance, nil, err
	}
	if len(services) == 0 {
		return instance, nil, &snapsvc.OpError{Op: op, Snap: instance, Err: snapsvc.ErrNoNames}
	}
	out := make([]string, 0, len(services))
	for _, name := range services {
		full, err := serviceName(instance, name)
		if err != nil {
			return instance, nil, &snapsvc.OpError{Op: op, Snap: instance, Names: services, Err: err}
		}
		out = append(out, full)
	}
	return instance, out, nil
}

// instanceFor returns the instance a call acts on: the handle's, or, for
// a SnapctlStyle handle outside a snap, the one its names give.
func (s *Snap) instanceFor(op string, services []string) (string, error) {
	if s.instance != "" {
		return s.instance, nil
	}
	var instance string
	for _, name := range services {
		snap, _, ok := strings.Cut(name, ".")
		if !ok || snap == "" {
			return "", &snapsvc.OpError{Op: op, Names: services, Err: fmt.Errorf(
				"%w %q: outside a snap ($SNAP_INSTANCE_NAME and $SNAP_NAME unset) a service is named \"<snap>.<app>\"; or give WithInstance", snapsvc.ErrInvalidName, name)}
		}
		if instance != "" && snap != instance {
			return "", &snapsvc.OpError{Op: op, Names: services, Err: fmt.Errorf(
				"%w: %q and %q name different snaps; a call acts on one snap", snapsvc.ErrWrongSnap, instance+".", name)}
		}
		instance = snap
	}
	if instance == "" {
		return "", nil // no names: ParseRequest reports it
	}
	if snap, app, err := snapsvc.ValidateName(instance); err != nil || app != "" || snap != instance {
		return "", &snapsvc.OpError{Op: op, Names: services, Err: fmt.Errorf("%w %q: not a snap instance name", snapsvc.ErrInvalidName, instance)}
	}
	return instance, nil
}

// parse checks a call, adds the implied flag and refuses --no-wait where
// it cannot return at once.
func (s *Snap) parse(action string, services, extraSnapArgs []string) (Request, error) {
	if s.err != nil {
		return Request{}, &snapsvc.OpError{Op: action, Snap: s.instance, Names: services, Err: s.err}
	}
	if !s.plain {
		extraSnapArgs = ImplyFlags(action, extraSnapArgs)
	}
	instance, err := s.instanceFor(action, services)
	if err != nil {
		return Request{}, err
	}
	req, err := ParseRequest(instance, action, services, extraSnapArgs...)
	if err != nil {
		return req, err
	}
	if req.NoWait && !s.noWaitReturnsAtOnce() {
		return req, &snapsvc.OpError{Op: action, Snap: instance, Names: req.Names, Err: fmt.Errorf(
			"%w --no-wait: in snapctl mode snapd answers %s only once its change is ready (overlord/hookstate/ctlcmd), so it would not return at once, and snapctl has no such flag; use REST mode or drop --no-wait",
			ErrUnsupportedFlag, action)}
	}
	return req, nil
}

// noWaitReturnsAtOnce reports whether the handle can return before the
// change is done: over REST, or inside a configure or default-configure
// hook, where snapd only queues snapctl's commands until the hook ends.
func (s *Snap) noWaitReturnsAtOnce() bool {
	if s.mode != snapsvc.ModeSnapctl {
		return true
	}
	if s.client == nil {
		return false // a command runner would be handed a snapctl line with a flag snapctl lacks
	}
	h := s.client.Hook()
	return h == "configure" || h == "default-configure"
}

// ensureRunningAsync is EnsureRunning's rule (start and enable what is
// inactive or disabled) with a start that returns once snapd accepted it.
func (s *Snap) ensureRunningAsync(ctx context.Context, names []string) (outcome, error) {
	svcs, err := s.client.Services(ctx, names...)
	if err != nil {
		return outcome{}, &snapsvc.OpError{Op: "ensure start", Snap: s.instance, Names: names, Err: err}
	}
	todo := notRunning(svcs)
	if len(todo) == 0 {
		return outcome{unchanged: true}, nil
	}
	op, err := s.client.StartAsync(ctx, todo, snapsvc.StartOptions{Enable: true})
	if err != nil {
		return outcome{}, err
	}
	res := op.Result()
	out := resultOutcome(&res)
	out.names = todo
	return out, nil
}

// notRunning returns the full names of the services of svcs that are
// inactive or disabled: what EnsureRunning starts and enables.
func notRunning(svcs []snapsvc.Service) []string {
	var todo []string
	for _, sv := range svcs {
		if !sv.Active || !sv.Enabled {
			todo = append(todo, sv.FullName())
		}
	}
	return todo
}

// parseServicesOutput reads the table "snap services" and "snapctl
// services" print (overlord/hookstate/ctlcmd/services.go, cmd/snap's
// svcStatus: a header "Service Startup Current Notes", then one line per
// service). A single service asked for whose line is missing takes its
// state from the state words of the output.
func parseServicesOutput(out string, names []string) ([]snapsvc.Service, error) {
	var svcs []snapsvc.Service
	var loose []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || (f[0] == "Service" && slices.Contains(f, "Startup")) {
			continue
		}
		if snap, app, ok := strings.Cut(f[0], "."); ok && len(f) >= 3 {
			svcs = append(svcs, snapsvc.Service{Snap: snap, Name: app, Enabled: f[1] == "enabled", Active: f[2] == "active"})
			continue
		}
		loose = append(loose, f...)
	}
	if len(svcs) > 0 {
		return svcs, nil
	}
	if len(names) == 1 {
		if snap, app, ok := strings.Cut(names[0], "."); ok {
			sv := snapsvc.Service{Snap: snap, Name: app}
			seen := false
			for _, w := range loose {
				switch w {
				case "enabled", "disabled":
					sv.Enabled = w == "enabled"
				case "active", "inactive":
					sv.Active, seen = w == "active", true
				}
			}
			if seen {
				return []snapsvc.Service{sv}, nil
			}
		}
	}
	return nil, errors.New("no service state in it")
}

// atOnce ends a call of a WithGiveUp(0) handle as soon as snapd refuses
// it because another change holds the snap: the client's observer sees
// the conflict (snapsvc.EventConflict, emitted in the operation before it
// waits) and cancels the calls in flight for that operation and those
// names; the call then fails with the conflict, retryable, having acted
// on nothing.
type atOnce struct {
	mu    sync.Mutex
	calls map[*atOnceCall]bool
}

// atOnceCall is one call in flight.
type atOnceCall struct {
	action string
	names  []string
	cancel context.CancelCauseFunc
}

// heldError is the cause of a call WithGiveUp(0) ended: the conflict that
// refused its one attempt. It matches snapsvc.ErrGaveUp and the conflict
// (retry.Classify: a Conflict, so the call is retryable).
type heldError struct{ conflict error }

func (e *heldError) Error() string {
	return "gave up at the first conflict (WithGiveUp(0)): " + e.conflict.Error()
}

// Unwrap returns snapsvc.ErrGaveUp and the conflict.
func (e *heldError) Unwrap() []error { return []error{snapsvc.ErrGaveUp, e.conflict} }

// do runs f, the call, under a context the observer cancels at its first
// conflict.
func (a *atOnce) do(ctx context.Context, req Request, instance string, f func(context.Context, Request) (outcome, error)) (outcome, error) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	call := &atOnceCall{action: req.Action, names: req.Names, cancel: cancel}
	a.mu.Lock()
	a.calls[call] = true
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.calls, call)
		a.mu.Unlock()
	}()
	out, err := f(cctx, req)
	var held *heldError
	if err != nil && errors.As(context.Cause(cctx), &held) && ctx.Err() == nil {
		return out, &snapsvc.OpError{Op: req.Action, Snap: instance, Names: req.Names, Attempts: 1, Err: held}
	}
	return out, err
}

// observe is the client's observer: a conflict ends the calls in flight
// for its operation and names.
func (a *atOnce) observe(ev snapsvc.Event) {
	if ev.Kind != snapsvc.EventConflict {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for c := range a.calls {
		if c.action == ev.Op && slices.Equal(c.names, ev.Names) {
			c.cancel(&heldError{conflict: ev.Err})
		}
	}
}
