//go:build libsqlite3

package dqlitetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/sqlbudget/internal/scaletest"
)

// dqliteScale is a run of scaletest on the package's 3-node cluster,
// every connection a dqlite client (a pool) of its own.
func dqliteScale(t testing.TB, waiters, machines int, ttl, steady time.Duration) scaletest.Result {
	c := cluster(t)
	return scaletest.Run(t, scaletest.Config{Backend: "dqlite, 3 nodes", Waiters: waiters, Machines: machines, TTL: ttl, Steady: steady,
		Open: func(t testing.TB) sqlbudget.TxFunc {
			db := c.DB("scale")
			t.Cleanup(func() { db.Close() })
			return sqlbudget.DBTx(db)
		}})
}

// 1,000 waiters on a real 3-node dqlite cluster: the queue forms, the
// holder keeps its slot (every renewal answered within TTL/3), and the
// rollout queued ahead of them hands over in order, judged from the fake
// snapds' change records (issue 34: the queue never formed in 3 minutes).
func TestThousandWaiters(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	r := dqliteScale(t, n-10, 10, 5*time.Second, 10*time.Second)
	t.Logf("\n%s\n%s", scaletest.Header, r.Row())
	if r.Lost > 0 || r.RenewalsMissed > 0 {
		t.Errorf("%d slots lost, %d of %d renewals not answered within TTL/3, with %d waiters queued", r.Lost, r.RenewalsMissed, r.Renewals, n)
	}
	if r.EarlyGrants > 0 || r.Peak > 1 {
		t.Errorf("%d early grants, %d restarting at once (budget 1)", r.EarlyGrants, r.Peak)
	}
}

// BenchmarkQueue measures the queue at 10, 100 and 1,000 waiters on the
// 3-node cluster (TTL 10 s, Poll 250 ms: the defaults), one run each
// whatever b.N, and prints the table sqlbudget/README.md shows:
//
//	go test -tags libsqlite3 -run '^$' -bench Queue -benchtime 1x .
func BenchmarkQueue(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			machines := min(n, 20)
			r := dqliteScale(b, n-machines, machines, sqlbudget.DefaultTTL, 3*sqlbudget.DefaultTTL)
			b.Logf("\n%s\n%s", scaletest.Header, r.Row())
			scaletest.Report(b, r)
		})
	}
}

// BenchmarkQueueExits is sqlbudget's BenchmarkQueueExits on the 3-node
// cluster: 1,000 waiters, 90% leaving at once (the first, or at random),
// or the first in line dying; the defaults; one run each whatever b.N:
//
//	go test -tags libsqlite3 -run '^$' -bench QueueExits -benchtime 1x .
func BenchmarkQueueExits(b *testing.B) {
	c := cluster(b)
	var rows []string
	for _, e := range []struct {
		leave string
		share float64
	}{{"first", 0.9}, {"random", 0.9}, {"dead-head", 0}} {
		b.Run(e.leave, func(b *testing.B) {
			r := scaletest.Exits(b, scaletest.ExitConfig{Backend: "dqlite, 3 nodes", Waiters: 1000, Leave: e.leave, Share: e.share, Seed: 41,
				Open: func(t testing.TB) sqlbudget.TxFunc {
					db := c.DB("exits")
					t.Cleanup(func() { db.Close() })
					return sqlbudget.DBTx(db)
				}})
			rows = append(rows, r.Row())
			b.ReportMetric(r.Polls(), "polls")
			b.ReportMetric(0, "ns/op")
		})
	}
	b.Logf("\n%s\n%s", scaletest.ExitHeader, strings.Join(rows, "\n"))
}
