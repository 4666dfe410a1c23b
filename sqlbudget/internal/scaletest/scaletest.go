// Package scaletest runs sqlbudget at fleet scale on a database the caller
// opens (SQLite in-process, a real dqlite cluster): one holder, a rollout
// of machines queued at the front (each a snapsvc client with a budget of
// its own, restarting through a fake snapd of its own), and many waiters
// behind them, every participant a Budget of its own, as machines are.
// It measures what the database carries while the queue waits
// (transactions a second, their latency), the hand-overs, the holders'
// renewals, and judges the rollout from the fake snapds' change records
// (rollouttest): never more restarting at once than the budget allows.
// It is test support for sqlbudget's tests and benchmark, not API.
package scaletest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/testsupport/benchkit"
	"github.com/snapsvc/snapsvc/testsupport/rollouttest"
)

// Config is one run.
type Config struct {
	// Backend names the database in the results ("SQLite", "dqlite, 3 nodes").
	Backend string
	// Open returns the transaction function of a new connection to the
	// database (one machine's handle); the test's cleanup closes it.
	Open func(t testing.TB) sqlbudget.TxFunc
	// Waiters queue behind the rollout; PerConn of them share one
	// connection (default 50), each with a Budget of its own.
	Waiters, PerConn int
	// Machines restart one after the other through the budget, queued at
	// the front: each one is a hand-over (default 10). Their service takes
	// Step to stop and Step to start (default 300ms): by the next
	// hand-over, the waiter next in line has moved up, as in a real
	// rollout.
	Machines int
	Step     time.Duration
	// TTL of every participant (default sqlbudget.DefaultTTL); Steady is
	// how long the holder holds while the queue waits and is measured
	// (default 3×TTL, so that its row is renewed several times).
	TTL, Steady time.Duration
	// Configure adjusts every participant's Config.
	Configure func(*sqlbudget.Config)
}

// Result is what one run measured.
type Result struct {
	Backend string
	// Waiters is how many waited behind the holder: the machines and the
	// waiters behind them.
	Waiters int
	// Formed is how long the waiters behind the machines took to queue
	// (each reported its wait).
	Formed time.Duration
	// Tx is the transactions (attempts) the database served while the
	// queue waited, Window how long that was; TxP50 and TxP99 their
	// latency.
	Tx           int64
	Window       time.Duration
	TxP50, TxP99 time.Duration
	// HandOvers are the times from a Release's call to the next holder's
	// Acquire returning, in queue order.
	HandOvers []time.Duration
	// Renewals of the holders' rows, RenewalsMissed those not answered
	// within TTL/3; Lost counts slots lost.
	Renewals, RenewalsMissed uint64
	Lost                     int
	// EarlyGrants counts grants made while the slot was held by someone
	// who had not begun to release it, as the budgets' own records show
	// (an Acquire returning before the previous holder called Release),
	// and grants to waiters behind the rollout.
	EarlyGrants int
	// Restarts and Peak are from the fake snapds' change records: how
	// many restarts, and the most restarting or not ready at once.
	Restarts, Peak int
}

// TxPerSecond is the database's load while the queue waited.
func (r Result) TxPerSecond() float64 { return float64(r.Tx) / r.Window.Seconds() }

// TxPerWaiter is TxPerSecond shared among the waiters.
func (r Result) TxPerWaiter() float64 { return r.TxPerSecond() / float64(max(r.Waiters, 1)) }

// recorder counts and times transaction attempts while on.
type recorder struct {
	on    atomic.Bool
	n     atomic.Int64
	mu    sync.Mutex
	times []time.Duration
}

func (r *recorder) wrap(tx sqlbudget.TxFunc) sqlbudget.TxFunc {
	return func(ctx context.Context, f func(context.Context, *sql.Tx) error) error {
		if !r.on.Load() {
			return tx(ctx, f)
		}
		start := time.Now()
		err := tx(ctx, f)
		d := time.Since(start)
		r.n.Add(1)
		r.mu.Lock()
		r.times = append(r.times, d)
		r.mu.Unlock()
		return err
	}
}

// span is one slot's life as its budget saw it.
type span struct {
	who                string
	granted, releasing time.Time
}

// spans records grants and the calls of Release.
type spans struct {
	mu  sync.Mutex
	all []span
}

func (s *spans) add(sp span) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = append(s.all, sp)
}

// recorded wraps a Budget: it notes when each Acquire returned a slot and
// when its Release was called.
type recorded struct {
	budget.Budget
	who string
	log *spans
}

