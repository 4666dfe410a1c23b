//go:build libsqlite3

package dqlitetest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/sqlbudget"
)

// libfaketime is Debian's libfaketime (.ci/dqlite-deps installs it).
const libfaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"

// fakeClock is the wall clock of a cluster's nodes, each run with
// libfaketime preloaded: the offset in file is read again at least every
// second (FAKETIME_CACHE_DURATION). Their monotonic clock is left alone
// (FAKETIME_DONT_FAKE_MONOTONIC: raft's timers run on it), and so is the
// Go runtime's clock (it reads the vDSO, not libc): what moves is what
// SQLite's julianday('now') reads on the node that runs a statement.
type fakeClock struct{ file string }

func (f fakeClock) env() []string {
	return []string{"LD_PRELOAD=" + libfaketime, "FAKETIME_TIMESTAMP_FILE=" + f.file, "FAKETIME_CACHE_DURATION=1", "FAKETIME_DONT_FAKE_MONOTONIC=1"}
}

// set sets the nodes' wall clock to the real time plus d.
func (f fakeClock) set(t *testing.T, d time.Duration) {
	t.Helper()
	if err := os.WriteFile(f.file, []byte(fmt.Sprintf("%+d\n", int64(d/time.Second))), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dbOffset reads how far the leader's julianday('now') is from the test's
// clock.
func dbOffset(ctx context.Context, t *testing.T, c *Cluster) time.Duration {
	t.Helper()
	db := c.DB("clock")
	defer db.Close()
	var jd float64
	if err := db.QueryRowContext(ctx, `SELECT julianday('now')`).Scan(&jd); err != nil {
		t.Fatal(err)
	}
	at := time.Unix(0, int64((jd-2440587.5)*float64(24*time.Hour)))
	return time.Until(at)
}

// awaitOffset waits until the leader's clock reads d off the real time
// (within 2 s), the nodes having read their offset file again.
func awaitOffset(ctx context.Context, t *testing.T, c *Cluster, d time.Duration) {
	t.Helper()
	for {
		got := dbOffset(ctx, t, c)
		if math.Abs(float64(got-d)) < float64(2*time.Second) {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the nodes' clock is %s off, want %s: is libfaketime preloaded?", got.Round(time.Second), d)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// The nodes' wall clock decides nothing: a real 3-node dqlite cluster
// whose nodes run under libfaketime, stepped +5 min, then -10 min (5 min
// behind), then +5 min back, while a holder that fenced holds the slot
// and another machine waits. In each step's window (three TTLs) a machine
// that arrives gets no slot, the waiter keeps waiting, the holder keeps
// its slot, and the rows say so (one holder, one waiter); the release
// then hands over at once. Issue 41, item 1: on a forward step the rows
// expired by the leader's clock and the next machine restarted 157-200 ms
// later (4 of 4 runs).
func TestDatabaseClockStepsDqlite(t *testing.T) {
	if _, err := os.Stat(libfaketime); err != nil {
		t.Fatalf("%v: run .ci/dqlite-deps (Debian's libfaketime)", err)
	}
	clock := fakeClock{file: filepath.Join(t.TempDir(), "faketime.rc")}
	clock.set(t, 0)
	c := newCluster(t, clock.env()...)
	ctx := ctxT(t, 3*time.Minute)
	awaitOffset(ctx, t, c, 0)
	const ttl = 2 * time.Second
	key := uniqueKey(t)
	mk := func(name string) *sqlbudget.Budget {
		db := c.DB(name)
		t.Cleanup(func() { db.Close() })
		b, err := sqlbudget.New(sqlbudget.Config{Tx: sqlbudget.DBTx(db), Holder: name, TTL: ttl, ClockSkew: ttl / 10, LockDelay: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := mk("a"), mk("b")
	s, err := a.Acquire(ctx, key, nil)
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
		s, err := b.Acquire(ctx, key, func(budget.Wait) {
			select {
			case queued <- struct{}{}:
			default:
			}
		})
		out <- got{s, err}
	}()
	<-queued
	offset := time.Duration(0)
	for i, step := range []time.Duration{5 * time.Minute, -10 * time.Minute, 5 * time.Minute} {
		offset += step
		clock.set(t, offset)
		awaitOffset(ctx, t, c, offset)
		stepped := time.Now()
		late := make(chan got, 1)
		go func() {
			lctx, cancel := context.WithTimeout(ctx, 3*ttl)
			defer cancel()
			s, err := mk(fmt.Sprintf("late-%d", i)).Acquire(lctx, key, nil)
			late <- got{s, err}
		}()
		select {
		case r := <-out:
			t.Fatalf("b's wait ended (slot %v, err %v) %s after the nodes' clocks stepped %s, while a holds the slot", r.s != nil, r.err, time.Since(stepped).Round(time.Millisecond), step)
		case <-s.Lost():
			t.Fatalf("a lost its slot %s after the nodes' clocks stepped %s: %v", time.Since(stepped).Round(time.Millisecond), step, s.Err())
		case r := <-late:
			if r.s != nil {
				t.Fatalf("a machine arriving after the nodes' clocks stepped %s took the slot %s after the step, while a holds it", step, time.Since(stepped).Round(time.Millisecond))
			}
			if !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("a machine arriving after a step of %s: %v", step, r.err)
			}
		}
		st, err := b.Status(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Holders) != 1 || st.Holders[0].Holder != "a" || len(st.Waiters) != 1 || len(st.Vanished) != 0 {
			t.Fatalf("after a step of %s, the rows say %+v; want a holding, b waiting", step, st)
		}
		t.Logf("nodes' clocks stepped %s (now %s off; the database says it is %s): a holds, b waits (3 TTLs watched)", step, offset, st.Now.Format(time.TimeOnly))
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
