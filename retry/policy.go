package retry

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Policy bounds how long and how often an operation is retried when the
// cause of a failure cannot be watched directly (snapd unreachable, or a
// conflict whose blocking change cannot be found). Conflicts whose blocking
// change is visible are not paced by the policy: the operation is retried
// as soon as that change is ready, and only MaxAttempts and MaxElapsedTime
// bound them.
type Policy struct {
	// InitialInterval is the first pause (default 250ms).
	InitialInterval time.Duration
	// MaxInterval caps every pause, its jitter included (default 5s, or
	// InitialInterval when that is longer).
	MaxInterval time.Duration
	// MaxConflictInterval caps the pause before retrying a conflict whose
	// blocking change cannot be seen (a snap without snap-refresh-observe,
	// say): such conflicts usually clear within seconds, and a refused
	// request costs snapd little (default 1s, or MaxInterval when that is
	// shorter).
	MaxConflictInterval time.Duration
	// Multiplier grows the pause after each retry (default 1.6).
	Multiplier float64
	// RandomizationFactor jitters each pause by ± this fraction (default
	// 0.5; negative: no jitter).
	RandomizationFactor float64
	// MaxAttempts bounds the attempts, the first included (0: no bound).
	MaxAttempts int
	// MaxElapsedTime bounds the time spent retrying (default 5m; negative:
	// no bound other than the context). snapsvc enforces it as a deadline
	// on the whole call, the wait for the operation's own change included
	// unless ChangeWait says otherwise.
	MaxElapsedTime time.Duration
	// MaxUnreachable bounds how long snapd may stay unreachable — its
	// socket missing, nobody listening, no connection made — before an
	// operation gives up, far below MaxElapsedTime: a snapd that restarts
	// keeps its socket (systemd holds it) and is back within seconds, so
	// a socket that stays absent is a misconfiguration or a machine still
	// booting (default 30s; negative: only MaxElapsedTime bounds it).
	MaxUnreachable time.Duration
	// ChangeWait bounds how long an operation waits for the change it
	// made, once snapd accepted it: snapd has acted, and what is left is
	// to see the outcome. 0 (the default): the call's MaxElapsedTime
	// bounds that wait with the rest of the call. Negative: only the
	// context (and MaxUnreachable) bounds it, as the snap command waits
	// for its change as long as it takes. Positive: at most that long
	// from snapd's answer, whatever is left of MaxElapsedTime.
	ChangeWait time.Duration
	// RedialInterval is the pause between attempts while snapd is
	// unreachable (default 50ms, or MaxInterval when that is shorter). It is short because such attempts never
	// reach snapd, so they cost it nothing, and an operation waiting for
	// a socket that appears late then goes ahead within this interval.
	RedialInterval time.Duration
	// Clock drives pauses; nil means the real clock. Tests inject one.
	Clock Clock
}

// DefaultPolicy returns the policy snapsvc uses unless told otherwise.
func DefaultPolicy() Policy {
	return Policy{
		InitialInterval:     250 * time.Millisecond,
		MaxInterval:         5 * time.Second,
		MaxConflictInterval: time.Second,
		Multiplier:          1.6,
		RandomizationFactor: 0.5,
		MaxElapsedTime:      5 * time.Minute,
		MaxUnreachable:      30 * time.Second,
		RedialInterval:      50 * time.Millisecond,
	}
}