func (r *recorded) Acquire(ctx context.Context, key string, progress func(budget.Wait)) (budget.Slot, error) {
	s, err := r.Budget.Acquire(ctx, key, progress)
	if err != nil {
		return nil, err
	}
	return &recordedSlot{Slot: s, sp: span{who: r.who, granted: time.Now()}, log: r.log}, nil
}

type recordedSlot struct {
	budget.Slot
	sp   span
	log  *spans
	once sync.Once
}

func (s *recordedSlot) Fence(ctx context.Context) (budget.Validity, error) {
	return s.Slot.(budget.Fencer).Fence(ctx)
}

func (s *recordedSlot) MarkReady(ctx context.Context) error {
	return s.Slot.(budget.Readier).MarkReady(ctx)
}

func (s *recordedSlot) Release(ctx context.Context) error {
	s.once.Do(func() {
		s.sp.releasing = time.Now()
		s.log.add(s.sp)
	})
	return s.Slot.Release(ctx)
}

// Run runs cfg and returns what it measured. It fails t on what must
// never happen: a participant's error, a slot lost, a waiter that never
// queued, a restart that did not happen.
func Run(t testing.TB, cfg Config) Result {
	t.Helper()
	if cfg.PerConn == 0 {
		cfg.PerConn = 50
	}
	if cfg.Machines == 0 {
		cfg.Machines = 10
	}
	if cfg.Step == 0 {
		cfg.Step = 300 * time.Millisecond
	}
	if cfg.TTL == 0 {
		cfg.TTL = sqlbudget.DefaultTTL
	}
	if cfg.Steady == 0 {
		cfg.Steady = 3 * cfg.TTL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	key := fmt.Sprintf("scale-%d.svc", time.Now().UnixNano())
	rec := &recorder{}
	log := &spans{}
	var budgets []*sqlbudget.Budget
	newBudget := func(tx sqlbudget.TxFunc, holder string) *sqlbudget.Budget {
		c := sqlbudget.Config{Tx: rec.wrap(tx), Holder: holder, TTL: cfg.TTL, ClockSkew: cfg.TTL / 10, LockDelay: -1}
		if cfg.Configure != nil {
			cfg.Configure(&c)
		}
		b, err := sqlbudget.New(c)
		if err != nil {
			t.Fatal(err)
		}
		budgets = append(budgets, b)
		return b
	}

	// The holder.
	hb := newBudget(cfg.Open(t), "holder")
	holder := &recorded{Budget: hb, who: "holder", log: log}
	hs, err := holder.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hs.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatal(err)
	}

	// The rollout's machines, queued at the front in order.
	type machine struct {
		b    *sqlbudget.Budget
		srv  *fake.Server
		c    *snapsvc.Client
		done chan error
	}
	var ms []*machine
	for i := range cfg.Machines {
		name := fmt.Sprintf("machine-%d", i+1)
		b := newBudget(cfg.Open(t), name)
		// microovn's daemon runs as root; the test as whoever runs it.
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "microovn", Apps: []fake.App{{Name: "ovn-northd", Daemon: "simple", Enabled: true, Active: true,
			StartDuration: cfg.Step, StopDuration: cfg.Step}}}))
		queued := make(chan struct{})
		var once sync.Once
		c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
			snapsvc.WithRestartBudget(&recorded{Budget: b, who: name, log: log}, snapsvc.BudgetOptions{
				Key: func(string) string { return key },
				Progress: func(ev snapsvc.BudgetEvent) {
					if ev.Kind == snapsvc.BudgetWaiting {
						once.Do(func() { close(queued) })
					}
				},
			}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		m := &machine{b: b, srv: srv, c: c, done: make(chan error, 1)}
		go func() {
			_, err := c.Restart(ctx, []string{"microovn.ovn-northd"}, snapsvc.RestartOptions{})
			m.done <- err
		}()
		select {
		case <-queued:
		case err := <-m.done:
			t.Fatalf("%s did not queue: %v", name, err)
		}
		ms = append(ms, m)
	}

	// The waiters behind them.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var queued, behind sync.WaitGroup
	var served []time.Time // grants to waiters behind the rollout
	var failures []error
	var fmu sync.Mutex
	formStart := time.Now()
	var tx sqlbudget.TxFunc
	for i := range cfg.Waiters {
		if i%cfg.PerConn == 0 {
			tx = cfg.Open(t)
		}
		b := newBudget(tx, fmt.Sprintf("waiter-%d", i+1))
		queued.Add(1)
		behind.Add(1)
		go func() {
			defer behind.Done()
			var once sync.Once
			s, err := b.Acquire(wctx, key, func(budget.Wait) { once.Do(queued.Done) })
			once.Do(queued.Done)
			switch {
			case err == nil:
				fmu.Lock()
				served = append(served, time.Now())
				fmu.Unlock()
				s.Release(context.WithoutCancel(ctx))
			case wctx.Err() == nil:
				fmu.Lock()
				failures = append(failures, err)
				fmu.Unlock()
			}
		}()
	}
	queued.Wait()
	formed := time.Duration(0)
	if cfg.Waiters > 0 {
		formed = time.Since(formStart)
	}
	res := Result{Backend: cfg.Backend, Waiters: cfg.Machines + cfg.Waiters, Formed: formed}
	fmu.Lock()
	for _, err := range failures {
		t.Errorf("a waiter failed while queueing: %v", err)
	}
	fmu.Unlock()

	// The queue waits: measured.
	rec.on.Store(true)
	start := time.Now()
	time.Sleep(cfg.Steady) // the measurement's length, not a synchronisation
	rec.on.Store(false)
	res.Window = time.Since(start)
	res.Tx = rec.n.Load()
	rec.mu.Lock()
	res.TxP50, _ = benchkit.Percentile(rec.times, 50)
	res.TxP99, _ = benchkit.Percentile(rec.times, 99)
	rec.mu.Unlock()

	// The rollout: each release hands the slot to the next machine.
	if err := hs.Release(ctx); err != nil {
		t.Errorf("holder's release: %v", err)
	}
	for i, m := range ms {
		select {
		case err := <-m.done:
			if err != nil {
				t.Errorf("machine-%d: restart: %v", i+1, err)
			}
		case <-ctx.Done():
			t.Fatalf("machine-%d: no restart: %v", i+1, ctx.Err())
		}
	}
	for _, m := range ms {
		m.c.Close() // its release, if still in the background
	}
	stop()
	behind.Wait()

	fmu.Lock()
	for _, err := range failures {
		t.Errorf("a waiter failed: %v", err)
	}
	fmu.Unlock()
	for _, b := range budgets {
		m := b.Metrics()
		res.Renewals += m.Renewals
		res.RenewalsMissed += m.RenewalsMissed
		res.Lost += int(m.Lost)
	}
	log.mu.Lock()
	sps := slices.Clone(log.all)
	log.mu.Unlock()
	slices.SortFunc(sps, func(a, b span) int { return a.granted.Compare(b.granted) })
	if len(sps) > 0 {
		// A waiter behind the rollout served before its last machine
		// began to release jumped the queue.
		for _, at := range served {
			if at.Before(sps[len(sps)-1].releasing) {
				res.EarlyGrants++
				t.Errorf("a waiter queued behind the rollout was granted the slot %s before its last machine released", sps[len(sps)-1].releasing.Sub(at))
			}
		}
	}
	for i := 1; i < len(sps); i++ {
		if sps[i].granted.Before(sps[i-1].releasing) {
			res.EarlyGrants++
			t.Errorf("%s granted %s before %s began to release", sps[i].who, sps[i-1].releasing.Sub(sps[i].granted), sps[i-1].who)
		}
		res.HandOvers = append(res.HandOvers, sps[i].granted.Sub(sps[i-1].releasing))
	}
	var sites []rollouttest.Site
	for i, m := range ms {
		sites = append(sites, rollouttest.Site{Machine: fmt.Sprintf("machine-%d", i+1), Server: m.srv})
	}
	ivs := rollouttest.Intervals(sites)
	res.Restarts, res.Peak = len(ivs), rollouttest.MaxConcurrent(ivs)
	if res.Restarts != cfg.Machines {
		t.Errorf("%d restarts recorded by the machines' snapds, want %d", res.Restarts, cfg.Machines)
	}
	if len(res.HandOvers) != cfg.Machines {
		t.Errorf("%d hand-overs, want %d", len(res.HandOvers), cfg.Machines)
	}
	return res
}

