package retry_test

import (
	"context"
	"math"
	"testing"
	"time"

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

func TestSleepHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := retry.Sleep(ctx, nil, time.Hour); err != context.Canceled {
		t.Errorf("Sleep on a cancelled context: %v", err)
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
		// Unvalidated, it still never spins: its defaults are real pauses.
		if d := p.WithDefaults(); !(d.Multiplier >= 1) || !(d.RandomizationFactor >= 0 && d.RandomizationFactor <= 1) || d.InitialInterval <= 0 {
			t.Errorf("%s: with defaults %+v", name, d)
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
	if d := short.WithDefaults(); d.InitialInterval > d.MaxInterval || d.RedialInterval > d.MaxInterval || d.MaxConflictInterval > d.MaxInterval {
		t.Errorf("defaults above a MaxInterval of 100ms: %+v", d)
	}
}
