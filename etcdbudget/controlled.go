package etcdbudget

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/retry"
)

// Controls are a machine's rollout controls, applied around a Budget's
// Acquire by a Controlled budget.
type Controls struct {
	// Window, when set, is when slots may be taken: Acquire waits for it
	// to open before it queues, and a slot granted after the window
	// closed is held (keeping its place) until it opens again.
	Window *Window
	// MaxUnavailable, when set, replaces Config.Max: a count, or a
	// percentage of the machines taking part in the key's rollout
	// (Participation.Resolve says how it is resolved and pinned). Each
	// Acquire of a percentage first registers this machine (Join) for the
	// key, until Close.
	MaxUnavailable MaxUnavailable
	// JoinPeriod is how long a percentage MaxUnavailable waits, after
	// this machine joined the key's rollout, for other machines to join
	// before it is resolved (default DefaultJoinPeriod; negative: none).
	// See Participation.ResolveAfter.
	JoinPeriod time.Duration
	// Clock drives the window's waits (default: the real clock).
	Clock retry.Clock
	// OnEvent, when set, receives what the controls do. It must not
	// block.
	OnEvent func(Event)
}

// Event is a step of a Controlled budget, for logs and metrics.
type Event struct {
	// Time is when it happened, on Controls.Clock.
	Time time.Time
	// Kind is "window" (waiting for the window to open), "acquired",
	// "unbudgeted" (granted without etcd: fail open or no cluster yet),
	// "failed", "lost", "released", "recorded" (the slot's act was
	// appended to the key's history: Act), "record-failed" (it could not
	// be: Err) or "halted" (that act's failure halted the key: Act,
	// Halt).
	Kind string
	// Key is the budget key.
	Key string
	// Holder is this machine.
	Holder string
	// Opens is when the window opens ("window").
	Opens time.Time
	// Waited is how long the Acquire waited ("acquired", "unbudgeted",
	// "failed").
	Waited time.Duration
	// Held is how long the slot was held ("lost", "released").
	Held time.Duration
	// Max is the slot count the Acquire used.
	Max int
	// Err is the failure ("failed", "lost", "released" when the release
	// failed, "record-failed").
	Err error
	// Act is the act recorded ("recorded", "halted", "record-failed").
	Act *budget.Act
	// Halt is the key's halt ("halted").
	Halt *budget.Halt
}

// Metrics is a snapshot of a Controlled budget's counters and gauges, in
// the shape a Prometheus exporter wants (counters only grow; sums with
// their counts give means). Budget.Stats counts what etcd answered.
type Metrics struct {
	// Waiting is how many Acquires wait now (for the window, in the
	// queue, or on a pause).
	Waiting int
	// Holding is how many slots are held now.
	Holding int
	// Acquired counts slots granted (Unbudgeted included).
	Acquired uint64
	// Unbudgeted counts slots granted without etcd: fail-open grants
	// (etcd unreachable, Config.FailOpen) and grants before any cluster
	// exists (Config.ClusterExists).
	Unbudgeted uint64
	// Failed counts Acquires that returned an error.
	Failed uint64
	// Lost counts slots lost while held.
	Lost uint64
	// Released counts slots given back; ReleaseFailed those whose release
	// failed (their lease expires by itself).
	Released, ReleaseFailed uint64
	// WindowWaits counts Acquires that waited for the window.
	WindowWaits uint64
	// Records counts the acts this machine recorded in the keys' history
	// (Record); RecordFailures the Records that failed.
	Records, RecordFailures uint64
	// Halts counts the keys this machine's Records halted.
	Halts uint64
	// WaitSeconds is the total time Acquires waited (Acquired+Failed of
	// them).
	WaitSeconds float64
	// HoldSeconds is the total time released or lost slots were held
	// (Released+ReleaseFailed+Lost of them).
	HoldSeconds float64
}