// Header is the Markdown table's header (Row's columns).
const Header = "| backend | waiters | queue formed | tx/s while waiting | tx/s per waiter | tx p50 / p99 | hand-over p50 / p99 | holder renewals missed | early grants | restarts, peak (snapd) |\n" +
	"|---|---|---|---|---|---|---|---|---|---|"

// Row is r as a row of the Markdown table.
func (r Result) Row() string {
	p50, ok50 := benchkit.Percentile(r.HandOvers, 50)
	p99, ok99 := benchkit.Percentile(r.HandOvers, 99)
	return fmt.Sprintf("| %s | %s | %s | %.1f | %.4f | %s / %s | %s / %s | %d of %d | %d | %d, %d |",
		r.Backend, group(r.Waiters), benchkit.FormatDuration(r.Formed, r.Formed > 0), r.TxPerSecond(), r.TxPerWaiter(),
		benchkit.FormatDuration(r.TxP50, r.Tx > 0), benchkit.FormatDuration(r.TxP99, r.Tx > 0),
		benchkit.FormatDuration(p50, ok50), benchkit.FormatDuration(p99, ok99),
		r.RenewalsMissed, r.Renewals, r.EarlyGrants, r.Restarts, r.Peak)
}

// group prints n with a thousands separator (1,000).
func group(n int) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Report reports r's figures as the benchmark's metrics.
func Report(b *testing.B, r Result) {
	p50, _ := benchkit.Percentile(r.HandOvers, 50)
	p99, _ := benchkit.Percentile(r.HandOvers, 99)
	b.ReportMetric(r.TxPerSecond(), "tx/s")
	b.ReportMetric(r.TxPerWaiter(), "tx/s/waiter")
	b.ReportMetric(float64(r.TxP99)/float64(time.Millisecond), "tx-p99-ms")
	b.ReportMetric(float64(p50)/float64(time.Millisecond), "handover-p50-ms")
	b.ReportMetric(float64(p99)/float64(time.Millisecond), "handover-p99-ms")
	b.ReportMetric(float64(r.RenewalsMissed), "renewals-missed")
	b.ReportMetric(float64(r.EarlyGrants), "early-grants")
	b.ReportMetric(0, "ns/op")
}

