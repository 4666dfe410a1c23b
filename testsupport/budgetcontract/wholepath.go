package budgetcontract

// The whole-path cases: the budget as snapsvc drives it, on real
// machines' worth of pieces (a snapsvc Client and a fake snapd per
// machine, the backend's participants as their budgets), judged from
// snapd's own records: every change a machine's snapd made must lie within
// a slot that machine held (from before its spawn to after it was ready),
// every grant an operation reported done must have led to exactly one
// change, and no more than Max machines' changes may overlap.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Unbudgeted is implemented by harnesses that can build participants that
// grant slots without their coordination service.
type Unbudgeted interface {
	// NewWithoutCluster returns a participant whose budget is told that no
	// cluster exists yet (etcdbudget and sqlbudget: ClusterExists false).
	NewWithoutCluster(t *testing.T, o Options) Participant
	// NewFailingOpen returns a participant that fails open (FailOpen) and
	// is cut off from its coordination service from the start.
	NewFailingOpen(t *testing.T, o Options) Participant
}

// RunWholePath runs the whole-path cases against h (each a subtest):
//
//	every-grant-restarts-once  machines restarting one key, Max 1: each restart done,
//	                           one change each, none overlapping, each within its slot
//	held-until-ready           a call that ends while its change runs keeps its slot
//	                           until snapd shows the change ready; the next machine's
//	                           change starts after it
//	lost-slot-acts-not         a holder cut off for good after its grant sends nothing,
//	                           and the next machine restarts once its slot expired
//	unbudgeted-grants-restart  slots granted without the coordination service (no
//	                           cluster yet, fail open) lead to their restart (needs
//	                           Unbudgeted)
//	halt-stops-the-rollout     five machines whose restart never makes the service
//	                           ready: one restarts, the key halts itself naming it,
//	                           nobody restarts while halted; resumed (and the fault
//	                           fixed), the other four restart one at a time
//	admission-holds-the-rollout  an admission check that refuses (a mon down): no
//	                           restart until it agrees, then all three, one at a time
//	history-is-snapds-record   after a five-machine rollout the key's history holds
//	                           five acts whose change ids and times are the fake
//	                           snapds' own
func RunWholePath(t *testing.T, h Harness, cfg Config) {
	if cfg.Key == nil {
		n := 0
		var mu sync.Mutex
		cfg.Key = func(t *testing.T) string {
			mu.Lock()
			defer mu.Unlock()
			n++
			return fmt.Sprintf("whole-%d-%d.svc", time.Now().UnixNano(), n)
		}
	}
	c := &suite{h: h, cfg: cfg}
	t.Run("every-grant-restarts-once", c.everyGrantRestartsOnce)
	t.Run("held-until-ready", c.heldUntilReady)
	t.Run("lost-slot-acts-not", c.lostSlotActsNot)
	t.Run("unbudgeted-grants-restart", c.unbudgetedGrantsRestart)
	t.Run("halt-stops-the-rollout", c.haltStopsTheRollout)
	t.Run("admission-holds-the-rollout", c.admissionHoldsTheRollout)
	t.Run("history-is-snapds-record", c.historyIsSnapdsRecord)
	t.Run("refreshes-one-at-a-time", c.refreshesOneAtATime)
}

// wholeSnap is the snap every machine's fake snapd has; its service's
// restart is what the cases budget.
const (
	wholeSnap    = "svcdemo"
	wholeService = wholeSnap + ".svc"
)

// machine is one machine of a whole-path case: its snapd, its Client on
// participant p, and its budget's events.
type machine struct {
	name string
	srv  *fake.Server
	c    *snapsvc.Client
	p    Participant
	kind string // the kind of the changes its acts make (judge)

	mu      sync.Mutex
	evs     []snapsvc.BudgetEvent
	on      map[string]func() // called (once) at the first event of a kind
	changed chan struct{}     // closed and replaced at every event
}

// newMachine builds a machine whose restarts of wholeService take key's
// slots from p; the service restarts in about took.
func newMachine(t *testing.T, name string, p Participant, key string, took time.Duration) *machine {
	t.Helper()
	return newMachineWith(t, name, p, key, took, nil)
}

// newMachineWith is newMachine with its budget options changed by set.
func newMachineWith(t *testing.T, name string, p Participant, key string, took time.Duration, set func(*snapsvc.BudgetOptions), more ...fake.Option) *machine {
	t.Helper()
	// The machine's daemon runs as root; its test as whoever runs it.
	srv := fake.NewServer(t, append([]fake.Option{fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: wholeSnap, Apps: []fake.App{
		{Name: "svc", Daemon: "simple", Enabled: true, Active: true, StartDuration: took / 2, StopDuration: took / 2}}})}, more...)...)
	m := &machine{name: name, srv: srv, p: p, kind: "service-control", on: map[string]func(){}, changed: make(chan struct{})}
	opts := snapsvc.BudgetOptions{Key: func(string) string { return key }, Progress: m.progress, MaxHold: time.Minute, ReleaseTimeout: 2 * time.Second}
	if set != nil {
		set(&opts)
	}
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithSnapSocket(srv.SnapSocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(p, opts))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	m.c = c
	return m
}

