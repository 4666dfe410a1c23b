package sqlbudget

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/snapsvc/snapsvc/budget"
)

// Defaults of Config.
const (
	DefaultTTL         = 10 * time.Second
	DefaultUnreachable = 15 * time.Second
	// DefaultLockDelay is how long a slot stays unusable after its holder
	// vanished between a Fence and its MarkReady (see Config.LockDelay):
	// the restart it may have sent runs on in snapd, and the service
	// needs seconds to restart and up to tens of seconds to be ready.
	DefaultLockDelay = time.Minute
	// DefaultClockSkew is Config.ClockSkew's default.
	DefaultClockSkew = 500 * time.Millisecond
	// DefaultReleaseRetry is how long a slot whose release failed is
	// still kept alive, so that a retried Release hands it over at once.
	DefaultReleaseRetry = time.Minute
	// DefaultHistoryLimit is Config.HistoryLimit's default: records kept
	// per key.
	DefaultHistoryLimit = budget.DefaultHistoryLimit
	// DefaultHistoryAge is Config.HistoryAge's default: 30 days.
	DefaultHistoryAge = budget.DefaultHistoryAge
)

// Config configures a Budget.
type Config struct {
	// Tx runs a transaction on the cluster's database (microcluster:
	// state.Database().Transaction). Set Tx or DB.
	Tx TxFunc
	// DB is a plain database handle, used through DBTx when Tx is nil.
	DB *sql.DB
	// Max is how many holders a key may have at once (default 1). Every
	// participant must use the same Max for a key: a waiter that finds a
	// participant with another Max (or Percent) is refused
	// (budget.ErrRefused).
	Max int
	// Percent, 1 to 100, when set replaces Max: the key's slot count is
	// that share of the cluster's members, rounded down but at least 1,
	// resolved by Members inside every transaction that grants a slot.
	Percent int
	// Members counts the cluster's members inside a budget transaction
	// (microcluster: SELECT count(*) FROM core_cluster_members). Needed
	// with Percent.
	Members func(ctx context.Context, tx *sql.Tx) (int, error)
	// TTL is how long a holder's row lives without renewal (default
	// DefaultTTL, at least 500ms). Rows are renewed every TTL/3. A holder
	// that crashes, freezes or is cut off loses its slot once the others
	// have watched its row unrenewed for TTL, each on its own monotonic
	// clock (never the database's: see the package documentation).
	TTL time.Duration
	// LockDelay is how long a slot stays unusable after the expiry of a
	// holder that vanished after a Fence and before its MarkReady
	// (default DefaultLockDelay; negative: none), counted by each waiter
	// on its own monotonic clock from when it judged the holder expired. A holder that vanished
	// before any Fence, or after MarkReady, holds nothing back; an
	// orderly Release hands over at once.
	LockDelay time.Duration
	// HolderReady, when set, is asked (every 500ms, by the first waiter
	// only) while a slot is held back by the lock-delay of a vanished
	// holder. It must report true only on evidence that the vanished
	// holder's service became ready after v.Acted (for example its
	// process started after v.Acted, and its readiness endpoint answers):
	// a holder frozen between its Fence and its restart looks ready but
	// has not restarted yet. True ends the delay. It runs beside the
	// wait: its context ends after 5s (or when Acquire returns), the
	// waiter polls and renews its row meanwhile, and a call that does not
	// return is not made again until it does.
	HolderReady func(ctx context.Context, v Vanished) bool
	// ClockSkew is how long before any other participant can judge its
	// row expired a holder takes its slot for lost, and by which a
	// Fence's confirmation is shortened (default DefaultClockSkew; at
	// most TTL/4). It covers what separates the holder's monotonic clock
	// from an observer's: their rates (drift is parts per million) and
	// the scheduling between a clock's reading and the act it times. No
	// wall clock, the database's included, enters a decision.
	ClockSkew time.Duration
	// Holder identifies this participant (default "HOSTNAME pid PID").
	Holder string
	// Unreachable bounds how long a call keeps retrying while the
	// database cannot complete a transaction (default
	// DefaultUnreachable); past it the call fails with an
	// *UnreachableError (budget.ErrUnavailable), unless FailOpen.
	Unreachable time.Duration
	// Attempt bounds each attempt of a transaction (default TTL/5, at
	// least 200ms, at most 2s).
	Attempt time.Duration
	// Poll is how often a waiter among the first Max+1 of the queue checks
	// whether it may take a slot (default TTL/8, at most 250ms): a slot
	// released by another machine is taken within about one Poll. A
	// release by a Budget of the same process wakes them at once.
	Poll time.Duration
	// PollSpacing is how much longer a waiter further back waits between
	// two polls for each waiter between it and the first Max+1 (default
	// 2×Poll; at most 10 minutes in all), so that the whole queue costs
	// the database O(log n) transactions a second, not O(n).
	PollSpacing time.Duration
	// ReleaseRetry is how long a slot whose Release failed is still
	// renewed, so that a retried Release hands it over without a
	// lock-delay (default DefaultReleaseRetry); past it the row is left
	// to expire.
	ReleaseRetry time.Duration
	// FailOpen makes Acquire grant an unbudgeted slot when the database
	// stayed unreachable for Unreachable (never on a refusal).
	FailOpen bool
	// ClusterExists, when set, is asked first by every Acquire; false
	// (no cluster bootstrapped yet) grants an unbudgeted slot at once.
	ClusterExists func(ctx context.Context) bool
	// SkipMigrate: the application applies SchemaUpdates itself; the
	// budget does not create its tables.
	SkipMigrate bool
	// HaltAfter is how many failed acts of a key (budget.OutcomeFailed),
	// counted since its last ready act (budget.OutcomeReady) or its last
	// resume, halt it: the Record of the failure that reaches it pauses
	// the key with the budget.Halt, in the same transaction, and no
	// holder's Fence lets it act until an operator resumes it (Resume).
	// 0 means budget.DefaultHaltAfter (the first failure halts);
	// negative: never halt, keep the history only. Each participant's
	// Record applies its own: give every participant of a key the same.
	HaltAfter int
	// HistoryLimit is how many records of a key's history are kept
	// (default DefaultHistoryLimit); each Record removes the oldest
	// beyond it.
	HistoryLimit int
	// HistoryAge is how long a key's records are kept (default
	// DefaultHistoryAge; negative: no bound by age), judged by the
	// records' times (the database's clock). It is housekeeping only: no
	// decision reads it, and the key's newest record, which carries its
	// count of failures, is always kept, so a step of the database's clock
	// never changes whether a key halts.
	HistoryAge time.Duration
	// OnEvent, when set, receives what the budget does (for logs and
	// metrics). It is called synchronously and must not block.
	OnEvent func(Event)
	// Logger receives what the budget does (default: discard).
	Logger *slog.Logger
}

