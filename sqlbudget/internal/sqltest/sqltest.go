// Package sqltest is sqlbudget's harness for the budget contract
// (testsupport/budgetcontract): participants are sqlbudget Budgets, each
// on a connection of its own (one machine each), that a test can cut off
// (every transaction fails, as with an unreachable database) or make
// vanish for good (a crash). It serves SQLite in-process and, from the
// dqlite test module, a real dqlite cluster.
package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/testsupport/budgetcontract"
)

// ErrCutOff is what a cut-off participant's transactions fail with.
var ErrCutOff = errors.New("sqltest: participant cut off from the database")

// Harness builds participants on one database.
type Harness struct {
	// TTL of every participant's rows.
	TTL time.Duration
	// Open returns the transaction function of a new connection to the
	// database (one machine); it is closed by the test's cleanup.
	Open func(t *testing.T) sqlbudget.TxFunc
	// Configure, when set, adjusts each participant's Config.
	Configure func(*sqlbudget.Config)
	// Step, when set, moves the database's wall clock by d and returns
	// once the database reads the new time (budgetcontract.ClockStepper).
	Step func(t *testing.T, d time.Duration)

	mu  sync.Mutex
	ctl map[*testing.T]*sqlbudget.Budget // the operator's, one per test (Open's connection ends with it)
}

// Participant is a Budget whose transactions can be cut off.
type Participant struct {
	*sqlbudget.Budget
	off, gone atomic.Bool
}

// Vanish cuts the participant off for good.
func (p *Participant) Vanish() { p.gone.Store(true) }

// Cut cuts the participant off (true) or reconnects it (false).
func (p *Participant) Cut(off bool) { p.off.Store(off) }

// Wrap returns tx as the participant sees it: failing while cut off.
func (p *Participant) Wrap(tx sqlbudget.TxFunc) sqlbudget.TxFunc {
	return func(ctx context.Context, f func(context.Context, *sql.Tx) error) error {
		if p.off.Load() || p.gone.Load() {
			return ErrCutOff
		}
		return tx(ctx, f)
	}
}

// StepClock moves the database's wall clock (budgetcontract.ClockStepper)
// through Step; without it, the test is skipped.
func (h *Harness) StepClock(t *testing.T, d time.Duration) {
	t.Helper()
	if h.Step == nil {
		t.Skip("sqltest: this harness's database clock cannot be stepped (Harness.Step is nil)")
	}
	h.Step(t, d)
}

var (
	_ budgetcontract.ClockStepper = (*Harness)(nil)
	_ budgetcontract.Refuser      = (*Harness)(nil)
	_ budgetcontract.Prober       = (*Harness)(nil)
	_ budgetcontract.LossyResumer = (*Harness)(nil)
	_ budgetcontract.Cutter       = (*Participant)(nil)
)

// Config returns the Config the harness gives a participant of o.
func (h *Harness) Config(o budgetcontract.Options) sqlbudget.Config {
	ld := o.LockDelay
	if ld == 0 {
		ld = -1
	}
	cfg := sqlbudget.Config{Holder: o.Holder, Max: o.Max, TTL: h.TTL, LockDelay: ld, ClockSkew: h.TTL / 10, Unreachable: 2 * h.TTL}
	if h.Configure != nil {
		h.Configure(&cfg)
	}
	return cfg
}

// New returns a participant on a connection of its own.
func (h *Harness) New(t *testing.T, o budgetcontract.Options) budgetcontract.Participant {
	t.Helper()
	return h.NewParticipant(t, h.Config(o))
}

// NewParticipant returns a participant of cfg (Tx is set here).
func (h *Harness) NewParticipant(t *testing.T, cfg sqlbudget.Config) *Participant {
	t.Helper()
	p := &Participant{}
	cfg.Tx = p.Wrap(h.Open(t))
	b, err := sqlbudget.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.Budget = b
	return p
}

var _ budgetcontract.Unbudgeted = (*Harness)(nil)

// NewWithoutCluster returns a participant told that no cluster exists yet
// (ClusterExists false): it grants without the database.
func (h *Harness) NewWithoutCluster(t *testing.T, o budgetcontract.Options) budgetcontract.Participant {
	t.Helper()
	cfg := h.Config(o)
	cfg.ClusterExists = func(context.Context) bool { return false }
	return h.NewParticipant(t, cfg)
}

