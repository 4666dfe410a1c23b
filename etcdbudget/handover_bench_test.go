package etcdbudget_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
)

// BenchmarkHandOver queues N waiters on one key of a loopback 3-member
// cluster (member processes, fsync on), then lets each, once it holds
// the slot, release it at once: N hand-overs in a chain. It reports the
// etcd requests per hand-over (keep-alives apart: they are paid per
// waiter per TTL/3 whether or not anything moves), the waiters' queue
// reads per hand-over (1 when each release wakes only the next waiter),
// and the hand-over latency, from the holder's Release call to the next
// holder's Acquire returning, p50 and p99. Every hand-over includes the
// new holder's lock-delay guard (a lease grant and a put).
//
//	go test -run '^$' -bench HandOver -benchtime 1x .
func BenchmarkHandOver(b *testing.B) {
	for _, n := range []int{35, 1000} {
		b.Run(fmt.Sprintf("waiters=%d", n), func(b *testing.B) {
			p := cluster(b)
			cli := client(b, p.Endpoints()...)
			bud := newBudget(b, cli, "bench", 1, func(c *etcdbudget.Config) {
				c.TTL, c.Unreachable, c.Attempt = 30*time.Second, 30*time.Second, 5*time.Second
			})
			ctx := context.Background()
			var lat []time.Duration
			var reqs, kas, reads, handovers uint64
			for b.Loop() {
				key := fmt.Sprintf("bench-%d-%d", n, time.Now().UnixNano())
				first, err := bud.Acquire(ctx, key, nil)
				if err != nil {
					b.Fatal(err)
				}
				type res struct {
					s   budget.Slot
					err error
					at  time.Time
				}
				acq := make(chan res, n)
				queued := make(chan struct{}, n)
				for range n {
					go func() {
						once := false
						s, err := bud.Acquire(ctx, key, func(budget.Wait) {
							if !once {
								once = true
								queued <- struct{}{}
							}
						})
						acq <- res{s, err, time.Now()}
					}()
				}
				for range n {
					<-queued
				}
				before := bud.Stats()
				rel := time.Now()
				if err := first.Release(ctx); err != nil {
					b.Fatal(err)
				}
				for range n {
					r := <-acq
					if r.err != nil {
						b.Fatal(r.err)
					}
					lat = append(lat, r.at.Sub(rel))
					rel = time.Now()
					if err := r.s.Release(ctx); err != nil {
						b.Fatal(err)
					}
				}
				after := bud.Stats()
				reqs += after.Requests - before.Requests - (after.KeepAlives - before.KeepAlives)
				kas += after.KeepAlives - before.KeepAlives
				reads += after.QueueReads - before.QueueReads
				handovers += uint64(n)
			}
			slices.Sort(lat)
			pct := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
			b.ReportMetric(float64(reqs)/float64(handovers), "req/handover")
			b.ReportMetric(float64(reads)/float64(handovers), "reads/handover")
			b.ReportMetric(float64(kas)/float64(handovers), "keepalive-req/handover")
			b.ReportMetric(pct(0.50), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
		})
	}
}