// Controlled is a budget.Budget on etcd with a machine's rollout
// controls: a maintenance window and max-unavailable as a count or a
// percentage. It counts what it does (Metrics). Pauses are honoured by
// every Budget's Acquire, with or without controls.
type Controlled struct {
	cfg  Config
	ctl  Controls
	base *Budget

	mu      sync.Mutex
	budgets map[int]*Budget
	joined  map[string]*Participation
	m       Metrics
	closed  bool
}

// NewControlled checks cfg and ctl and returns a Controlled budget. It
// sends no request.
func NewControlled(cfg Config, ctl Controls) (*Controlled, error) {
	if ctl.MaxUnavailable.Count < 0 || ctl.MaxUnavailable.Percent < 0 || ctl.MaxUnavailable.Percent > 100 {
		return nil, fmt.Errorf("etcdbudget: max-unavailable %+v out of range", ctl.MaxUnavailable)
	}
	if ctl.MaxUnavailable.Count > 0 {
		cfg.Max = ctl.MaxUnavailable.Count
	}
	base, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if ctl.Clock == nil {
		ctl.Clock = retry.RealClock()
	}
	if ctl.JoinPeriod == 0 {
		ctl.JoinPeriod = DefaultJoinPeriod
	}
	return &Controlled{cfg: base.cfg, ctl: ctl, base: base, budgets: map[int]*Budget{base.cfg.Max: base}, joined: map[string]*Participation{}}, nil
}

// Budget returns the underlying budget (for Status, Pause, Resume).
func (c *Controlled) Budget() *Budget { return c.base }

// Metrics returns a snapshot of the counters.
func (c *Controlled) Metrics() Metrics {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m
}

func (c *Controlled) emit(ev Event) {
	if c.ctl.OnEvent != nil {
		ev.Time = c.ctl.Clock.Now()
		if ev.Holder == "" {
			ev.Holder = c.cfg.Holder
		}
		c.ctl.OnEvent(ev)
	}
}

func (c *Controlled) update(f func(m *Metrics)) {
	c.mu.Lock()
	f(&c.m)
	c.mu.Unlock()
}

// budgetFor returns the Budget of max slots.
func (c *Controlled) budgetFor(max int) (*Budget, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b := c.budgets[max]; b != nil {
		return b, nil
	}
	cfg := c.cfg
	cfg.Max = max
	b, err := New(cfg)
	if err != nil {
		return nil, err
	}
	c.budgets[max] = b
	return b, nil
}

// participation returns this machine's registration for key, joining
// once.
func (c *Controlled) participation(ctx context.Context, key string) (*Participation, error) {
	c.mu.Lock()
	p := c.joined[key]
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, errors.New("etcdbudget: the controlled budget is closed")
	}
	if p != nil {
		return p, nil
	}
	p, err := c.base.Join(ctx, key)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.joined[key]; old != nil || c.closed {
		go p.Close()
		if old == nil {
			return nil, errors.New("etcdbudget: the controlled budget is closed")
		}
		return old, nil
	}
	c.joined[key] = p
	return p, nil
}

// Acquire waits for the window, resolves max-unavailable, and takes a
// slot of key; a slot granted once the window closed is held until it
// opens again.
func (c *Controlled) Acquire(ctx context.Context, key string, progress func(budget.Wait)) (budget.Slot, error) {
	start := c.ctl.Clock.Now()
	c.update(func(m *Metrics) { m.Waiting++ })
	slot, max, err := c.acquire(ctx, key, progress)
	waited := c.ctl.Clock.Now().Sub(start)
	c.update(func(m *Metrics) {
		m.Waiting--
		m.WaitSeconds += waited.Seconds()
		switch {
		case err != nil:
			m.Failed++
		default:
			m.Acquired++
			m.Holding++
			if _, ok := slot.(*unbudgeted); ok {
				m.Unbudgeted++
			}
		}
	})
	if err != nil {
		c.emit(Event{Kind: "failed", Key: key, Waited: waited, Max: max, Err: err})
		return nil, err
	}
	kind := "acquired"
	if _, ok := slot.(*unbudgeted); ok {
		kind = "unbudgeted"
	}
	c.emit(Event{Kind: kind, Key: slot.Key(), Holder: slot.Holder(), Waited: waited, Max: max})
	return c.wrap(slot, max), nil
}