// Vanished is a holder that vanished (its row expired without a release)
// after a Fence and before a MarkReady, as a waiter sees it.
type Vanished struct {
	// Key is the budget key.
	Key string
	// Holder is the vanished holder's identity.
	Holder string
	// Acted is its last Fence, by the database's clock (the time is for
	// the probe's comparison with its evidence; no decision of the budget
	// reads it): it may have sent a restart right after it.
	Acted time.Time
	// Expired is when this waiter judged its row expired: once it had
	// watched the row unrenewed for its lease (local clock).
	Expired time.Time
	// Until is when its lock-delay ends for this waiter: Expired plus the
	// holder's lock-delay (local clock).
	Until time.Time

	token string // its row
	acts  int64  // its acts when judged: a later act keeps the delay
}

// Budget is a budget.Budget on a SQL database. It is safe for
// concurrent use.
type Budget struct {
	cfg  Config
	spec string // "1", "25%": what every participant of a key must use

	schemaDone atomic.Bool
	obs        observer // what this Budget saw of the rows, when (observe.go)

	mu   sync.Mutex
	wake map[string]chan struct{}
	m    Metrics

	txs        atomic.Uint64
	txFailures atomic.Uint64
	// failing: this Budget's last transaction attempt failed (the
	// database is unreachable from here, or busy): a cancelled Acquire
	// then leaves its row to expire rather than wait for one more attempt.
	failing atomic.Bool
}