// NewFailingOpen returns a participant that fails open, cut off from the
// database from the start: it grants without the database once its
// Unreachable bound passed.
func (h *Harness) NewFailingOpen(t *testing.T, o budgetcontract.Options) budgetcontract.Participant {
	t.Helper()
	cfg := h.Config(o)
	cfg.FailOpen, cfg.Unreachable = true, h.TTL/2
	p := h.NewParticipant(t, cfg)
	p.Cut(true)
	return p
}

// NewRefused returns a participant of o configured to fail open, on a
// read-only handle of the database (PRAGMA query_only at the start of
// each of its transactions: every write is refused, SQLITE_READONLY).
func (h *Harness) NewRefused(t *testing.T, o budgetcontract.Options) budgetcontract.Participant {
	t.Helper()
	cfg := h.Config(o)
	cfg.FailOpen = true
	p := &Participant{}
	cfg.Tx = p.Wrap(ReadOnly(h.Open(t)))
	b, err := sqlbudget.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.Budget = b
	return p
}

// ReadOnly returns tx as a read-only handle sees it: every transaction
// starts with PRAGMA query_only, so every write fails with
// SQLITE_READONLY. The connections it used stay read-only: give it a
// database handle of its own.
func ReadOnly(tx sqlbudget.TxFunc) sqlbudget.TxFunc {
	return func(ctx context.Context, f func(context.Context, *sql.Tx) error) error {
		return tx(ctx, func(ctx context.Context, t *sql.Tx) error {
			if _, err := t.ExecContext(ctx, "PRAGMA query_only = 1"); err != nil {
				return err
			}
			return f(ctx, t)
		})
	}
}

// NewProbing returns a participant of o whose Config.HolderReady asks
// ready about the vanished holder.
func (h *Harness) NewProbing(t *testing.T, o budgetcontract.Options, ready func(ctx context.Context, holder string) bool) budgetcontract.Participant {
	t.Helper()
	cfg := h.Config(o)
	cfg.HolderReady = func(ctx context.Context, v sqlbudget.Vanished) bool { return ready(ctx, v.Holder) }
	return h.NewParticipant(t, cfg)
}

// ResumeLosingAnswer resumes key through an operator whose first
// transaction that changes a row commits and has its answer lost (the
// budget runs it again), with meanwhile run between that commit and the
// retry.
func (h *Harness) ResumeLosingAnswer(t *testing.T, key string, meanwhile func()) {
	t.Helper()
	tx := h.Open(t)
	lost := false
	lossy := func(ctx context.Context, f func(context.Context, *sql.Tx) error) error {
		wrote := false
		err := tx(ctx, func(ctx context.Context, t *sql.Tx) error {
			var before, after int64
			if err := t.QueryRowContext(ctx, `SELECT total_changes()`).Scan(&before); err != nil {
				return err
			}
			if err := f(ctx, t); err != nil {
				return err
			}
			if err := t.QueryRowContext(ctx, `SELECT total_changes()`).Scan(&after); err != nil {
				return err
			}
			wrote = after > before
			return nil
		})
		if err != nil || !wrote || lost {
			return err
		}
		lost = true
		meanwhile()
		return errors.New("sqltest: the answer of a committed transaction was lost")
	}
	b, err := sqlbudget.New(sqlbudget.Config{Tx: lossy, Holder: "operator", TTL: h.TTL, ClockSkew: h.TTL / 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Resume(context.Background(), key); err != nil {
		t.Fatal(err)
	}
}

// control returns the operator's budget for test t: on a connection of
// t's, closed when t ends.
func (h *Harness) control(t *testing.T) *sqlbudget.Budget {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.ctl[t]; b != nil {
		return b
	}
	b, err := sqlbudget.New(sqlbudget.Config{Tx: h.Open(t), Holder: "operator", TTL: h.TTL, ClockSkew: h.TTL / 10})
	if err != nil {
		t.Fatal(err)
	}
	if h.ctl == nil {
		h.ctl = map[*testing.T]*sqlbudget.Budget{}
	}
	h.ctl[t] = b
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.ctl, t)
	})
	return b
}

// Pause pauses key.
func (h *Harness) Pause(t *testing.T, key string) {
	t.Helper()
	if _, err := h.control(t).Pause(context.Background(), key, "contract"); err != nil {
		t.Fatal(err)
	}
}

// Resume resumes key.
func (h *Harness) Resume(t *testing.T, key string) {
	t.Helper()
	if _, err := h.control(t).Resume(context.Background(), key); err != nil {
		t.Fatal(err)
	}
}
