package etcdbudget_test

import (
	"context"
	"slices"
	"testing"
	"time"
)

// BenchmarkAcquireRelease measures an uncontended acquire and release of
// one slot on a healthy 3-member loopback cluster (member processes, fsync
// on): a lease grant, the enqueue transaction, the linearizable queue
// read, and the revoke. It reports the p50 and p99 of one acquire+release.
func BenchmarkAcquireRelease(b *testing.B) {
	p := cluster(b)
	cli := client(b, p.Endpoints()...)
	bud := newBudget(b, cli, "bench", 1)
	ctx := context.Background()
	key := "bench-" + time.Now().Format("150405.000000")
	var d []time.Duration
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		s, err := bud.Acquire(ctx, key, nil)
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Release(ctx); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(start))
	}
	slices.Sort(d)
	pct := func(q float64) float64 { return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