// New checks cfg and returns a Budget. It sends no query.
func New(cfg Config) (*Budget, error) {
	if cfg.Tx == nil {
		if cfg.DB == nil {
			return nil, errors.New("sqlbudget: Config.Tx and Config.DB are both nil")
		}
		cfg.Tx = DBTx(cfg.DB)
	}
	if cfg.Max < 0 || cfg.Percent < 0 || cfg.Percent > 100 {
		return nil, fmt.Errorf("sqlbudget: Max %d / Percent %d out of range", cfg.Max, cfg.Percent)
	}
	if cfg.Percent > 0 && cfg.Members == nil {
		return nil, errors.New("sqlbudget: Percent needs Config.Members")
	}
	if cfg.Max == 0 {
		cfg.Max = 1
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < 500*time.Millisecond {
		return nil, fmt.Errorf("sqlbudget: TTL %s is below 500ms", cfg.TTL)
	}
	if cfg.LockDelay == 0 {
		cfg.LockDelay = DefaultLockDelay
	}
	if cfg.LockDelay < 0 {
		cfg.LockDelay = 0
	}
	if cfg.ClockSkew == 0 {
		cfg.ClockSkew = DefaultClockSkew
	}
	if cfg.ClockSkew < 0 || cfg.ClockSkew > cfg.TTL/4 {
		return nil, fmt.Errorf("sqlbudget: ClockSkew %s must be within [0, TTL/4 = %s]", cfg.ClockSkew, cfg.TTL/4)
	}
	if cfg.Unreachable == 0 {
		cfg.Unreachable = DefaultUnreachable
	}
	if cfg.Attempt == 0 {
		cfg.Attempt = min(max(cfg.TTL/5, 200*time.Millisecond), 2*time.Second)
	}
	if cfg.Poll == 0 {
		cfg.Poll = min(cfg.TTL/8, 250*time.Millisecond)
	}
	if cfg.PollSpacing == 0 {
		cfg.PollSpacing = 2 * cfg.Poll
	}
	if cfg.ReleaseRetry == 0 {
		cfg.ReleaseRetry = DefaultReleaseRetry
	}
	if cfg.Unreachable < 0 || cfg.Attempt < 0 || cfg.Poll <= 0 || cfg.PollSpacing < 0 || cfg.ReleaseRetry < 0 {
		return nil, errors.New("sqlbudget: Unreachable, Attempt, Poll, PollSpacing and ReleaseRetry must not be negative")
	}
	if cfg.Poll > cfg.TTL/3 {
		return nil, fmt.Errorf("sqlbudget: Poll %s must be at most TTL/3 (waiters renew their rows while polling)", cfg.Poll)
	}
	if cfg.HaltAfter == 0 {
		cfg.HaltAfter = budget.DefaultHaltAfter
	}
	if cfg.HistoryLimit == 0 {
		cfg.HistoryLimit = DefaultHistoryLimit
	}
	if cfg.HistoryLimit < 0 {
		return nil, fmt.Errorf("sqlbudget: HistoryLimit %d is negative", cfg.HistoryLimit)
	}
	if cfg.HistoryAge == 0 {
		cfg.HistoryAge = DefaultHistoryAge
	}
	if cfg.Holder == "" {
		cfg.Holder = DefaultHolder()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Budget{cfg: cfg, wake: map[string]chan struct{}{}}
	b.spec = strconv.Itoa(cfg.Max)
	if cfg.Percent > 0 {
		b.spec = strconv.Itoa(cfg.Percent) + "%"
	}
	return b, nil
}

// DefaultHolder returns "HOSTNAME pid PID".
func DefaultHolder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// Holder returns this participant's identity.
func (b *Budget) Holder() string { return b.cfg.Holder }

// ensureSchema runs at the start of every transaction of the Budget: it
// reads the schema's version (one read of the version table's primary
// key) and refuses a newer one (*SchemaError), so a member left on this
// version while others upgrade stops at its next transaction, Config.
// SkipMigrate or not. Until its first successful transaction it migrates
// (without SkipMigrate); with SkipMigrate, a schema the application has
// not brought up to SchemaVersion is refused.
func (b *Budget) ensureSchema(ctx context.Context, tx *sql.Tx) error {
	if !b.cfg.SkipMigrate && !b.schemaDone.Load() {
		return Migrate(ctx, tx)
	}
	v, err := schemaVersion(ctx, tx, false)
	switch {
	case err != nil:
		return err
	case v < SchemaVersion && b.cfg.SkipMigrate:
		return final(fmt.Errorf("%w: sqlbudget: the database's budget schema is version %d, this sqlbudget needs %d: the application must apply SchemaUpdates (Config.SkipMigrate is set)", budget.ErrRefused, v, SchemaVersion))
	case v < SchemaVersion:
		return Migrate(ctx, tx)
	}
	return nil
}

func (b *Budget) markSchema() { b.schemaDone.Store(true) }

// wakeCh returns the channel closed at the next local release of key.
func (b *Budget) wakeCh(key string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := b.wake[key]
	if ch == nil {
		ch = make(chan struct{})
		b.wake[key] = ch
	}
	return ch
}

// wakeUp wakes this Budget's waiters of key (a slot was released here).
func (b *Budget) wakeUp(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ch := b.wake[key]; ch != nil {
		close(ch)
		delete(b.wake, key)
	}
}

// slots resolves the key's slot count inside tx.
func (b *Budget) slots(ctx context.Context, tx *sql.Tx) (int, error) {
	if b.cfg.Percent == 0 {
		return b.cfg.Max, nil
	}
	n, err := b.cfg.Members(ctx, tx)
	if err != nil {
		return 0, err
	}
	return max(n*b.cfg.Percent/100, 1), nil
}

func newToken() string {
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	return hex.EncodeToString(raw[:])
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// Acquire waits for a slot of key (in its canonical form) and takes it.
// It queues a row for this Acquire (idempotently: a retried transaction
// finds the row it made), and takes a slot once fewer than the key's
// slot count of live rows arrived before it and no slot is held back by
// a vanished holder's lock-delay: first come, first served. While it
// waits it renews its row and reports who holds and how many are ahead.
// Once it holds a slot, a paused key keeps it waiting, holding the slot,
// until resumed. When ctx ends or Acquire fails, its row is deleted (one
// attempt; else it expires within TTL).
func (b *Budget) Acquire(ctx context.Context, key string, progress func(budget.Wait)) (budget.Slot, error) {
	start := time.Now()
	canon, err := normaliseKey(key)
	if err != nil {
		b.count(func(m *Metrics) { m.Failed++ })
		b.emit(Event{Kind: EventFailed, Key: key, Err: err}) // the key as given
		return nil, err
	}
	key = canon
	if b.cfg.ClusterExists != nil && !b.cfg.ClusterExists(ctx) {
		b.cfg.Logger.Info("no cluster exists yet: proceeding without a slot", "key", key)
		return b.unbudgeted(key, start, " (no cluster yet, unbudgeted)"), nil
	}
	b.count(func(m *Metrics) { m.Waiting++ })
	w := &waiter{b: b, key: key, token: newToken(), start: start}
	s, err := w.wait(ctx, progress)
	waited := time.Since(start)
	b.count(func(m *Metrics) { m.Waiting--; m.WaitSeconds += waited.Seconds() })
	if err != nil {
		w.abandon()
		var u *UnreachableError
		if ctx.Err() == nil && errors.As(err, &u) && b.cfg.FailOpen {
			b.cfg.Logger.Warn("database unreachable: proceeding without a slot (fail open)", "key", key, "error", err)
			return b.unbudgeted(key, start, " (database unreachable, fail open: unbudgeted)"), nil
		}
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		b.count(func(m *Metrics) { m.Failed++ })
		b.emit(Event{Kind: EventFailed, Key: key, Waited: waited, Err: err})
		return nil, err
	}
	b.count(func(m *Metrics) {
		m.Acquired++
		m.Holding++
		if w.delayed {
			m.DelayedTakeovers++
		}
	})
	b.emit(Event{Kind: EventAcquired, Key: key, Waited: waited, Max: w.max})
	// A paused key keeps the slot just granted (and the queue behind it)
	// until it is resumed.
	if err := s.awaitAllowed(ctx, progress); err != nil {
		s.abandon()
		b.count(func(m *Metrics) { m.Failed++ })
		b.emit(Event{Kind: EventFailed, Key: key, Waited: time.Since(start), Err: err})
		return nil, err
	}
	return s, nil
}

func (b *Budget) unbudgeted(key string, start time.Time, why string) budget.Slot {
	b.count(func(m *Metrics) { m.Acquired++; m.Unbudgeted++ })
	b.emit(Event{Kind: EventUnbudgeted, Key: key, Waited: time.Since(start)})
	return &unbudgeted{key: key, holder: b.cfg.Holder + why, never: make(chan struct{})}
}
