package sqlbudget_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/sqlbudget/internal/sqltest"
	"github.com/snapsvc/snapsvc/testsupport/budgetcontract"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func tempDB(t *testing.T) (path string, db *sql.DB) {
	path = filepath.Join(t.TempDir(), "budget.db")
	return path, openSQLite(t, path)
}

func newBudget(t *testing.T, tx sqlbudget.TxFunc, holder string, mod ...func(*sqlbudget.Config)) *sqlbudget.Budget {
	t.Helper()
	cfg := sqlbudget.Config{Tx: tx, Holder: holder, TTL: time.Second, ClockSkew: 100 * time.Millisecond, Unreachable: 3 * time.Second}
	for _, f := range mod {
		f(&cfg)
	}
	b, err := sqlbudget.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lossyTx commits every transaction and then, every other time, reports a
// failure, as a commit whose answer was lost: the budget runs the same
// transaction again, as microcluster's Transaction runs f again. The
// budget's writes must end as if each had run once.
func lossyTx(db *sql.DB, lost *atomic.Int64) sqlbudget.TxFunc {
	var n atomic.Int64
	inner := sqlbudget.DBTx(db)
	return func(ctx context.Context, f func(context.Context, *sql.Tx) error) error {
		i := n.Add(1)
		if err := inner(ctx, f); err != nil {
			return err
		}
		if i%2 == 1 {
			lost.Add(1)
			return errors.New("lossy: the commit's answer was lost")
		}
		return nil
	}
}

// Every write is idempotent: with every other commit's answer lost (so
// the budget runs the same transaction again after it committed), two
// participants still take turns in order, fences, marks and releases
// still work, and no row is left behind.
func TestRetriedTransactionsIdempotent(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	var lost atomic.Int64
	a := newBudget(t, lossyTx(db, &lost), "a")
	b := newBudget(t, lossyTx(db, &lost), "b")
	key := "microovn.ovn-northd"
	s, err := a.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan error, 1)
	var bs budget.Slot
	queued := make(chan struct{}, 1)
	go func() {
		var err error
		bs, err = b.Acquire(ctx, key, func(budget.Wait) {
			select {
			case queued <- struct{}{}:
			default:
			}
		})
		out <- err
	}()
	<-queued
	st, err := a.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != 1 || st.Holders[0].Holder != "a" || len(st.Waiters) != 1 || st.Waiters[0].Holder != "b" {
		t.Fatalf("status with retried transactions: %+v (want one row each: a holding, b waiting)", st)
	}
	if _, err := s.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.(budget.Readier).MarkReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-out; err != nil {
		t.Fatal(err)
	}
	if err := bs.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM snapsvc_budget_slots`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d commits' answers lost and their transactions run again", lost.Load())
	if rows != 0 || lost.Load() < 5 {
		t.Errorf("%d rows left (want 0), %d answers lost", rows, lost.Load())
	}
}

// Participants configured with different slot counts for one key are
// refused at once, never served.
func TestMaxMismatchRefused(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	one := newBudget(t, sqlbudget.DBTx(db), "one")
	two := newBudget(t, sqlbudget.DBTx(db), "two", func(c *sqlbudget.Config) { c.Max = 2 })
	s, err := one.Acquire(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	_, err = two.Acquire(ctx, "k", nil)
	if !errors.Is(err, budget.ErrRefused) {
		t.Fatalf("Max 2 against a holder with Max 1: %v, want ErrBudgetRefused", err)
	}
}

// Keys take one canonical form: "b+a" and "a+b" exclude each other; bad
// keys are refused.
func TestKeysCanonical(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	a := newBudget(t, sqlbudget.DBTx(db), "a")
	s, err := a.Acquire(ctx, "b+a+a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Key() != "a+b" {
		t.Errorf("key %q, want a+b", s.Key())
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := newBudget(t, sqlbudget.DBTx(db), "b").Acquire(short, " a + b ", nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a+b while b+a is held: %v, want to wait", err)
	}
	s.Release(ctx)
	for _, bad := range []string{"", "+", "a b", "a\nb"} {
		if _, err := a.Acquire(ctx, bad, nil); !errors.Is(err, budget.ErrRefused) {
			t.Errorf("key %q: %v, want ErrBudgetRefused", bad, err)
		}
	}
}

// Migrations are idempotent, and a schema newer than the package knows
// is refused.
func TestSchema(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	for range 2 {
		if err := sqlbudget.DBTx(db)(ctx, sqlbudget.Migrate); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range sqlbudget.SchemaUpdates() {
		if err := sqlbudget.DBTx(db)(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	var v int
	if err := db.QueryRowContext(ctx, `SELECT max(version) FROM snapsvc_budget_schema`).Scan(&v); err != nil || v != sqlbudget.SchemaVersion {
		t.Fatalf("schema version %d (%v), want %d", v, err, sqlbudget.SchemaVersion)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO snapsvc_budget_schema (version) VALUES (?)`, sqlbudget.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	_, err := newBudget(t, sqlbudget.DBTx(db), "old").Acquire(ctx, "k", nil)
	var se *sqlbudget.SchemaError
	if !errors.Is(err, budget.ErrRefused) || !errors.As(err, &se) || se.Found != sqlbudget.SchemaVersion+1 || se.Retryable() {
		t.Fatalf("a newer schema: %v, want a *SchemaError (ErrBudgetRefused, not retryable) naming version %d", err, sqlbudget.SchemaVersion+1)
	}
}