func (m *machine) progress(ev snapsvc.BudgetEvent) {
	m.mu.Lock()
	m.evs = append(m.evs, ev)
	f := m.on[ev.Kind]
	delete(m.on, ev.Kind)
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
	if f != nil {
		f()
	}
}

// atFirst calls f at the machine's first budget event of kind.
func (m *machine) atFirst(kind string, f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on[kind] = f
}

// span is when the machine held its slot: from its grant to its release
// (to zero while still held).
type span struct{ from, to time.Time }

// held returns the machine's slot spans, from its events.
func (m *machine) held() []span {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []span
	for _, ev := range m.evs {
		switch ev.Kind {
		case snapsvc.BudgetAcquired:
			out = append(out, span{from: ev.Time})
		case snapsvc.BudgetReleased:
			if n := len(out); n > 0 && out[n-1].to.IsZero() {
				out[n-1].to = ev.Time
			}
		}
	}
	return out
}

// released waits until the machine has given back every slot it took.
func (m *machine) released(t *testing.T, ctx context.Context) {
	t.Helper()
	for {
		m.mu.Lock()
		changed := m.changed
		m.mu.Unlock()
		spans := m.held()
		if len(spans) > 0 && !slices.ContainsFunc(spans, func(s span) bool { return s.to.IsZero() }) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: slot never given back (spans %+v)", m.name, spans)
		case <-changed:
		}
	}
}

// changes returns the service-control changes the machine's snapd made.
func (m *machine) changes() []fake.ChangeInfo {
	var out []fake.ChangeInfo
	for _, chg := range m.srv.Changes() {
		if chg.Kind == m.kind {
			out = append(out, chg)
		}
	}
	return out
}

// judge checks, from the snapd records of machines, that each machine's
// changes lie within a slot it held, that each made want changes, and that
// no more than max machines' changes overlap.
func judge(t *testing.T, machines []*machine, want, max int) {
	t.Helper()
	type iv struct {
		who      string
		from, to time.Time
	}
	var ivs []iv
	for _, m := range machines {
		chgs := m.changes()
		if len(chgs) != want {
			t.Errorf("%s: snapd made %d changes, want %d", m.name, len(chgs), want)
		}
		spans := m.held()
		for _, chg := range chgs {
			if chg.ReadyTime.IsZero() {
				t.Errorf("%s: change %s never became ready", m.name, chg.ID)
				continue
			}
			ivs = append(ivs, iv{m.name, chg.SpawnTime, chg.ReadyTime})
			covered := slices.ContainsFunc(spans, func(s span) bool {
				return !s.from.After(chg.SpawnTime) && !s.to.IsZero() && !s.to.Before(chg.ReadyTime)
			})
			if !covered {
				t.Errorf("%s: change %s (spawned %s, ready %s) not within a held slot (held %+v)", m.name, chg.ID,
					chg.SpawnTime.Format(time.StampMicro), chg.ReadyTime.Format(time.StampMicro), spans)
			}
		}
	}
	for _, a := range ivs {
		n := 0
		for _, b := range ivs {
			if !b.from.After(a.from) && b.to.After(a.from) {
				n++
			}
		}
		if n > max {
			t.Errorf("%d machines' changes overlap at %s (max %d): %+v", n, a.from.Format(time.StampMicro), max, ivs)
		}
	}
}

// everyGrantRestartsOnce: three machines restart one key, Max 1, at once.
func (c *suite) everyGrantRestartsOnce(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	var machines []*machine
	for i := range 3 {
		name := fmt.Sprintf("m%d", i)
		machines = append(machines, newMachine(t, name, c.h.New(t, Options{Holder: name, Max: 1}), key, 200*time.Millisecond))
	}
	var wg sync.WaitGroup
	for _, m := range machines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := m.c.Restart(ctx, []string{wholeService}, snapsvc.RestartOptions{})
			if err != nil || res.Status != "Done" {
				t.Errorf("%s: restart: %+v, %v", m.name, res, err)
			}
		}()
	}
	wg.Wait()
	for _, m := range machines {
		m.released(t, ctx)
	}
	judge(t, machines, 1, 1)
}