// Validate reports every field of p that has no meaning, and every pair
// of fields that contradict each other:
//   - a NaN or infinite Multiplier or RandomizationFactor, a Multiplier
//     below 1 (other than 0), a RandomizationFactor above 1, a negative
//     interval (InitialInterval, MaxInterval, MaxConflictInterval,
//     RedialInterval) or a negative MaxAttempts;
//   - an InitialInterval, MaxConflictInterval or RedialInterval longer
//     than MaxInterval, which caps every pause.
//
// Zero fields take their defaults (consistent with the fields set: see
// each field), and a negative MaxElapsedTime, MaxUnreachable or
// RandomizationFactor has its documented meaning. Such a policy would
// otherwise turn the backoff into a busy loop, a nonsense wait, or a bound
// that does not hold.
func (p Policy) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    float64
	}{{"Multiplier", p.Multiplier}, {"RandomizationFactor", p.RandomizationFactor}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			errs = append(errs, fmt.Errorf("retry policy: %s is %v; want a finite number", f.name, f.v))
		}
	}
	if p.Multiplier < 0 || (p.Multiplier > 0 && p.Multiplier < 1) {
		errs = append(errs, fmt.Errorf("retry policy: Multiplier is %v; want at least 1 (or 0 for the default)", p.Multiplier))
	}
	if p.RandomizationFactor > 1 {
		errs = append(errs, fmt.Errorf("retry policy: RandomizationFactor is %v; want at most 1 (a pause jittered by more than itself could be negative)", p.RandomizationFactor))
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"InitialInterval", p.InitialInterval}, {"MaxInterval", p.MaxInterval}, {"MaxConflictInterval", p.MaxConflictInterval}, {"RedialInterval", p.RedialInterval}} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("retry policy: %s is %v; want a positive duration (or 0 for the default)", f.name, f.d))
		}
	}
	if p.MaxAttempts < 0 {
		errs = append(errs, fmt.Errorf("retry policy: MaxAttempts is %d; want 0 (no bound) or more", p.MaxAttempts))
	}
	if p.MaxInterval > 0 {
		for _, f := range []struct {
			name string
			d    time.Duration
		}{{"InitialInterval", p.InitialInterval}, {"MaxConflictInterval", p.MaxConflictInterval}, {"RedialInterval", p.RedialInterval}} {
			if f.d > p.MaxInterval {
				errs = append(errs, fmt.Errorf("retry policy: %s %v is longer than MaxInterval %v, which caps every pause; shorten it or raise MaxInterval", f.name, f.d, p.MaxInterval))
			}
		}
	}
	return errors.Join(errs...)
}

// WithDefaults returns p with its zero fields filled from DefaultPolicy,
// as snapsvc applies it. Values Validate rejects are replaced by the
// defaults too, so a policy that was never validated still cannot spin.
func (p Policy) WithDefaults() Policy {
	d := DefaultPolicy()
	switch {
	case p.MaxInterval <= 0 && p.InitialInterval <= 0:
		p.MaxInterval, p.InitialInterval = d.MaxInterval, d.InitialInterval
	case p.MaxInterval <= 0:
		p.MaxInterval = max(d.MaxInterval, p.InitialInterval)
	case p.InitialInterval <= 0:
		p.InitialInterval = min(d.InitialInterval, p.MaxInterval)
	}
	// MaxInterval caps every pause: an unvalidated policy's longer
	// intervals are cut to it.
	p.InitialInterval = min(p.InitialInterval, p.MaxInterval)
	if p.MaxConflictInterval <= 0 {
		p.MaxConflictInterval = d.MaxConflictInterval
	}
	p.MaxConflictInterval = min(p.MaxConflictInterval, p.MaxInterval)
	if !(p.Multiplier >= 1) || math.IsInf(p.Multiplier, 0) { // NaN too
		p.Multiplier = d.Multiplier
	}
	switch {
	case math.IsNaN(p.RandomizationFactor) || math.IsInf(p.RandomizationFactor, 0):
		p.RandomizationFactor = d.RandomizationFactor
	case p.RandomizationFactor == 0 || p.RandomizationFactor > 1:
		p.RandomizationFactor = d.RandomizationFactor
	case p.RandomizationFactor < 0:
		p.RandomizationFactor = 0
	}
	if p.MaxElapsedTime == 0 {
		p.MaxElapsedTime = d.MaxElapsedTime
	}
	if p.MaxUnreachable == 0 {
		p.MaxUnreachable = d.MaxUnreachable
	}
	if p.RedialInterval <= 0 {
		p.RedialInterval = d.RedialInterval
	}
	p.RedialInterval = min(p.RedialInterval, p.MaxInterval)
	if p.Clock == nil {
		p.Clock = RealClock()
	}
	return p
}