// ExitConfig is one run of Exits.
type ExitConfig struct {
	// Backend names the database; Open opens a connection, as in Config.
	Backend string
	Open    func(t testing.TB) sqlbudget.TxFunc
	// Waiters queue behind a holder, PerConn of them to a connection
	// (default 50), each a Budget of its own.
	Waiters, PerConn int
	// Leave is which of them leave at once (their contexts end), by place:
	// "first" (the first Share of the queue: a common deadline ends the
	// first arrivals' waits first), "random" (a Share drawn at random,
	// seeded), or "dead-head" (the first waiter is cut off from the
	// database for good, as a crash: its row stays).
	Leave string
	Share float64
	Seed  uint64
	// TTL of every participant (default sqlbudget.DefaultTTL); Settle is
	// how long the queue waits before the exits (default 2×TTL), so that
	// the waiters far back poll at their long intervals.
	TTL, Settle time.Duration
}

// ExitResult is what a run of Exits measured.
type ExitResult struct {
	Backend, Leave  string
	Waiters, Stayed int
	// Poll is the participants' Config.Poll. HandOver is from the
	// holder's Release (once every leaver's Acquire had returned) to the
	// next grant; InOrder says the first waiter still queued took it.
	Poll     time.Duration
	HandOver time.Duration
	InOrder  bool
}

// Polls is HandOver in Polls.
func (r ExitResult) Polls() float64 { return float64(r.HandOver) / float64(r.Poll) }

// ExitHeader is the Markdown table's header (ExitResult.Row's columns).
const ExitHeader = "| backend | waiters | who left or died | stayed | free slot taken after | in Polls | by the first in line |\n|---|---|---|---|---|---|---|"

// Row is r as a row of the Markdown table.
func (r ExitResult) Row() string {
	first := "no"
	if r.InOrder {
		first = "yes"
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s | %.2f | %s |", r.Backend, group(r.Waiters), r.Leave, group(r.Stayed),
		benchkit.FormatDuration(r.HandOver, true), r.Polls(), first)
}

