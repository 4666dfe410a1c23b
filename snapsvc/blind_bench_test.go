package snapsvc_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// BenchmarkBlindWaitLongBlocker measures blind waits (a strictly
// confined snap without snap-refresh-observe, snapctl on snapd 2.77: the
// blocker cannot be seen) behind blockers of 3, 10 and 30 s, each sample
// ending at a random phase of the retry grid (the blocker's length is
// drawn from [d, d+1 s)). Time is the fake's manual clock, so a 30 s
// blocker costs milliseconds. Metrics per blocker length: wake p50 and p99
// (the blocker's end to snapd accepting the retried request) and the
// requests per second after the wait's first 2 s. Run it with
//
//	go test -run '^$' -bench BlindWaitLongBlocker -benchtime 200x ./snapsvc
func BenchmarkBlindWaitLongBlocker(b *testing.B) {
	for _, d := range []time.Duration{3 * time.Second, 10 * time.Second, 30 * time.Second} {
		b.Run(d.String(), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(uint64(d), 25))
			var wakes []time.Duration
			var reqs int
			var after time.Duration
			for i := 0; i < b.N; i++ {
				mc := fake.NewManualClock(time.Now())
				srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithVersion(fake.Version277), fake.WithClock(mc), fake.WithSnapSocketObserveDenied())
				if err != nil {
					b.Fatal(err)
				}
				c, err := snapsvc.New(snapsvc.WithSnapSocket(srv.SnapSocketPath()),
					snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithCookie(srv.Cookie("k8s")), snapsvc.WithSnap("k8s"),
					snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithoutFileLock())
				if err != nil {
					b.Fatal(err)
				}
				hold := d + time.Duration(rng.Int64N(int64(time.Second)))
				_, end := blindRun(b, srv, mc, c, hold, nil)
				var refused, accepted time.Time
				var times []time.Time
				for _, r := range srv.Requests() {
					if r.Method != "POST" || r.Path != "/v2/snapctl" {
						continue
					}
					if r.Status >= 400 {
						if refused.IsZero() {
							refused = r.Time
						}
						times = append(times, r.Time)
					} else if !refused.IsZero() && accepted.IsZero() {
						accepted = r.Time
					}
				}
				wakes = append(wakes, accepted.Sub(end))
				for _, at := range times {
					if at.Sub(refused) >= 2*time.Second {
						reqs++
					}
				}
				after += end.Sub(refused) - 2*time.Second
				c.Close()
				srv.Close()
			}
			slices.Sort(wakes)
			b.ReportMetric(float64(wakes[len(wakes)/2])/1e6, "wake-p50-ms")
			b.ReportMetric(float64(wakes[len(wakes)*99/100])/1e6, "wake-p99-ms")
			b.ReportMetric(float64(reqs)/after.Seconds(), "req/s-after-2s")
		})
	}
}
