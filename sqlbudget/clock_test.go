package sqlbudget_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mattn/go-sqlite3"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/sqlbudget"
)

// dbClock is a database's clock that a test steps: an SQLite driver of
// its own whose connections' julianday('now') is the real time plus an
// offset (an application-defined function overrides SQLite's built-in of
// the same name and arity on the connection that defines it).
type dbClock struct {
	driver string
	offset atomic.Int64 // ns
}

var clockDrivers atomic.Int64

func newDBClock() *dbClock {
	c := &dbClock{driver: fmt.Sprintf("sqlite3_clock_%d", clockDrivers.Add(1))}
	sql.Register(c.driver, &sqlite3.SQLiteDriver{ConnectHook: func(conn *sqlite3.SQLiteConn) error {
		return conn.RegisterFunc("julianday", func(s string) (float64, error) {
			if s != "now" {
				return 0, fmt.Errorf("dbClock: julianday(%q): only 'now' is served", s)
			}
			now := time.Now().Add(time.Duration(c.offset.Load()))
			return float64(now.UnixNano())/float64(24*time.Hour) + 2440587.5, nil
		}, false)
	}})
	return c
}

// Step moves the database's clock by d.
func (c *dbClock) Step(d time.Duration) { c.offset.Add(int64(d)) }

// open opens the database at path with this clock, as openSQLite does.
func (c *dbClock) open(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open(c.driver, "file:"+path+"?_txlock=immediate&_busy_timeout=5000&_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// The database's clock decides nothing: stepped +5 min, then -10 min
// (5 min behind), then +5 min back, while a holder that fenced holds the
// slot and another machine waits, it frees no slot (the waiter stays
// waiting, the holder keeps its slot) and holds none back (the release
// hands over at once). Issue 41, item 1: rows expired when their
// timestamps, by the database's clock, passed julianday('now'), so a
// forward step freed every slot, lock-delay included (the waiter took the
// slot a poll after the step).
func TestDatabaseClockStepsFreeNoSlot(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	clock := newDBClock()
	path := filepath.Join(t.TempDir(), "budget.db")
	const ttl = time.Second
	mk := func(name string) *sqlbudget.Budget {
		return newBudget(t, sqlbudget.DBTx(clock.open(t, path)), name, func(c *sqlbudget.Config) { c.LockDelay = 30 * time.Second })
	}
	a, b := mk("a"), mk("b")
	s, err := a.Acquire(ctx, "k8s.kubelet", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatal(err)
	}
	type got struct {
		s   budget.Slot
		err error
	}
	out := make(chan got, 1)
	queued := make(chan struct{}, 1)
	go func() {
		s, err := b.Acquire(ctx, "k8s.kubelet", func(budget.Wait) {
			select {
			case queued <- struct{}{}:
			default:
			}
		})
		out <- got{s, err}
	}()
	<-queued
	for i, step := range []time.Duration{5 * time.Minute, -10 * time.Minute, 5 * time.Minute} {
		clock.Step(step)
		stepped := time.Now()
		// Three TTLs: the window in which a step would have freed the
		// slot. A machine arriving meanwhile must not get it either.
		late := make(chan got, 1)
		go func() {
			lctx, cancel := context.WithTimeout(ctx, 3*ttl)
			defer cancel()
			s, err := mk(fmt.Sprintf("late-%d", i)).Acquire(lctx, "k8s.kubelet", nil)
			late <- got{s, err}
		}()
		select {
		case r := <-out:
			t.Fatalf("b's wait ended (slot %v, err %v) %s after the database's clock stepped %s, while a holds the slot", r.s != nil, r.err, time.Since(stepped).Round(time.Millisecond), step)
		case <-s.Lost():
			t.Fatalf("a lost its slot %s after the database's clock stepped %s: %v", time.Since(stepped).Round(time.Millisecond), step, s.Err())
		case r := <-late:
			if r.s != nil {
				t.Fatalf("a machine arriving after the database's clock stepped %s took the slot %s after the step, while a holds it", step, time.Since(stepped).Round(time.Millisecond))
			}
			if !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("a machine arriving after a step of %s: %v", step, r.err)
			}
		}
		st, err := b.Status(ctx, "k8s.kubelet")
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Holders) != 1 || st.Holders[0].Holder != "a" || len(st.Waiters) != 1 || len(st.Vanished) != 0 {
			t.Fatalf("after a step of %s, the rows say %+v; want a holding, b waiting", step, st)
		}
		t.Logf("database clock stepped %s: a holds, b waits (3 TTLs watched)", step)
	}
	released := time.Now()
	if err := s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-out
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("released: b took the slot %s later", time.Since(released).Round(time.Millisecond))
	if d := time.Since(released); d > ttl {
		t.Errorf("b took the slot %s after the release: the steps held it back", d)
	}
	if err := r.s.Release(ctx); err != nil {
		t.Error(err)
	}
}