// refreshesOneAtATime: three machines asked to refresh their snap at
// once (the store offers a new revision), Max 1: one refresh change at a
// time, each within its machine's slot, the services ready between
// (issue 45).
func (c *suite) refreshesOneAtATime(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	var machines []*machine
	for i := range 3 {
		name := fmt.Sprintf("m%d", i)
		m := newMachineWith(t, name, c.h.New(t, Options{Holder: name, Max: 1}), key, 200*time.Millisecond, nil,
			fake.WithStoreRevision(wholeSnap, fake.StoreRevision{Revision: "2"}))
		m.kind = "refresh-snap"
		machines = append(machines, m)
	}
	var wg sync.WaitGroup
	for _, m := range machines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := m.c.Refresh(ctx, wholeSnap, snapsvc.RefreshOptions{})
			if err != nil || res.Status != "Done" || res.NoUpdate {
				t.Errorf("%s: refresh: %+v, %v", m.name, res, err)
			}
		}()
	}
	wg.Wait()
	for _, m := range machines {
		m.released(t, ctx)
		if st, _ := m.srv.Service(wholeSnap, "svc"); !st.Active {
			t.Errorf("%s: svc inactive after its refresh", m.name)
		}
	}
	judge(t, machines, 1, 1)
}

// heldUntilReady: a call that ends while its change runs keeps its slot in
// the background until snapd's records show the change ready; the next
// machine's restart, queued meanwhile, starts after it.
func (c *suite) heldUntilReady(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	a := newMachine(t, "a", c.h.New(t, Options{Holder: "a", Max: 1}), key, 2*time.Second)
	b := newMachine(t, "b", c.h.New(t, Options{Holder: "b", Max: 1}), key, 200*time.Millisecond)
	short, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	_, err := a.c.Restart(short, []string{wholeService}, snapsvc.RestartOptions{})
	cancel()
	var oe *snapsvc.OpError
	if !errors.As(err, &oe) || oe.ChangeID == "" {
		t.Fatalf("a: restart: %v; want its deadline while its change runs", err)
	}
	if res, err := b.c.Restart(ctx, []string{wholeService}, snapsvc.RestartOptions{}); err != nil || res.Status != "Done" {
		t.Fatalf("b: restart: %+v, %v", res, err)
	}
	a.released(t, ctx)
	b.released(t, ctx)
	judge(t, []*machine{a, b}, 1, 1)
}

// lostSlotActsNot: a holder cut off for good right after its grant sends
// nothing (its fence cannot confirm the slot), and the next machine gets
// the slot once it expired and restarts.
func (c *suite) lostSlotActsNot(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	pa := c.h.New(t, Options{Holder: "a", Max: 1})
	a := newMachine(t, "a", pa, key, 200*time.Millisecond)
	b := newMachine(t, "b", c.h.New(t, Options{Holder: "b", Max: 1}), key, 200*time.Millisecond)
	a.atFirst(snapsvc.BudgetAcquired, pa.Vanish)
	_, err := a.c.Restart(ctx, []string{wholeService}, snapsvc.RestartOptions{})
	var be *snapsvc.BudgetError
	if !errors.As(err, &be) {
		t.Fatalf("a, cut off after its grant: %v; want a *BudgetError (nothing sent)", err)
	}
	if res, err := b.c.Restart(ctx, []string{wholeService}, snapsvc.RestartOptions{}); err != nil || res.Status != "Done" {
		t.Fatalf("b: restart: %+v, %v", res, err)
	}
	if n := len(a.changes()); n != 0 {
		t.Errorf("a made %d changes after losing its slot, want 0", n)
	}
	b.released(t, ctx)
	judge(t, []*machine{b}, 1, 1)
}

// unbudgetedGrantsRestart: a slot granted without the coordination service
// walks the same path: its restart is sent, once.
func (c *suite) unbudgetedGrantsRestart(t *testing.T) {
	u, ok := c.h.(Unbudgeted)
	if !ok {
		t.Skip("the harness cannot build unbudgeted participants (budgetcontract.Unbudgeted)")
	}
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	var machines []*machine
	for _, p := range []struct {
		name string
		p    Participant
	}{{"no-cluster", u.NewWithoutCluster(t, Options{Holder: "no-cluster", Max: 1})}, {"fail-open", u.NewFailingOpen(t, Options{Holder: "fail-open", Max: 1})}} {
		m := newMachine(t, p.name, p.p, key, 100*time.Millisecond)
		res, err := m.c.Restart(ctx, []string{wholeService}, snapsvc.RestartOptions{})
		if err != nil || res.Status != "Done" {
			t.Errorf("%s: restart: %+v, %v", p.name, res, err)
		}
		m.released(t, ctx)
		machines = append(machines, m)
	}
	judge(t, machines, 1, 2) // unbudgeted: nothing bounds them
}