func (c *Controlled) acquire(ctx context.Context, key string, progress func(budget.Wait)) (budget.Slot, int, error) {
	key, err := controlKey(key)
	if err != nil {
		return nil, 0, err
	}
	if err := c.awaitWindow(ctx, key, progress, nil); err != nil {
		return nil, 0, err
	}
	max := c.cfg.Max
	if c.ctl.MaxUnavailable.Percent > 0 {
		p, err := c.participation(ctx, key)
		if err != nil {
			return nil, 0, err
		}
		if max, err = p.ResolveAfter(ctx, c.ctl.MaxUnavailable, c.ctl.JoinPeriod); err != nil {
			return nil, 0, err
		}
	}
	b, err := c.budgetFor(max)
	if err != nil {
		return nil, max, err
	}
	s, err := b.Acquire(ctx, key, progress)
	if err != nil {
		return nil, max, err
	}
	if err := c.awaitWindow(ctx, key, progress, s.Lost()); err != nil {
		if lerr := s.Err(); lerr != nil {
			err = fmt.Errorf("%w: the slot was lost while waiting for the maintenance window: %w", budget.ErrUnavailable, lerr)
		}
		if held, ok := s.(*slot); ok {
			held.abandon() // it never acted: given back without waiting for an unreachable etcd
		} else {
			_ = s.Release(context.WithoutCancel(ctx))
		}
		return nil, max, err
	}
	return s, max, nil
}

// windowGate is the maintenance window as Fence checks it (see gate).
type windowGate struct {
	c   *Controlled
	key string
}

func (g windowGate) open() (bool, time.Duration) {
	w := g.c.ctl.Window
	if w == nil {
		return true, 0
	}
	now := g.c.ctl.Clock.Now()
	if !w.Contains(now) {
		return false, 0
	}
	closes := w.Closes(now)
	if closes.IsZero() {
		return true, 0
	}
	return true, closes.Sub(now)
}

func (g windowGate) wait(ctx context.Context, lost <-chan struct{}, progress func(budget.Wait)) error {
	return g.c.awaitWindow(ctx, g.key, progress, lost)
}

