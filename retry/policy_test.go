package retry_test

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

func TestRetrierBounds(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	r := retry.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: 2 * time.Second, Multiplier: 2,
		RandomizationFactor: -1, MaxElapsedTime: 10 * time.Second, Clock: clock}
	rt := r.NewRetrier()
	ctx := context.Background()
	for rt.Exhausted() == "" {
		rt.Attempt()
		if err := rt.Pause(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := rt.Elapsed(); got != 10*time.Second {
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

func TestConflictPauseIsCapped(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	rt := retry.Policy{InitialInterval: 4 * time.Second, Clock: clock}.NewRetrier()
	if err := rt.PauseConflict(context.Background()); err != nil {
		t.Fatal(err)
	}
	if clock.pauses[0] != time.Second {
		t.Errorf("conflict pause %v, want the 1s default cap", clock.pauses[0])
	}
	if d := rt.ConflictPause(); d != time.Second {
		t.Errorf("ConflictPause %v, want the 1s default cap", d)
	}
	p := retry.Policy{MaxAttempts: 2, Clock: clock}.NewRetrier()
	p.Attempt()
	p.Attempt()
	if p.Exhausted() == "" {
		t.Error("not exhausted after MaxAttempts")
	}
}

func TestSleepHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := retry.Sleep(ctx, nil, time.Hour); err != context.Canceled {
		t.Errorf("Sleep on a cancelled context: %v", err)
	}
}

func TestUnreachableIsBoundedAndRedialledQuickly(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	rt := retry.Policy{MaxUnreachable: time.Second, RedialInterval: 100 * time.Millisecond, Clock: clock}.NewRetrier()
	absent := &snapd.ConnectionError{Method: "POST", Path: "/v2/apps", Err: errors.New("no such file")}
	answered := &snapd.Error{StatusCode: 503, Message: "busy"}
	ctx := context.Background()

	if !rt.Observe(absent) || rt.Observe(absent) {
		t.Fatal("Observe must report the start of a run of unreachability once")
	}
	if at, ok := rt.UnreachableDeadline(); !ok || !at.Equal(time.Unix(1, 0)) {
		t.Fatalf("deadline %v %v, want MaxUnreachable after the first failure", at, ok)
	}
	for i := 0; i < 3; i++ {
		if err := rt.Pause(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range clock.pauses {
		if p != 100*time.Millisecond {
			t.Fatalf("pauses while unreachable %v, want RedialInterval", clock.pauses)
		}
	}
	if rt.Exhausted() != "" {
		t.Fatal("exhausted before MaxUnreachable")
	}
	// An answer (even an error one) ends the run: the backoff applies again.
	rt.Observe(answered)
	if _, ok := rt.Unreachable(); ok {
		t.Fatal("still unreachable after an answer")
	}
	clock.now = clock.now.Add(5 * time.Second)
	if rt.Exhausted() != "" {
		t.Fatal("exhausted by an unreachability that ended")
	}
	rt.Observe(absent)
	clock.now = clock.now.Add(time.Second)
	if reason := rt.Exhausted(); !strings.Contains(reason, "snapd unreachable for 1s") {
		t.Fatalf("exhausted %q", reason)
	}
}

// Issue 18, defect 8: a NaN Multiplier or RandomizationFactor turned the
// backoff into a busy loop. Validate rejects such policies, and a policy
// never validated falls back to the defaults instead of spinning.
func TestPolicyValidateRejectsMeaninglessValues(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	bad := map[string]func(*retry.Policy){
		"NaN Multiplier":               func(p *retry.Policy) { p.Multiplier = nan },
		"Inf Multiplier":               func(p *retry.Policy) { p.Multiplier = inf },
		"negative Multiplier":          func(p *retry.Policy) { p.Multiplier = -2 },
		"NaN RandomizationFactor":      func(p *retry.Policy) { p.RandomizationFactor = nan },
		"-Inf RandomizationFactor":     func(p *retry.Policy) { p.RandomizationFactor = math.Inf(-1) },
		"negative InitialInterval":     func(p *retry.Policy) { p.InitialInterval = -time.Second },
		"negative MaxInterval":         func(p *retry.Policy) { p.MaxInterval = -time.Second },
		"negative MaxConflictInterval": func(p *retry.Policy) { p.MaxConflictInterval = -time.Second },
		"negative RedialInterval":      func(p *retry.Policy) { p.RedialInterval = -time.Second },
		"negative MaxAttempts":         func(p *retry.Policy) { p.MaxAttempts = -1 },
	}
	for name, set := range bad {
		p := retry.DefaultPolicy()
		set(&p)
		if err := p.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
		// Unvalidated, it still never spins: every pause is a real one.
		r := p.NewRetrier()
		if name != "negative MaxAttempts" {
			for i := 0; i < 5; i++ {
				if d := r.NextPause(); !(d >= 10*time.Millisecond) {
					t.Errorf("%s: pause %v", name, d)
				}
			}
		}
	}
	ok := retry.DefaultPolicy()
	ok.MaxElapsedTime, ok.MaxUnreachable, ok.RandomizationFactor = -1, -1, -1
	if err := ok.Validate(); err != nil || (retry.Policy{}).Validate() != nil {
		t.Errorf("documented values rejected: %v", err)
	}
}

// Issue 25, defect 10: "MaxInterval caps one pause" did not hold: backoff
// jitters around an interval capped at MaxInterval, so a default-policy
// pause reached 7.48 s; and Validate accepted an InitialInterval longer
// than MaxInterval.
func TestMaxIntervalCapsEveryPause(t *testing.T) {
	for _, p := range []retry.Policy{retry.DefaultPolicy(), retry.NestedPolicy(), {MaxInterval: 300 * time.Millisecond}} {
		r := p.NewRetrier()
		limit := p.MaxInterval
		var longest time.Duration
		for i := 0; i < 2000; i++ {
			longest = max(longest, r.NextPause())
		}
		if longest > limit {
			t.Errorf("MaxInterval %v: a pause of %v", limit, longest)
		}
		if longest < limit*9/10 {
			t.Errorf("MaxInterval %v: the longest of 2000 pauses is %v; the cap should be reached", limit, longest)
		}
	}
	for name, p := range map[string]retry.Policy{
		"InitialInterval over MaxInterval":     {InitialInterval: 10 * time.Second, MaxInterval: time.Second},
		"MaxConflictInterval over MaxInterval": {MaxInterval: 500 * time.Millisecond, MaxConflictInterval: time.Second},
		"RedialInterval over MaxInterval":      {MaxInterval: 20 * time.Millisecond, RedialInterval: 50 * time.Millisecond},
		"RandomizationFactor over 1":           {RandomizationFactor: 1.5},
		"Multiplier below 1":                   {Multiplier: 0.5},
	} {
		err := p.Validate()
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		t.Logf("%s: %v", name, err)
	}
	// Defaults follow the fields that are set: a short MaxInterval alone
	// is consistent, and its pauses never exceed it.
	short := retry.Policy{MaxInterval: 100 * time.Millisecond}
	if err := short.Validate(); err != nil {
		t.Errorf("MaxInterval alone: %v", err)
	}
	r := short.NewRetrier()
	for i := 0; i < 50; i++ {
		if d := r.NextPause(); d > 100*time.Millisecond {
			t.Fatalf("pause %v over a MaxInterval of 100ms", d)
		}
	}
}
