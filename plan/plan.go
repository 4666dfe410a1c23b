// Package plan starts a set of snap services in dependency order, gating
// each service on the readiness of the ones it comes after, and signals
// when all of them are ready.
//
// A finished snapd change only means "systemctl start" returned. A Plan
// declares, once, "start X when Y is ready": each Service names the
// services it comes After and a readiness probe. Start starts every
// service as soon as its dependencies are ready, batching the services
// that become startable together into one snapd change, waits for each
// service's probe, and closes Ready once every service is ready, so
// controllers can gate on it instead of sleeping in loops.
//
// Cycles and unknown names are rejected by New, before anything starts.
// Nothing is stopped when a plan fails: the error names the service, the
// probe and its last error, and services already started keep running
// (restart-until-healthy is usually kinder than tearing down).
package plan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Service is one service of a plan.
type Service struct {
	// Name is the service, "snap.app".
	Name string
	// After names services of the plan that must be ready before this one
	// starts.
	After []string
	// Probe tells when the service is ready. Nil means ready as soon as
	// snapd's start change is done (the service is active).
	Probe probe.Probe
	// ProbeOptions override the plan's Options.Probe for this service;
	// zero fields take the plan's values.
	ProbeOptions probe.Options
}

// Options configure a Plan.
type Options struct {
	// Enable starts services with --enable, so they also start at boot
	// (and services left disabled, for example by a revert, are enabled
	// again).
	Enable bool
	// Probe are the default probe options (interval, timeout, success
	// threshold, MaxWait). MaxWait bounds how long one service may take to
	// become ready after its start; 0 leaves only the context.
	Probe probe.Options
	// Clock drives probes (default: real time). It overrides Probe.Clock;
	// a service's own ProbeOptions.Clock overrides it.
	Clock retry.Clock
	// SkipRunning leaves out of each start request the services snapd
	// already reports active (and enabled, with Enable), when the
	// Controller can read service state (a *snapsvc.Client can). A plan run
	// at every daemon start then makes no change when everything already
	// runs. Probes still gate the dependents of skipped services. If the
	// state cannot be read, the whole batch is started.
	SkipRunning bool
	// OnEvent, if set, is called for each step, in order, from the
	// goroutine running Start.
	OnEvent func(Event)
}

// EventKind tells what happened.
type EventKind int

const (
	// EventStarting: a batch of services is being started (one change).
	EventStarting EventKind = iota
	// EventStarted: snapd's change for the batch is done.
	EventStarted
	// EventReady: a service is ready.
	EventReady
	// EventFailed: the plan failed.
	EventFailed
)

