package snapsvc

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// nowClock is a retry.Clock whose time only the test moves.
type nowClock struct{ now time.Time }

func (c *nowClock) Now() time.Time                     { return c.now }
func (c *nowClock) NewTimer(time.Duration) retry.Timer { panic("not used") }

// The blind cadence's arithmetic (cadence.go): whatever the jitter and
// however slow snapd's answers, a wait that ends at retry k made k-1
// requests in at least (k-1) x 50 ms (<= 20 per second at every moment);
// the first retry comes 10-20 ms after the refusal, the next ones at most
// 70 ms apart for the first 2 s (a blocker's end is seen within one step),
// then further apart up to the cap.
func TestCadenceArithmetic(t *testing.T) {
	rnds := map[string]func() float64{
		"low":  func() float64 { return 0 },
		"high": func() float64 { return 0.999999 },
	}
	for seed := range 20 {
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		rnds["seed"+string(rune('a'+seed))] = r.Float64
	}
	for name, rnd := range rnds {
		for _, slow := range []time.Duration{0, 3 * time.Millisecond, 70 * time.Millisecond} {
			clk := &nowClock{now: time.Unix(1000, 0)}
			cd := newCadence(clk, time.Second)
			cd.rnd = rnd
			t0 := clk.now
			var prev time.Time
			for k := 1; k <= 200; k++ {
				d := cd.next()
				if d < 0 {
					t.Fatalf("%s: negative pause %v", name, d)
				}
				clk.now = clk.now.Add(d) // retry k is sent
				at := clk.now.Sub(t0)
				switch {
				case k == 1 && (at < 10*time.Millisecond || at > 20*time.Millisecond):
					t.Fatalf("%s: first retry at %v, want 10-20ms", name, at)
				case k > 1 && float64(k-1)/at.Seconds() > 20.0000001:
					t.Fatalf("%s (answers take %v): %d requests while waiting %v: %.2f/s > 20/s", name, slow, k-1, at, float64(k-1)/at.Seconds())
				case k > 2 && slow == 0 && at < cadenceSteady && clk.now.Sub(prev) > 70*time.Millisecond:
					t.Fatalf("%s: retry %d at %v, %v after the one before (want <= 70ms in the first 2s)", name, k, at, clk.now.Sub(prev))
				case k > 2 && clk.now.Sub(prev) < 30*time.Millisecond:
					t.Fatalf("%s: retry %d only %v after the one before", name, k, clk.now.Sub(prev))
				case at > 30*time.Second && clk.now.Sub(prev) > time.Second+time.Second/5:
					t.Fatalf("%s: step %v past the cap", name, clk.now.Sub(prev))
				}
				prev = clk.now
				clk.now = clk.now.Add(slow) // its refusal comes back
			}
			if late := clk.now.Sub(t0); late < time.Minute {
				t.Errorf("%s: 200 retries within %v: the step never grew", name, late)
			}
		}
	}
	// A new wait starts the grid again.
	clk := &nowClock{now: time.Unix(1000, 0)}
	cd := newCadence(clk, 0)
	for range 100 {
		clk.now = clk.now.Add(cd.next())
	}
	cd.reset()
	if d := cd.next(); d > 20*time.Millisecond {
		t.Errorf("after reset: first pause %v", d)
	}
	if cd.cap != time.Second {
		t.Errorf("cap %v with no policy cap, want the default 1s", cd.cap)
	}
}