// Status tells holders, waiters blocked only by a lock-delay, and
// vanished holders apart.
func TestStatusVanishedAndBlocked(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	h := sqliteHarness(t, time.Second)
	vanishing := h.NewParticipant(t, h.Config(optionsOf("vanishing", 30*time.Second)))
	s, err := vanishing.Acquire(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatal(err)
	}
	vanishing.Vanish()
	<-s.Lost()
	next := h.NewParticipant(t, h.Config(optionsOf("next", 30*time.Second)))
	out := make(chan error, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waits := make(chan budget.Wait, 10)
	go func() {
		_, err := next.Acquire(wctx, "k", func(w budget.Wait) { waits <- w })
		out <- err
	}()
	// Lost closes ClockSkew before the row expires (before anyone else
	// may take the slot): the waiter may see the holder live first.
	for w := range waits {
		if len(w.Holders) == 1 && w.Holders[0] == "vanishing (vanished; lock-delay)" {
			break
		}
		if len(w.Holders) != 1 || w.Holders[0] != "vanishing" {
			t.Fatalf("wait %+v: want the holder, then the vanished holder under lock-delay", w)
		}
	}
	st, err := next.Status(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != 0 || len(st.Vanished) != 1 || len(st.Waiters) != 1 || !st.Waiters[0].BlockedByLockDelay || st.Vanished[0].Acted.IsZero() {
		t.Errorf("status %+v: want no holder, one vanished (acted), one waiter blocked by the lock-delay", st)
	}
	cancel()
	if err := <-out; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled waiter: %v", err)
	}
}

func optionsOf(holder string, lockDelay time.Duration) budgetcontract.Options {
	return budgetcontract.Options{Holder: holder, Max: 1, LockDelay: lockDelay}
}

// A percentage of the cluster's members, resolved in the granting
// transaction: 50% of 4 members is 2 slots, and it follows the count.
func TestPercentOfMembers(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	var members atomic.Int64
	members.Store(4)
	pct := func(c *sqlbudget.Config) {
		c.Max, c.Percent = 0, 50
		c.Members = func(context.Context, *sql.Tx) (int, error) { return int(members.Load()), nil }
	}
	var held []budget.Slot
	for _, n := range []string{"a", "b"} {
		s, err := newBudget(t, sqlbudget.DBTx(db), n, pct).Acquire(ctx, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	third := newBudget(t, sqlbudget.DBTx(db), "c", pct)
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := third.Acquire(short, "k", nil)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("third holder at 50%% of 4: %v, want to wait", err)
	}
	members.Store(6)
	s, err := third.Acquire(ctx, "k", nil)
	if err != nil {
		t.Fatalf("third holder at 50%% of 6: %v", err)
	}
	st, _ := third.Status(ctx, "k")
	if st.Max != 3 || len(st.Holders) != 3 {
		t.Errorf("status %+v: want max 3, 3 holders", st)
	}
	for _, s := range append(held, s) {
		s.Release(ctx)
	}
	if _, err := sqlbudget.New(sqlbudget.Config{DB: db, Percent: 50}); err == nil {
		t.Error("Percent without Members accepted")
	}
}

// A waiter cut off from the database for longer than its TTL finds, once
// back, that its row expired and was collected by another waiter: that is
// its own expiry (retryable, ErrBudgetUnavailable), not an operator's
// deletion (ErrBudgetRefused). Found by TestRolloutFaults on dqlite: the
// leader's election outlasted the waiters' TTL and every waiter reported
// a refusal.
func TestWaiterExpiredIsRetryable(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	h := sqliteHarness(t, time.Second)
	holder := h.NewParticipant(t, h.Config(optionsOf("holder", 0)))
	s, err := holder.Acquire(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	cfg := h.Config(optionsOf("cut", 0))
	cfg.Unreachable = 10 * time.Second
	cut := h.NewParticipant(t, cfg)
	other := h.NewParticipant(t, h.Config(optionsOf("other", 0)))
	out := make(chan error, 1)
	queued := make(chan struct{})
	go func() {
		var once atomic.Bool
		_, err := cut.Acquire(ctx, "k", func(budget.Wait) {
			if once.CompareAndSwap(false, true) {
				close(queued)
			}
		})
		out <- err
	}()
	<-queued
	cut.Cut(true)
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	oq := make(chan struct{}, 1)
	go other.Acquire(octx, "k", func(budget.Wait) {
		select {
		case oq <- struct{}{}:
		default:
		}
	})
	// The cut-off waiter's row expires after its TTL; the other waiter's
	// polls collect it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := holder.Status(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Waiters) == 1 && st.Waiters[0].Holder == "other" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cut-off waiter's row was never collected: %+v", st)
		}
		<-oq
	}
	cut.Cut(false)
	err = <-out
	if !errors.Is(err, budget.ErrUnavailable) || errors.Is(err, budget.ErrRefused) {
		t.Fatalf("waiter whose row expired while cut off: %v, want ErrBudgetUnavailable (retryable), not refused", err)
	}
	if !strings.Contains(err.Error(), "its place in the queue is lost") || strings.Contains(err.Error(), "attempts") {
		t.Errorf("waiter whose row expired: %q, want its place in the queue lost (not a count of attempts the database answered)", err)
	}
}

// FailOpen: a database that cannot be reached within Unreachable lets the
// restart go ahead without a slot; without it, Acquire fails retryable.
func TestFailOpenOnlyWhenUnreachable(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	h := sqliteHarness(t, time.Second)
	for _, failOpen := range []bool{false, true} {
		cfg := h.Config(optionsOf(fmt.Sprintf("fail-open-%v", failOpen), 0))
		cfg.Unreachable, cfg.FailOpen = 300*time.Millisecond, failOpen
		p := h.NewParticipant(t, cfg)
		p.Cut(true)
		s, err := p.Acquire(ctx, "k", nil)
		switch {
		case failOpen && (err != nil || s == nil):
			t.Errorf("FailOpen with the database unreachable: %v, want a slot without the budget", err)
		case !failOpen && !errors.Is(err, budget.ErrUnavailable):
			t.Errorf("database unreachable: %v, want ErrBudgetUnavailable", err)
		}
		if s != nil {
			if err := s.Release(ctx); err != nil {
				t.Errorf("releasing the unbudgeted slot: %v", err)
			}
		}
	}
	st, err := h.NewParticipant(t, h.Config(optionsOf("reader", 0))).Status(ctx, "k")
	if err != nil || len(st.Holders)+len(st.Waiters) != 0 {
		t.Errorf("status after: %+v %v, want nothing held or queued", st, err)
	}
}

// Every unbudgeted grant (fail open, no cluster yet) leads to its restart
// through snapsvc (issue 33, defect 1: the unbudgeted slot's fence
// confirmed for 1<<63-1 ns, the send-by overflowed, and every write was
// refused until the call gave up, reporting snapd unreachable).
func TestUnbudgetedGrantRestarts(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	h := sqliteHarness(t, time.Second)
	for _, tc := range []struct {
		name string
		set  func(*sqlbudget.Config, *sqltest.Participant)
	}{
		{"fail open", func(c *sqlbudget.Config, p *sqltest.Participant) { p.Cut(true) }},
		{"no cluster yet", func(c *sqlbudget.Config, _ *sqltest.Participant) {}},
	} {
		cfg := h.Config(optionsOf(tc.name, 0))
		cfg.Unreachable, cfg.FailOpen = 300*time.Millisecond, true
		if tc.name == "no cluster yet" {
			cfg.ClusterExists = func(context.Context) bool { return false }
		}
		p := h.NewParticipant(t, cfg)
		tc.set(&cfg, p)
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "microovn", Apps: []fake.App{{Name: "ovn-northd", Daemon: "simple", Active: true}}}))
		c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithRestartBudget(p, snapsvc.BudgetOptions{}))
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Restart(ctx, []string{"microovn.ovn-northd"}, snapsvc.RestartOptions{})
		c.Close()
		if err != nil || res.Status != "Done" {
			t.Errorf("%s: restart: %+v, %v", tc.name, res, err)
		}
		if n := len(srv.Changes()); n != 1 {
			t.Errorf("%s: %d changes made, want the restart's one", tc.name, n)
		}
	}
}

