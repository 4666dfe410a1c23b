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
// however slow snapd's answers, no 1 s window holds more than 20 of the
// wait's requests (the refusal that began it included; issue 25 defect 9:
// the first second held 21), nor more than 10 once the window starts 2 s
// into the wait; the first retry comes 10-20 ms after the refusal, the
// next ones at most 70 ms apart for the first 2 s and at most 140 ms
// apart until a minute (a blocker's end is seen within one step), then
// further apart up to the cap.
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
			sends := []time.Time{t0} // the refused request that begins the wait
			clk.now = clk.now.Add(slow)
			var prev time.Time
			for k := 1; k <= 800; k++ {
				d := cd.next(sends[len(sends)-1])
				if d < 0 {
					t.Fatalf("%s: negative pause %v", name, d)
				}
				clk.now = clk.now.Add(d) // retry k is sent
				sends = append(sends, clk.now)
				at := clk.now.Sub(t0)
				gap := clk.now.Sub(prev)
				switch {
				case k == 1 && (at < 10*time.Millisecond || at > 20*time.Millisecond) && slow < 10*time.Millisecond:
					t.Fatalf("%s: first retry at %v, want 10-20ms", name, at)
				case k > 2 && slow == 0 && at < cadenceSteady && gap > 70*time.Millisecond:
					t.Fatalf("%s: retry %d at %v, %v after the one before (want <= 70ms in the first 2s)", name, k, at, gap)
				case k > 2 && slow == 0 && at > cadenceSteady+200*time.Millisecond && at < cadenceSteady+cadenceSlowFor && gap > 140*time.Millisecond:
					t.Fatalf("%s: retry %d at %v, %v after the one before (want <= 140ms until a minute)", name, k, at, gap)
				case k > 2 && gap < 30*time.Millisecond:
					t.Fatalf("%s: retry %d only %v after the one before", name, k, gap)
				case at > 90*time.Second && gap > time.Second+time.Second/5:
					t.Fatalf("%s: step %v past the cap", name, gap)
				}
				prev = clk.now
				clk.now = clk.now.Add(slow) // its refusal comes back
			}
			// Every window of 1 s, wherever it starts.
			for i := range sends {
				limit := cadenceFastMax
				if sends[i].Sub(t0) >= cadenceSteady {
					limit = cadenceSlowMax
				}
				in := 0
				for j := i; j < len(sends) && sends[j].Sub(sends[i]) < time.Second; j++ {
					in++
				}
				if in > limit {
					t.Fatalf("%s (answers take %v): %d requests in the 1s from %v, want <= %d", name, slow, in, sends[i].Sub(t0), limit)
				}
			}
			if late := clk.now.Sub(t0); late < 2*time.Minute {
				t.Errorf("%s: 800 retries within %v: the step never grew", name, late)
			}
		}
	}
	// A new wait starts the grid again.
	clk := &nowClock{now: time.Unix(1000, 0)}
	cd := newCadence(clk, 0)
	for range 100 {
		clk.now = clk.now.Add(cd.next(clk.now))
	}
	cd.reset()
	if d := cd.next(clk.now); d > 20*time.Millisecond {
		t.Errorf("after reset: first pause %v", d)
	}
	if cd.cap != time.Second {
		t.Errorf("cap %v with no policy cap, want the default 1s", cd.cap)
	}
}
