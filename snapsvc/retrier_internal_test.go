package snapsvc

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// recordingClock fires timers at once and records the pauses asked for.
type recordingClock struct {
	now    time.Time
	pauses []time.Duration
}

func (c *recordingClock) Now() time.Time { return c.now }

func (c *recordingClock) NewTimer(d time.Duration) retry.Timer {
	c.pauses = append(c.pauses, d)
	c.now = c.now.Add(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return firedTimer{ch}
}

type firedTimer struct{ ch chan time.Time }

func (t firedTimer) C() <-chan time.Time { return t.ch }
func (firedTimer) Stop() bool            { return false }

// pause waits the pause a call would take after a failure: RedialInterval
// while snapd is unreachable, the backoff otherwise.
func (r *retrier) pause(ctx context.Context) error {
	d := r.nextPause()
	if _, down := r.unreachable(); down {
		d = r.redialPause()
	}
	return retry.Sleep(ctx, r.p.Clock, d)
}

func TestRetrierBounds(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	r := retry.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: 2 * time.Second, Multiplier: 2,
		RandomizationFactor: -1, MaxElapsedTime: 10 * time.Second, Clock: clock}
	rt := newRetrier(r)
	ctx := context.Background()
	for rt.exhausted(nil) == "" {
		rt.attempt()
		if err := rt.pause(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := rt.elapsed(); got != 10*time.Second {
		t.Errorf("elapsed %v when exhausted, want exactly MaxElapsedTime (the last pause is shortened)", got)
	}
	for i, p := range clock.pauses {
		if p > 2*time.Second {
			t.Errorf("pause %d is %v, above MaxInterval", i, p)
		}
	}
	if clock.pauses[0] != 100*time.Millisecond || clock.pauses[1] != 200*time.Millisecond {
		t.Errorf("pauses do not grow from the initial interval: %v", clock.pauses[:3])
	}
}

func TestRetrierConflictPauseIsCapped(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	rt := newRetrier(retry.Policy{InitialInterval: 4 * time.Second, Clock: clock})
	if err := retry.Sleep(context.Background(), clock, rt.conflictPause()); err != nil {
		t.Fatal(err)
	}
	if clock.pauses[0] != time.Second {
		t.Errorf("conflict pause %v, want the 1s default cap", clock.pauses[0])
	}
	if d := rt.conflictPause(); d != time.Second {
		t.Errorf("ConflictPause %v, want the 1s default cap", d)
	}
	p := newRetrier(retry.Policy{MaxAttempts: 2, Clock: clock})
	p.attempt()
	p.attempt()
	if p.exhausted(nil) == "" {
		t.Error("not exhausted after MaxAttempts")
	}
}

func TestRetrierUnreachableIsBoundedAndRedialledQuickly(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	rt := newRetrier(retry.Policy{MaxUnreachable: time.Second, RedialInterval: 100 * time.Millisecond, Clock: clock})
	absent := &snapd.ConnectionError{Method: "POST", Path: "/v2/apps", Err: errors.New("no such file")}
	answered := &snapd.Error{StatusCode: 503, Message: "busy"}
	ctx := context.Background()

	if !rt.note(absent) || rt.note(absent) {
		t.Fatal("Observe must report the start of a run of unreachability once")
	}
	if at, ok := rt.unreachableDeadline(); !ok || !at.Equal(time.Unix(1, 0)) {
		t.Fatalf("deadline %v %v, want MaxUnreachable after the first failure", at, ok)
	}
	for i := 0; i < 3; i++ {
		if err := rt.pause(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range clock.pauses {
		if p != 100*time.Millisecond {
			t.Fatalf("pauses while unreachable %v, want RedialInterval", clock.pauses)
		}
	}
	if rt.exhausted(nil) != "" {
		t.Fatal("exhausted before MaxUnreachable")
	}
	// An answer (even an error one) ends the run: the backoff applies again.
	rt.note(answered)
	if _, ok := rt.unreachable(); ok {
		t.Fatal("still unreachable after an answer")
	}
	clock.now = clock.now.Add(5 * time.Second)
	if rt.exhausted(nil) != "" {
		t.Fatal("exhausted by an unreachability that ended")
	}
	rt.note(absent)
	clock.now = clock.now.Add(time.Second)
	if reason := rt.exhausted(nil); !strings.Contains(reason, "snapd unreachable for 1s") {
		t.Fatalf("exhausted %q", reason)
	}
}

func TestRetrierNestedPolicyIsShort(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	p := retry.NestedPolicy()
	p.Clock = clock
	rt := newRetrier(p)
	for rt.exhausted(nil) == "" {
		rt.attempt()
		if err := rt.pause(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := rt.elapsed(); got != 25*time.Second {
		t.Fatalf("exhausted after %v, want 25s (k8sd's loop: 5 attempts 5 s apart)", got)
	}
	for _, d := range clock.pauses {
		if d > 2*time.Second*3/2 { // MaxInterval 2s, jitter ±50%
			t.Fatalf("pause %v above 3s", d)
		}
	}
	if d := retry.DefaultPolicy(); p.MaxElapsedTime >= d.MaxElapsedTime || p.MaxConflictInterval != d.MaxConflictInterval {
		t.Fatalf("NestedPolicy %+v against DefaultPolicy %+v", p, d)
	}
}

// A policy never validated (a NaN Multiplier, say) still never spins: every
// pause is a real one (issue 18, defect 8).
func TestRetrierNeverSpinsOnAnUnvalidatedPolicy(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for name, set := range map[string]func(*retry.Policy){
		"NaN Multiplier":           func(p *retry.Policy) { p.Multiplier = nan },
		"Inf Multiplier":           func(p *retry.Policy) { p.Multiplier = inf },
		"negative Multiplier":      func(p *retry.Policy) { p.Multiplier = -2 },
		"NaN RandomizationFactor":  func(p *retry.Policy) { p.RandomizationFactor = nan },
		"-Inf RandomizationFactor": func(p *retry.Policy) { p.RandomizationFactor = math.Inf(-1) },
		"negative InitialInterval": func(p *retry.Policy) { p.InitialInterval = -time.Second },
		"negative MaxInterval":     func(p *retry.Policy) { p.MaxInterval = -time.Second },
	} {
		p := retry.DefaultPolicy()
		set(&p)
		r := newRetrier(p)
		for i := 0; i < 5; i++ {
			if d := r.nextPause(); !(d >= 10*time.Millisecond) {
				t.Errorf("%s: pause %v", name, d)
			}
		}
	}
}

// MaxInterval caps every pause, its jitter included (issue 25, defect 10:
// a default-policy pause reached 7.48 s).
func TestRetrierMaxIntervalCapsEveryPause(t *testing.T) {
	for _, p := range []retry.Policy{retry.DefaultPolicy(), retry.NestedPolicy(), {MaxInterval: 300 * time.Millisecond}, {MaxInterval: 100 * time.Millisecond}} {
		r := newRetrier(p)
		limit := p.MaxInterval
		var longest time.Duration
		for i := 0; i < 2000; i++ {
			longest = max(longest, r.nextPause())
		}
		if longest > limit {
			t.Errorf("MaxInterval %v: a pause of %v", limit, longest)
		}
		if longest < limit*9/10 {
			t.Errorf("MaxInterval %v: the longest of 2000 pauses is %v; the cap should be reached", limit, longest)
		}
	}
}
