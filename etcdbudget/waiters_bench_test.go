package etcdbudget_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
)

// BenchmarkWaiters queues 1,000 waiters on one key of a loopback 3-member
// cluster, behind a holder that keeps its slot ("idle") or behind a holder
// that recorded an act and vanished ("vanished": its client closed, so
// its lease expires and its guard holds the slot back for the 3-minute
// lock-delay, with a HolderReady probe that never proves anything), and
// counts, over 75 seconds (longer than the longest Recheck) once every
// waiter queued, what the waiters cost etcd per second: queue reads,
// other requests, keep-alive requests, watches opened, and HolderReady
// probes; and the watches open per waiter at the end. Defaults apart
// from the lock-delay (TTL 10s, Recheck 1 minute ±20%).
//
//	go test -run '^$' -bench Waiters -benchtime 1x .
func BenchmarkWaiters(b *testing.B) {
	const n, window = 1000, 75 * time.Second
	for _, vanish := range []bool{false, true} {
		name := "idle"
		if vanish {
			name = "vanished"
		}
		b.Run(fmt.Sprintf("%s/waiters=%d", name, n), func(b *testing.B) {
			p := cluster(b)
			for b.Loop() {
				key := fmt.Sprintf("waiters-%s-%d", name, time.Now().UnixNano())
				hcli := client(b, p.Endpoints()...)
				holder := newBudget(b, hcli, "holder", 1, func(c *etcdbudget.Config) {
					c.TTL, c.Unreachable, c.LockDelay = 10*time.Second, 10*time.Second, 3*time.Minute
				})
				ctx, cancel := context.WithCancel(context.Background())
				first, err := holder.Acquire(ctx, key, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := first.(budget.Fencer).Fence(ctx); err != nil {
					b.Fatal(err)
				}
				cli := client(b, p.Endpoints()...)
				bud := newBudget(b, cli, "waiter", 1, func(c *etcdbudget.Config) {
					c.TTL, c.Unreachable, c.LockDelay = 10*time.Second, 10*time.Second, 3*time.Minute
					c.HolderReady = func(context.Context, etcdbudget.VanishedHolder) bool { return false }
				})
				var wg sync.WaitGroup
				queued := make(chan error, n)
				for range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						once := false
						s, err := bud.Acquire(ctx, key, func(budget.Wait) {
							if !once {
								once = true
								queued <- nil
							}
						})
						switch {
						case err == nil:
							s.Release(context.Background())
						case !once:
							queued <- err
						}
					}()
				}
				for range n {
					if err := <-queued; err != nil {
						b.Fatalf("a waiter failed to queue: %v", err)
					}
				}
				if vanish {
					hcli.Close() // no release: the lease expires, the guard stays
					for {
						st, err := bud.Status(context.Background(), key)
						if err != nil {
							b.Fatal(err)
						}
						if len(st.Vanished) == 1 {
							break
						}
						time.Sleep(200 * time.Millisecond) // polling etcd's state
					}
				}
				before := bud.Stats()
				time.Sleep(window) // the measurement window
				after := bud.Stats()
				cancel()
				wg.Wait()
				if !vanish {
					first.Release(context.Background())
				}
				s := window.Seconds()
				b.ReportMetric(float64(after.QueueReads-before.QueueReads)/s, "reads/s")
				b.ReportMetric(float64((after.Requests-before.Requests)-(after.KeepAlives-before.KeepAlives))/s, "req/s")
				b.ReportMetric(float64(after.KeepAlives-before.KeepAlives)/s, "keepalive-req/s")
				b.ReportMetric(float64(after.Watches-before.Watches)/s, "watches-opened/s")
				b.ReportMetric(float64(after.Watching)/n, "watches/waiter")
				b.ReportMetric(float64(after.HolderReadyProbes-before.HolderReadyProbes)/s, "probes/s")
			}
		})
	}
}