// awaitWindow waits until the window is open (at once without one). A
// slot kept meanwhile closes lost when it is lost, which ends the wait
// (an error wrapping budget.ErrUnavailable).
func (c *Controlled) awaitWindow(ctx context.Context, key string, progress func(budget.Wait), lost <-chan struct{}) error {
	w := c.ctl.Window
	if w == nil {
		return nil
	}
	counted := false
	for {
		now := c.ctl.Clock.Now()
		opens := w.Next(now)
		if opens.Equal(now) {
			return nil
		}
		if opens.IsZero() {
			return fmt.Errorf("%w: maintenance window %s never opens", budget.ErrRefused, w)
		}
		if !counted {
			c.update(func(m *Metrics) { m.WindowWaits++ })
			c.emit(Event{Kind: "window", Key: key, Opens: opens})
			if progress != nil {
				progress(budget.Wait{Key: key, Holders: []string{fmt.Sprintf("%s%s; opens %s", windowPrefix, w, opens.Format(time.RFC3339))}, Max: c.cfg.Max})
			}
			counted = true
		}
		t := c.ctl.Clock.NewTimer(opens.Sub(now))
		select {
		case <-t.C():
		case <-lost:
			t.Stop()
			return fmt.Errorf("%w: the slot was lost while waiting for the maintenance window", budget.ErrUnavailable)
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
}

// Close leaves the rollouts this budget joined (percentages). Slots still
// held are not released: their holders release them.
func (c *Controlled) Close() error {
	c.mu.Lock()
	c.closed = true
	joined := c.joined
	c.joined = map[string]*Participation{}
	c.mu.Unlock()
	var errs []error
	for _, p := range joined {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

// controlledSlot counts a slot's hold time, loss and release.
type controlledSlot struct {
	budget.Slot
	c        *Controlled
	since    time.Time
	max      int
	once     sync.Once // end
	relOnce  sync.Once // close(released)
	released chan struct{}
}

// fencingControlledSlot is a controlledSlot whose slot lives in etcd: it
// can be fenced, and records readiness.
type fencingControlledSlot struct {
	*controlledSlot
	s *slot
}

// Fence confirms the slot is still held and that acting is allowed now:
// the key not paused and, with a window, the window open (see
// budget.Fencer and the Budget's slot's Fence); outside the window
// it waits, holding the slot, until the window opens.
func (s fencingControlledSlot) Fence(ctx context.Context) (budget.Validity, error) {
	var g gate
	if s.c.ctl.Window != nil {
		g = windowGate{c: s.c, key: s.Key()}
	}
	return s.s.fence(ctx, g)
}

// MarkReady records that the services are ready again (see
// budget.Readier).
func (s fencingControlledSlot) MarkReady(ctx context.Context) error { return s.s.MarkReady(ctx) }

// Record appends act to the key's history and halts the key when act's
// failure reaches Config.HaltAfter (see the Budget's slot's Record and
// budget.Recorder), counting and reporting it ("recorded", "halted",
// "record-failed").
func (s fencingControlledSlot) Record(ctx context.Context, act budget.Act) (*budget.Halt, error) {
	h, halted, err := s.s.b.record(ctx, s.s.key, act)
	act.Key = s.s.key
	if err != nil {
		s.c.update(func(m *Metrics) { m.RecordFailures++ })
		s.c.emit(Event{Kind: "record-failed", Key: s.Key(), Act: &act, Max: s.max, Err: err})
		return nil, err
	}
	s.c.update(func(m *Metrics) {
		m.Records++
		if halted {
			m.Halts++
		}
	})
	s.c.emit(Event{Kind: "recorded", Key: s.Key(), Act: &act, Max: s.max})
	if halted {
		s.c.emit(Event{Kind: "halted", Key: s.Key(), Act: &act, Halt: h, Max: s.max})
	}
	return h, nil
}

var (
	_ budget.Recorder = fencingControlledSlot{}
	_ budget.Fencer   = fencingControlledSlot{}
)

func (c *Controlled) wrap(held budget.Slot, max int) budget.Slot {
	s := &controlledSlot{Slot: held, c: c, since: c.ctl.Clock.Now(), max: max, released: make(chan struct{})}
	go s.watch()
	if es, ok := held.(*slot); ok {
		return fencingControlledSlot{controlledSlot: s, s: es}
	}
	return s
}

// watch counts the slot's loss, until it is released.
func (s *controlledSlot) watch() {
	select {
	case <-s.released:
	case <-s.Lost():
		s.end(true, s.Slot.Err())
	}
}

// end counts the slot's end once: lost, or released (err: the release's).
func (s *controlledSlot) end(lost bool, err error) {
	s.once.Do(func() {
		held := s.c.ctl.Clock.Now().Sub(s.since)
		s.c.update(func(m *Metrics) {
			m.Holding--
			m.HoldSeconds += held.Seconds()
			switch {
			case lost:
				m.Lost++
			case err != nil:
				m.ReleaseFailed++
			default:
				m.Released++
			}
		})
		kind := "released"
		if lost {
			kind = "lost"
		}
		s.c.emit(Event{Kind: kind, Key: s.Key(), Holder: s.Holder(), Held: held, Max: s.max, Err: err})
	})
}

// Release gives the slot back.
func (s *controlledSlot) Release(ctx context.Context) error {
	err := s.Slot.Release(ctx)
	s.relOnce.Do(func() { close(s.released) })
	s.end(false, err)
	return err
}