// Exits queues cfg.Waiters behind a holder, lets them settle, makes some
// of them leave at once (or the first die), then has the holder release,
// and measures how long the free slot stays free. Every waiter that
// stayed is served in turn afterwards (the holder of each slot releases
// at once), and every participant's failure fails t.
func Exits(t testing.TB, cfg ExitConfig) ExitResult {
	t.Helper()
	if cfg.PerConn == 0 {
		cfg.PerConn = 50
	}
	if cfg.TTL == 0 {
		cfg.TTL = sqlbudget.DefaultTTL
	}
	if cfg.Settle == 0 {
		cfg.Settle = 2 * cfg.TTL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	key := fmt.Sprintf("exits-%d.svc", time.Now().UnixNano())
	poll := min(cfg.TTL/8, 250*time.Millisecond) // Config.Poll's default
	newBudget := func(tx sqlbudget.TxFunc, holder string) *sqlbudget.Budget {
		b, err := sqlbudget.New(sqlbudget.Config{Tx: tx, Holder: holder, TTL: cfg.TTL, ClockSkew: cfg.TTL / 10, LockDelay: -1})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	hb := newBudget(cfg.Open(t), "holder")
	hs, err := hb.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	var lostAt atomic.Int64 // since began, when the holder saw its slot lost
	go func() {
		select {
		case <-hs.Lost():
			lostAt.Store(int64(time.Since(began)))
		case <-ctx.Done():
		}
	}()

	type waiter struct {
		i      int
		cancel context.CancelFunc
		dead   atomic.Bool
		out    chan error
	}
	leaves := make([]bool, cfg.Waiters)
	switch cfg.Leave {
	case "first":
		for i := range int(cfg.Share * float64(cfg.Waiters)) {
			leaves[i] = true
		}
	case "random":
		rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed))
		for _, i := range rng.Perm(cfg.Waiters)[:int(cfg.Share*float64(cfg.Waiters))] {
			leaves[i] = true
		}
	case "dead-head":
	default:
		t.Fatalf("scaletest: unknown exit pattern %q", cfg.Leave)
	}
	var grants sync.Mutex
	var order []int // waiters in the order they were granted
	var grantedAt []time.Time
	firstGrant := make(chan struct{})
	var firstOnce sync.Once
	var ws []*waiter
	var tx sqlbudget.TxFunc
	for i := range cfg.Waiters {
		if i%cfg.PerConn == 0 {
			tx = cfg.Open(t)
		}
		w := &waiter{i: i, out: make(chan error, 1)}
		inner := tx
		b := newBudget(func(ctx context.Context, f func(context.Context, *sql.Tx) error) error {
			if w.dead.Load() {
				return errors.New("scaletest: this waiter died")
			}
			return inner(ctx, f)
		}, fmt.Sprintf("waiter-%d", i+1))
		wctx, wcancel := context.WithCancel(ctx)
		w.cancel = wcancel
		queued := make(chan struct{})
		var once sync.Once
		go func() {
			s, err := b.Acquire(wctx, key, func(budget.Wait) { once.Do(func() { close(queued) }) })
			if err == nil {
				grants.Lock()
				order, grantedAt = append(order, w.i), append(grantedAt, time.Now())
				grants.Unlock()
				firstOnce.Do(func() { close(firstGrant) })
				err = s.Release(context.WithoutCancel(ctx))
			}
			w.out <- err
		}()
		select {
		case <-queued:
		case err := <-w.out:
			t.Fatalf("waiter-%d did not queue: %v", i+1, err)
		}
		ws = append(ws, w)
	}
	formed := time.Since(began)
	time.Sleep(cfg.Settle) // the queue's steady state, not a synchronisation

	leaving := time.Since(began)
	stayed := 0
	switch cfg.Leave {
	case "dead-head":
		ws[0].dead.Store(true)
		leaves[0] = true
		stayed = cfg.Waiters - 1
	default:
		for i, w := range ws {
			if leaves[i] {
				w.cancel()
			}
		}
		for i, w := range ws {
			if leaves[i] {
				if err := <-w.out; !errors.Is(err, context.Canceled) {
					t.Errorf("waiter-%d, leaving: %v", i+1, err)
				}
			} else {
				stayed++
			}
		}
	}
	select {
	case <-hs.Lost():
		m := hb.Metrics()
		t.Fatalf("the holder lost its slot %s after its grant (the queue formed at %s, the exits began at %s), before its release (%d of %d renewals late): %v",
			time.Duration(lostAt.Load()), formed, leaving, m.RenewalsMissed, m.Renewals, hs.Err())
	default:
	}
	released := time.Now()
	if err := hs.Release(ctx); err != nil {
		t.Fatal(err)
	}
	res := ExitResult{Backend: cfg.Backend, Leave: fmt.Sprintf("%s %.0f%%", cfg.Leave, 100*cfg.Share), Waiters: cfg.Waiters, Stayed: stayed, Poll: poll}
	if cfg.Leave == "dead-head" {
		res.Leave = "the first died"
	}
	first := slices.Index(leaves, false)
	select {
	case <-firstGrant:
	case <-ctx.Done():
		t.Fatal("no waiter took the free slot")
	}
	// Measured: the others leave (serving each would wait for the far
	// ones' long intervals, which is not what is measured).
	for i, w := range ws {
		if leaves[i] && cfg.Leave != "dead-head" {
			continue
		}
		w.cancel()
		if err := <-w.out; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("waiter-%d: %v", i+1, err)
		}
	}
	grants.Lock()
	defer grants.Unlock()
	res.HandOver = grantedAt[0].Sub(released)
	res.InOrder = order[0] == first
	return res
}
