package sqlbudget_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/sqlbudget/internal/scaletest"
)

// sqliteScale is a run of scaletest on a SQLite file of the test's own,
// every connection a pool of its own.
func sqliteScale(t testing.TB, waiters, machines int, ttl, steady time.Duration) scaletest.Result {
	path := filepath.Join(t.TempDir(), "budget.db")
	return scaletest.Run(t, scaletest.Config{Backend: "SQLite", Waiters: waiters, Machines: machines, TTL: ttl, Steady: steady,
		Open: func(t testing.TB) sqlbudget.TxFunc { return sqlbudget.DBTx(openSQLite(t, path)) }})
}

// A holder keeps its slot while 1,000 waiters queue behind it, and the
// rollout queued ahead of them hands over in order (issue 34: each poll
// read every row of the key, the database saturated, the holder's renewal
// went unanswered past its TTL and it lost its slot; 577 waiters failed).
// Judged from the budgets' records (renewals, losses, grants) and from
// the fake snapds' (never two restarting at once).
func TestHolderKeepsSlotUnder1000Waiters(t *testing.T) {
	r := sqliteScale(t, 990, 10, 5*time.Second, 10*time.Second)
	t.Logf("\n%s\n%s", scaletest.Header, r.Row())
	if r.Lost > 0 || r.RenewalsMissed > 0 {
		t.Errorf("%d slots lost, %d of %d renewals not answered within TTL/3, with 1,000 waiters queued", r.Lost, r.RenewalsMissed, r.Renewals)
	}
	if r.EarlyGrants > 0 || r.Peak > 1 {
		t.Errorf("%d early grants, %d restarting at once (budget 1)", r.EarlyGrants, r.Peak)
	}
}

// BenchmarkQueue measures the queue at 10, 100 and 1,000 waiters on
// SQLite (TTL 10 s, Poll 250 ms: the defaults), one run each whatever
// b.N, and prints the table sqlbudget/README.md shows:
//
//	go test -run '^$' -bench Queue -benchtime 1x .
func BenchmarkQueue(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			machines := min(n, 20)
			r := sqliteScale(b, n-machines, machines, sqlbudget.DefaultTTL, 3*sqlbudget.DefaultTTL)
			b.Logf("\n%s\n%s", scaletest.Header, r.Row())
			scaletest.Report(b, r)
		})
	}
}