// HolderReady ends a vanished holder's lock-delay only when it says so:
// the first waiter asks about the holder that acted, and holds back while
// the answer is false.
func TestHolderReadyEndsLockDelay(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	h := sqliteHarness(t, time.Second)
	vanishing := h.NewParticipant(t, h.Config(optionsOf("vanishing", 30*time.Second)))
	s, err := vanishing.Acquire(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatal(err)
	}
	vanishing.Vanish()
	<-s.Lost()
	var ready atomic.Bool
	asked := make(chan sqlbudget.Vanished, 10)
	cfg := h.Config(optionsOf("next", 30*time.Second))
	cfg.HolderReady = func(_ context.Context, v sqlbudget.Vanished) bool {
		asked <- v
		return ready.Load()
	}
	next := h.NewParticipant(t, cfg)
	out := make(chan error, 1)
	// Half the lock-delay: only HolderReady can end it in time.
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	go func() {
		s, err := next.Acquire(actx, "k", nil)
		if err == nil {
			err = s.Release(ctx)
		}
		out <- err
	}()
	for i := range 2 {
		v := <-asked
		if v.Holder != "vanishing" || v.Acted.IsZero() || v.Key != "k" {
			t.Fatalf("asked about %+v, want the vanishing holder of k, with its act", v)
		}
		select {
		case err := <-out:
			t.Fatalf("Acquire returned (%v) while HolderReady said no (%d asks), 30s before the lock-delay ends", err, i+1)
		default:
		}
	}
	ready.Store(true)
	if err := <-out; err != nil {
		t.Fatalf("Acquire once the vanished holder was ready: %v", err)
	}
}

