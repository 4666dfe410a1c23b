package snapsvc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// BenchmarkLockHandOverByP measures what the snap's cross-process lock
// costs as processes are added: P processes (Clients with lock registries
// of their own, as separate processes have, sharing one lock directory)
// each restart a service of their own, one after the other, on a snapd
// whose restarts take restartTakes (fake time runs at real speed), so
// every restart waits for the lock of the snap the others hold. ms/restart
// is the time per restart (restartTakes is the ideal), overhead/restart
// what the hand-overs add to it.
func BenchmarkLockHandOverByP(b *testing.B) {
	const restartTakes = 20 * time.Millisecond
	const perProcess = 4
	for _, p := range []int{1, 2, 4, 8, 16} {
		b.Run(fmt.Sprintf("P=%d", p), func(b *testing.B) {
			apps := make([]fake.App, p)
			for i := range apps {
				apps[i] = fake.App{Name: fmt.Sprintf("svc%d", i), Daemon: "simple", Enabled: true, Active: true, StartDuration: restartTakes / 2, StopDuration: restartTakes / 2}
			}
			srv := fake.NewServer(b, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: apps}))
			clients := make([]*snapsvc.Client, p)
			for i := range clients {
				clients[i] = procClient(b, srv, fmt.Sprintf("proc-%d", i))
			}
			ctx := context.Background()
			b.ResetTimer()
			start := time.Now()
			for n := 0; n < b.N; n++ {
				var wg sync.WaitGroup
				for i, c := range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range perProcess {
							if _, err := c.Restart(ctx, []string{fmt.Sprintf("k8s.svc%d", i)}, snapsvc.RestartOptions{}); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			}
			per := time.Since(start) / time.Duration(b.N*p*perProcess)
			b.ReportMetric(float64(per)/float64(time.Millisecond), "ms/restart")
			b.ReportMetric(float64(per-restartTakes)/float64(time.Millisecond), "overhead-ms/restart")
		})
	}
}