// String returns "starting", "started", "ready" or "failed".
func (k EventKind) String() string {
	switch k {
	case EventStarting:
		return "starting"
	case EventStarted:
		return "started"
	case EventReady:
		return "ready"
	case EventFailed:
		return "failed"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event is one step of a plan's start.
type Event struct {
	// Kind is what happened.
	Kind EventKind
	// Services are the batch (Starting, Started) or the one service
	// (Ready).
	Services []string
	// ChangeID is snapd's change for the batch (Started).
	ChangeID string
	// Err is the plan's error (Failed).
	Err error
}

// Controller is what a plan needs from snapd; *snapsvc.Client is one.
type Controller interface {
	Start(ctx context.Context, names []string, opts snapsvc.StartOptions) (*snapsvc.Result, error)
}

// StateReader reads service state; *snapsvc.Client is one. A Controller
// that is also a StateReader lets Options.SkipRunning work.
type StateReader interface {
	Services(ctx context.Context, names ...string) ([]snapsvc.Service, error)
}

// Errors of New and Start.
var (
	// ErrCycle: the services' After relations form a cycle.
	ErrCycle = errors.New("dependency cycle")
	// ErrUnknown: an After names a service that is not in the plan.
	ErrUnknown = errors.New("unknown service")
	// ErrDuplicate: a service is listed twice.
	ErrDuplicate = errors.New("duplicate service")
	// ErrStarted: Start was called on a plan that already started.
	ErrStarted = errors.New("plan already started")
	// ErrQueued: snapd only queued the start until the running configure
	// hook ends, so readiness cannot be awaited; run plans from a daemon
	// or a hook other than configure/default-configure.
	ErrQueued = errors.New("start queued until the running configure hook ends; a readiness-gated plan cannot run inside it")
)

// Batch is one start request a plan made.
type Batch struct {
	// Services were started together, in one change.
	Services []string
	// ChangeID is snapd's change ("" in snapctl mode).
	ChangeID string
}

// Plan is a validated set of services to start in order. It runs once:
// build a new one (New is cheap) to start again.
type Plan struct {
	svcs  []Service // in the order given
	index map[string]int
	opts  Options

	started atomic.Bool
	ready   chan struct{}
	done    chan struct{}

	mu      sync.Mutex
	err     error
	batches []Batch
	skipped []string
	isReady map[string]bool
}

// New validates services and returns a plan. Names must be "snap.app";
// After must name services of the plan; cycles are rejected with the
// cycle spelled out.
func New(services []Service, opts Options) (*Plan, error) {
	p := &Plan{index: map[string]int{}, opts: opts, ready: make(chan struct{}), done: make(chan struct{}), isReady: map[string]bool{}}
	for _, s := range services {
		snap, app, err := snapsvc.ValidateName(s.Name)
		if err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
		if app == "" {
			return nil, fmt.Errorf("plan: %w %q: name a service as \"%s.APP\", not a whole snap", snapsvc.ErrInvalidName, s.Name, snap)
		}
		if _, dup := p.index[s.Name]; dup {
			return nil, fmt.Errorf("plan: %w %q", ErrDuplicate, s.Name)
		}
		s.After = slices.Clone(s.After)
		p.index[s.Name] = len(p.svcs)
		p.svcs = append(p.svcs, s)
	}
	for _, s := range p.svcs {
		for _, a := range s.After {
			if _, ok := p.index[a]; !ok {
				return nil, fmt.Errorf("plan: service %q comes after %w %q", s.Name, ErrUnknown, a)
			}
			if a == s.Name {
				return nil, fmt.Errorf("plan: %w: %s -> %s", ErrCycle, a, a)
			}
		}
	}
	if cyc := p.findCycle(); cyc != nil {
		return nil, fmt.Errorf("plan: %w: %s", ErrCycle, strings.Join(cyc, " -> "))
	}
	return p, nil
}

// findCycle returns a dependency cycle as a path whose first and last
// elements are equal, or nil.
func (p *Plan) findCycle() []string {
	const (
		white = iota
		grey
		black
	)
	color := make([]int, len(p.svcs))
	var stack []string
	var visit func(i int) []string
	visit = func(i int) []string {
		color[i] = grey
		stack = append(stack, p.svcs[i].Name)
		for _, a := range p.svcs[i].After {
			j := p.index[a]
			switch color[j] {
			case grey:
				k := slices.Index(stack, a)
				return append(slices.Clone(stack[k:]), a)
			case white:
				if c := visit(j); c != nil {
					return c
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[i] = black
		return nil
	}
	for i := range p.svcs {
		if color[i] == white {
			if c := visit(i); c != nil {
				return c
			}
		}
	}
	return nil
}

// Services returns the plan's services, in the order given.
func (p *Plan) Services() []Service { return slices.Clone(p.svcs) }

// Ready returns a channel closed once every service of the plan is ready.
// It stays open if the plan fails; see Done and WaitReady.
func (p *Plan) Ready() <-chan struct{} { return p.ready }

// Done returns a channel closed when Start has returned.
func (p *Plan) Done() <-chan struct{} { return p.done }

// Err returns Start's error once Done is closed (nil before, and on
// success).
func (p *Plan) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// WaitReady waits until every service is ready (nil), the plan failed
// (its error), or ctx ends. It does not start the plan.
func (p *Plan) WaitReady(ctx context.Context) error {
	select {
	case <-p.ready:
		return nil
	case <-p.done:
		if err := p.Err(); err != nil {
			return err
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("plan: waiting for readiness: %w", context.Cause(ctx))
	}
}

// Batches returns the start requests made so far, in order.
func (p *Plan) Batches() []Batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Batch, len(p.batches))
	for i, b := range p.batches {
		out[i] = Batch{Services: slices.Clone(b.Services), ChangeID: b.ChangeID}
	}
	return out
}

// Skipped returns the services that Options.SkipRunning left out of the
// start requests because they were already running.
func (p *Plan) Skipped() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.skipped)
}

// IsReady reports whether the named service has become ready.
func (p *Plan) IsReady(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.isReady[name]
}

// ServiceError is a plan's failure: a service that could not be started
// or did not become ready.
type ServiceError struct {
	// Services are the services concerned: the batch whose start failed,
	// or the one service that did not become ready.
	Services []string
	// Probe describes the probe that did not pass ("" for a failed
	// start).
	Probe string
	// Waiting lists services that had not started because they come after
	// the failed one(s).
	Waiting []string
	// Err is the cause: a *snapsvc.OpError or a *probe.NotReadyError
	// carrying the probe's last error.
	Err error
}

// Error names the services, the probe (if any) and the cause, and lists
// the services left unstarted.
func (e *ServiceError) Error() string {
	var b strings.Builder
	if e.Probe != "" {
		fmt.Fprintf(&b, "plan: service %s not ready: %v", strings.Join(e.Services, ", "), e.Err)
	} else {
		fmt.Fprintf(&b, "plan: starting %s: %v", strings.Join(e.Services, ", "), e.Err)
	}
	if len(e.Waiting) > 0 {
		fmt.Fprintf(&b, " (not started: %s)", strings.Join(e.Waiting, ", "))
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *ServiceError) Unwrap() error { return e.Err }

type probeResult struct {
	name string
	err  error
}

// Start starts the plan's services through ctl and waits until all are
// ready. Each service starts, in one batch with every other service that
// became startable at the same time, once the services it comes after are
// ready. While a batch's start request runs, services that become
// startable wait for the next batch. Start returns nil once all services
// are ready (Ready is closed just before), or the first failure as a
// *ServiceError; ctx bounds everything. Every goroutine Start starts
// (one per probe being waited for) has ended when it returns; to run a
// plan in the background, call Start in a goroutine and wait on Done.
func (p *Plan) Start(ctx context.Context, ctl Controller) error {
	if !p.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	err := p.run(ctx, ctl)
	if err != nil {
		p.emit(Event{Kind: EventFailed, Err: err})
	}
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
	close(p.done)
	return err
}

func (p *Plan) emit(e Event) {
	if p.opts.OnEvent != nil {
		p.opts.OnEvent(e)
	}
}

func (p *Plan) probeOptions(s Service) probe.Options {
	o, d := s.ProbeOptions, p.opts.Probe
	if o.Interval == 0 {
		o.Interval = d.Interval
	}
	if o.Timeout == 0 {
		o.Timeout = d.Timeout
	}
	if o.SuccessThreshold == 0 {
		o.SuccessThreshold = d.SuccessThreshold
	}
	if o.MaxWait == 0 {
		o.MaxWait = d.MaxWait
	}
	if o.Clock == nil {
		o.Clock = p.opts.Clock
	}
	if o.Clock == nil {
		o.Clock = d.Clock
	}
	return o
}

func (p *Plan) run(ctx context.Context, ctl Controller) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	results := make(chan probeResult, len(p.svcs)) // never blocks a probe
	started := map[string]bool{}
	ready := map[string]bool{}
	probing := map[string]string{} // service -> probe description
	markReady := func(name string) {
		ready[name] = true
		p.mu.Lock()
		p.isReady[name] = true
		p.mu.Unlock()
		p.emit(Event{Kind: EventReady, Services: []string{name}})
	}
	handle := func(r probeResult) error {
		if r.err != nil {
			return &ServiceError{Services: []string{r.name}, Probe: probing[r.name], Waiting: p.notStarted(started), Err: r.err}
		}
		delete(probing, r.name)
		markReady(r.name)
		return nil
	}
	for {
		// Take in every probe that finished meanwhile, so services that
		// became startable together start together.
		for drained := false; !drained; {
			select {
			case r := <-results:
				if err := handle(r); err != nil {
					return err
				}
			default:
				drained = true
			}
		}
		if len(ready) == len(p.svcs) {
			close(p.ready)
			return nil
		}
		var batch []string
		for _, s := range p.svcs {
			if started[s.Name] {
				continue
			}
			ok := true
			for _, a := range s.After {
				ok = ok && ready[a]
			}
			if ok {
				batch = append(batch, s.Name)
			}
		}
		if len(batch) > 0 {
			for _, n := range batch {
				started[n] = true
			}
			toStart := batch
			if p.opts.SkipRunning {
				toStart = p.dropRunning(ctx, ctl, batch)
			}
			if len(toStart) > 0 {
				p.emit(Event{Kind: EventStarting, Services: slices.Clone(toStart)})
				res, err := ctl.Start(ctx, toStart, snapsvc.StartOptions{Enable: p.opts.Enable})
				if err != nil {
					return &ServiceError{Services: toStart, Waiting: p.notStarted(started), Err: err}
				}
				if res.Queued {
					// In a configure hook snapd runs service commands only
					// after the hook: nothing can become ready meanwhile.
					return &ServiceError{Services: toStart, Waiting: p.notStarted(started), Err: ErrQueued}
				}
				p.mu.Lock()
				p.batches = append(p.batches, Batch{Services: slices.Clone(toStart), ChangeID: res.ChangeID})
				p.mu.Unlock()
				p.emit(Event{Kind: EventStarted, Services: slices.Clone(toStart), ChangeID: res.ChangeID})
			}
			for _, n := range batch {
				s := p.svcs[p.index[n]]
				if s.Probe == nil {
					markReady(n)
					continue
				}
				probing[n] = s.Probe.String()
				wg.Add(1)
				go func(s Service, o probe.Options) {
					defer wg.Done()
					results <- probeResult{name: s.Name, err: probe.Wait(ctx, s.Probe, o)}
				}(s, p.probeOptions(s))
			}
			continue
		}
		select {
		case r := <-results:
			if err := handle(r); err != nil {
				return err
			}
		case <-ctx.Done():
			return p.ctxError(ctx, &wg, results, probing, started)
		}
	}
}

// dropRunning returns the services of batch that need starting.
func (p *Plan) dropRunning(ctx context.Context, ctl Controller, batch []string) []string {
	sr, ok := ctl.(StateReader)
	if !ok {
		return batch
	}
	svcs, err := sr.Services(ctx, batch...)
	if err != nil {
		return batch
	}
	running := map[string]bool{}
	for _, s := range svcs {
		running[s.FullName()] = s.Active && (s.Enabled || !p.opts.Enable)
	}
	var out, skipped []string
	for _, n := range batch {
		if running[n] {
			skipped = append(skipped, n)
		} else {
			out = append(out, n)
		}
	}
	p.mu.Lock()
	p.skipped = append(p.skipped, skipped...)
	p.mu.Unlock()
	return out
}

// ctxError builds the error of a plan whose context ended: the probes are
// cancelled with it; their errors carry the last check's failure.
func (p *Plan) ctxError(ctx context.Context, wg *sync.WaitGroup, results chan probeResult, probing map[string]string, started map[string]bool) error {
	wg.Wait()
	errs := map[string]error{}
	for len(results) > 0 {
		r := <-results
		errs[r.name] = r.err
	}
	for _, s := range p.svcs { // the first waiting service, in plan order
		if _, ok := probing[s.Name]; ok && errs[s.Name] != nil {
			return &ServiceError{Services: []string{s.Name}, Probe: probing[s.Name], Waiting: p.notStarted(started), Err: errs[s.Name]}
		}
	}
	return &ServiceError{Services: p.notStarted(started), Err: fmt.Errorf("not started: %w", context.Cause(ctx))}
}

func (p *Plan) notStarted(started map[string]bool) []string {
	var out []string
	for _, s := range p.svcs {
		if !started[s.Name] {
			out = append(out, s.Name)
		}
	}
	return out
}