// A database made by an earlier sqlbudget (schema version 1: no pause
// tokens) is brought to SchemaVersion on first use, keeping what it holds:
// a pause set then is still read at the fence, and lifted by Resume.
func TestMigrateFromVersion1(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	if err := sqlbudget.DBTx(db)(ctx, sqlbudget.SchemaUpdates()[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO snapsvc_budget_pauses (key, by, since, reason) VALUES ('k', 'old-operator', 0, 'before the upgrade')`); err != nil {
		t.Fatal(err)
	}
	b := newBudget(t, sqlbudget.DBTx(db), "new")
	st, err := b.Status(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if st.Paused == nil || st.Paused.By != "old-operator" {
		t.Fatalf("status after the migration: pause %+v, want the version-1 pause", st.Paused)
	}
	var v int
	if err := db.QueryRowContext(ctx, `SELECT max(version) FROM snapsvc_budget_schema`).Scan(&v); err != nil || v != sqlbudget.SchemaVersion {
		t.Fatalf("schema version %d (%v), want %d", v, err, sqlbudget.SchemaVersion)
	}
	if was, err := b.Resume(ctx, "k"); err != nil || !was {
		t.Fatalf("Resume of the version-1 pause: %v %v", was, err)
	}
	s, err := b.Acquire(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := s.(budget.Fencer).Fence(short); err != nil {
		t.Errorf("fence once the version-1 pause was lifted: %v", err)
	}
	s.Release(ctx)
}

// Rows queued by an earlier sqlbudget (schema version 3, expiry by the
// database's clock) are carried over to version 4's table in their
// order: a holder's row still holds, a waiter's row is still queued ahead
// of a waiter queued after the migration (in Status and in the place it
// reports); never written again, and not awake, it does not hold a free
// slot back, and keeps its row until its lease passes. The old table is
// gone, so a member still on version 3 refuses at its next transaction.
func TestMigrateQueuedRows(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	for _, u := range sqlbudget.SchemaUpdates()[:3] {
		if err := sqlbudget.DBTx(db)(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	now := `CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)`
	if _, err := db.ExecContext(ctx, `INSERT INTO snapsvc_budget_entries (key, token, holder, max_spec, since, expires, granted, acted, seq)
		VALUES ('k', 't1', 'old-holder', '1', `+now+`, `+now+` + 60000, `+now+`, `+now+`, 1),
		       ('k', 't2', 'old-waiter', '1', `+now+`, `+now+` + 1500, NULL, NULL, 2)`); err != nil {
		t.Fatal(err)
	}
	b := newBudget(t, sqlbudget.DBTx(db), "new")
	waits := make(chan budget.Wait, 10)
	out := make(chan error, 1)
	go func() {
		s, err := b.Acquire(ctx, "k", func(w budget.Wait) { waits <- w })
		if err == nil {
			err = s.Release(ctx)
		}
		out <- err
	}()
	w := <-waits
	if len(w.Holders) != 1 || w.Holders[0] != "old-holder" || w.Ahead != 1 {
		t.Fatalf("after the migration: wait %+v, want behind old-holder with old-waiter ahead", w)
	}
	st, err := b.Status(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Waiters) != 2 || st.Waiters[0].Holder != "old-waiter" || st.Waiters[1].Holder != "new" || len(st.Holders) != 1 || st.Holders[0].Acted.IsZero() {
		t.Fatalf("status after the migration: holders %+v, waiters %+v; want old-holder (acted), then old-waiter, then new", st.Holders, st.Waiters)
	}
	if _, err := db.ExecContext(ctx, `SELECT count(*) FROM snapsvc_budget_entries`); err == nil || !strings.Contains(err.Error(), "no such table") {
		t.Errorf("version 3's table after the migration: %v; want it gone (a member on version 3 must find nothing to count)", err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM snapsvc_budget_slots WHERE token = 't1'`); err != nil { // old-holder released
		t.Fatal(err)
	}
	if err := <-out; err != nil {
		t.Fatalf("once old-holder released: %v", err)
	}
	var left []string
	rows, err := db.QueryContext(ctx, `SELECT holder FROM snapsvc_budget_slots`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var h string
		rows.Scan(&h)
		left = append(left, h)
	}
	if len(left) != 1 || left[0] != "old-waiter" {
		t.Errorf("rows left %v, want old-waiter's (it keeps its place until its lease passes)", left)
	}
}

