package sqlbudget_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/sqlbudget"
)

// A budget on a plain SQLite database: take the slot of a key, fence
// before acting, mark ready, give it back. In a microcluster daemon, Tx is
// s.Database().Transaction instead (docs/microcluster.md).
func Example() {
	dir, _ := os.MkdirTemp("", "sqlbudget-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "budget.db")+"?_txlock=immediate&_busy_timeout=5000&_journal_mode=WAL")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	b, err := sqlbudget.New(sqlbudget.Config{DB: db, Max: 1, Holder: "node-1"})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	s, err := b.Acquire(ctx, "microovn.ovn-northd", nil)
	if err != nil {
		panic(err)
	}
	valid, err := s.(budget.Fencer).Fence(ctx) // right before the restart
	d, ends := valid.Duration()
	fmt.Println("holding", s.Key(), "- fence stands at least 9s:", err == nil && ends && d >= 9*time.Second)
	// ... restart, wait until ready ...
	_ = s.(budget.Readier).MarkReady(ctx)
	st, _ := b.Status(ctx, "microovn.ovn-northd")
	fmt.Println("holders:", st.Holders[0].Holder, "acted and ready:", !st.Holders[0].Acted.IsZero() && !st.Holders[0].Ready.Before(st.Holders[0].Acted))
	_ = s.Release(ctx)
	// Output:
	// holding microovn.ovn-northd - fence stands at least 9s: true
	// holders: node-1 acted and ready: true
}

// An operator pauses a key cluster-wide: holders wait at their next fence,
// holding their slot, until it is resumed.
func ExampleBudget_Pause() {
	dir, _ := os.MkdirTemp("", "sqlbudget-example")
	defer os.RemoveAll(dir)
	db, _ := sql.Open("sqlite3", "file:"+filepath.Join(dir, "budget.db")+"?_txlock=immediate&_busy_timeout=5000")
	defer db.Close()
	ops, _ := sqlbudget.New(sqlbudget.Config{DB: db, Holder: "alice@ops-1"})
	ctx := context.Background()
	p, _ := ops.Pause(ctx, "microceph.mon", "disk alarm on node-3")
	st, _ := ops.Status(ctx, "microceph.mon + microceph.mon") // keys are canonical: sorted, de-duplicated parts
	fmt.Println(st.Key, "paused by", p.By+":", st.Paused.Reason)
	was, _ := ops.Resume(ctx, "microceph.mon")
	fmt.Println("resumed:", was)
	// Output:
	// microceph.mon paused by alice@ops-1: disk alarm on node-3
	// resumed: true
}