// Every transaction checks the schema's version: a Budget that has
// worked with the database (its first transactions succeeded) and one
// that skips migrations both refuse, at their next transaction, a schema
// newer than they know: their budget would not count the upgraded
// members' holders. Issue 41, item 7: the version was read only until a
// Budget's first successful transaction, and never with SkipMigrate.
func TestNewerSchemaRefusedAtEveryTransaction(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	running := newBudget(t, sqlbudget.DBTx(db), "running")
	skipping := newBudget(t, sqlbudget.DBTx(db), "skipping", func(c *sqlbudget.Config) { c.SkipMigrate = true })
	for _, b := range []*sqlbudget.Budget{running, skipping} {
		s, err := b.Acquire(ctx, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO snapsvc_budget_schema (version) VALUES (?)`, sqlbudget.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	for _, b := range []*sqlbudget.Budget{running, skipping} {
		s, err := b.Acquire(ctx, "k", nil)
		if s != nil {
			s.Release(ctx)
		}
		if !errors.Is(err, budget.ErrRefused) || !strings.Contains(err.Error(), "schema is version") {
			t.Errorf("%s, once the schema is newer than it knows: slot %v, %v; want a refusal naming the schema's version", b.Holder(), s != nil, err)
		}
	}
}

// A holder that can no longer renew its row learns that its slot is lost
// before anyone else can take it: Lost closes ClockSkew before the row's
// earliest expiry, so before the next waiter's grant.
func TestLostBeforeSuccessor(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	h := sqliteHarness(t, 2*time.Second)
	mod := func(o budgetcontract.Options) sqlbudget.Config {
		cfg := h.Config(o)
		cfg.ClockSkew = 500 * time.Millisecond
		return cfg
	}
	a := h.NewParticipant(t, mod(optionsOf("cut", 0)))
	next := h.NewParticipant(t, mod(optionsOf("next", 0)))
	s, err := a.Acquire(ctx, "k", nil)
	if err != nil {
		t.Fatal(err)
	}
	queued := make(chan struct{})
	type grant struct {
		s  budget.Slot
		at time.Time
	}
	out := make(chan grant, 1)
	go func() {
		var once atomic.Bool
		ns, err := next.Acquire(ctx, "k", func(budget.Wait) {
			if once.CompareAndSwap(false, true) {
				close(queued)
			}
		})
		if err != nil {
			t.Error(err)
		}
		out <- grant{ns, time.Now()}
	}()
	<-queued
	a.Cut(true)
	<-s.Lost()
	lost := time.Now()
	g := <-out
	if g.s == nil {
		t.FailNow()
	}
	defer g.s.Release(ctx)
	granted := g.at
	t.Logf("holder cut off: it saw its slot lost %s before the next holder was granted it", granted.Sub(lost).Round(time.Millisecond))
	if !granted.After(lost) {
		t.Errorf("next holder granted %s before the holder learnt its slot was lost", lost.Sub(granted))
	}
	if !errors.Is(s.Err(), budget.ErrSlotLost) {
		t.Errorf("Err() = %v", s.Err())
	}
}

// A waiter far back polls seldom; if the queue reaches it sooner than it
// polls (those ahead of it gave up at once), the waiters behind it do not
// wait at the front for its next poll: a row that does not say it is
// awake (it was not at the front when it last wrote) is passed over when a
// slot comes free, and its waiter is served at its next poll, having moved
// up.
func TestDormantWaiterDoesNotHoldTheFront(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	if err := sqlbudget.DBTx(db)(ctx, sqlbudget.Migrate); err != nil {
		t.Fatal(err)
	}
	// A waiter that promised its next write in 10 minutes (it was 1,200
	// places back), now at the front: its row lives until then.
	if _, err := db.ExecContext(ctx, `INSERT INTO snapsvc_budget_slots (key, token, holder, max_spec, lease_ms, every_ms, awake, since, renewed)
		VALUES ('k', 'far', 'far-back', '1', 607000, 600000, 0, 0, 0)`); err != nil {
		t.Fatal(err)
	}
	b := newBudget(t, sqlbudget.DBTx(db), "next")
	actx, cancel := context.WithTimeout(ctx, 5*time.Second) // far less than the dormant row's lease
	defer cancel()
	s, err := b.Acquire(actx, "k", nil)
	if err != nil {
		t.Fatalf("a waiter behind a dormant row: %v, want the slot", err)
	}
	defer s.Release(ctx)
	st, err := b.Status(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Waiters) != 1 || st.Waiters[0].Holder != "far-back" {
		t.Errorf("status %+v: the dormant waiter must keep its row (its place is served at its next poll)", st.Waiters)
	}
}
