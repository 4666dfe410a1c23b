package retry

import (
	"context"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"
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
	// MaxInterval caps one pause (default 5s).
	MaxInterval time.Duration
	// MaxConflictInterval caps the pause before retrying a conflict whose
	// blocking change cannot be seen (a snap without snap-refresh-observe,
	// say): such conflicts usually clear within seconds, and a refused
	// request costs snapd little (default 1s).
	MaxConflictInterval time.Duration
	// Multiplier grows the pause after each retry (default 1.6).
	Multiplier float64
	// RandomizationFactor jitters each pause by ± this fraction (default
	// 0.5; negative: no jitter).
	RandomizationFactor float64
	// MaxAttempts bounds the attempts, the first included (0: no bound).
	MaxAttempts int
	// MaxElapsedTime bounds the time spent retrying (default 5m; negative:
	// no bound other than the context).
	MaxElapsedTime time.Duration
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
	}
}

// withDefaults fills zero fields from DefaultPolicy.
func (p Policy) withDefaults() Policy {
	d := DefaultPolicy()
	if p.InitialInterval <= 0 {
		p.InitialInterval = d.InitialInterval
	}
	if p.MaxInterval <= 0 {
		p.MaxInterval = d.MaxInterval
	}
	if p.MaxConflictInterval <= 0 {
		p.MaxConflictInterval = d.MaxConflictInterval
	}
	if p.Multiplier < 1 {
		p.Multiplier = d.Multiplier
	}
	switch {
	case p.RandomizationFactor == 0 || p.RandomizationFactor > 1:
		p.RandomizationFactor = d.RandomizationFactor
	case p.RandomizationFactor < 0:
		p.RandomizationFactor = 0
	}
	if p.MaxElapsedTime == 0 {
		p.MaxElapsedTime = d.MaxElapsedTime
	}
	if p.Clock == nil {
		p.Clock = RealClock()
	}
	return p
}

// Retrier is one run of a policy: it counts attempts and hands out pauses.
// It is not safe for concurrent use; each operation makes its own.
type Retrier struct {
	policy   Policy
	backoff  *backoff.ExponentialBackOff
	start    time.Time
	attempts int
}

// NewRetrier starts a run of the policy now.
func (p Policy) NewRetrier() *Retrier {
	p = p.withDefaults()
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.InitialInterval),
		backoff.WithMaxInterval(p.MaxInterval),
		backoff.WithMultiplier(p.Multiplier),
		backoff.WithRandomizationFactor(p.RandomizationFactor),
		backoff.WithMaxElapsedTime(0), // bounded below, on our clock
		backoff.WithClockProvider(p.Clock),
	)
	b.Reset()
	return &Retrier{policy: p, backoff: b, start: p.Clock.Now()}
}

// Clock returns the clock the run uses.
func (r *Retrier) Clock() Clock { return r.policy.Clock }

// Attempt records the start of an attempt and returns its number
// (1-based).
func (r *Retrier) Attempt() int {
	r.attempts++
	return r.attempts
}

// Attempts returns how many attempts have started.
func (r *Retrier) Attempts() int { return r.attempts }

// Elapsed returns the time since the run started.
func (r *Retrier) Elapsed() time.Duration { return r.policy.Clock.Now().Sub(r.start) }

// OutOfAttempts reports whether MaxAttempts attempts have started.
func (r *Retrier) OutOfAttempts() bool {
	return r.policy.MaxAttempts > 0 && r.attempts >= r.policy.MaxAttempts
}

// Exhausted reports why no further attempt may start, or "" if one may.
func (r *Retrier) Exhausted() string {
	if r.policy.MaxAttempts > 0 && r.attempts >= r.policy.MaxAttempts {
		return "gave up after " + strconv.Itoa(r.attempts) + " attempts"
	}
	if r.policy.MaxElapsedTime > 0 && r.Elapsed() >= r.policy.MaxElapsedTime {
		return "gave up after " + r.Elapsed().Round(time.Millisecond).String()
	}
	return ""
}

// Remaining returns the time left before MaxElapsedTime, and false when
// the policy sets no such bound.
func (r *Retrier) Remaining() (time.Duration, bool) {
	if r.policy.MaxElapsedTime <= 0 {
		return 0, false
	}
	left := r.policy.MaxElapsedTime - r.Elapsed()
	if left < 0 {
		left = 0
	}
	return left, true
}

// NextPause returns the next jittered backoff pause, shortened so it does
// not run past MaxElapsedTime.
func (r *Retrier) NextPause() time.Duration {
	d := r.backoff.NextBackOff()
	if d == backoff.Stop {
		d = r.policy.MaxInterval
	}
	if max := r.policy.MaxElapsedTime; max > 0 {
		if left := max - r.Elapsed(); left < d {
			d = left
		}
	}
	if d < 0 {
		d = 0
	}
	return d
}

// ResetPause makes the next pause the initial one again, for instance after
// progress was seen.
func (r *Retrier) ResetPause() { r.backoff.Reset() }

// Pause waits for the next backoff pause or until ctx is done.
func (r *Retrier) Pause(ctx context.Context) error {
	return Sleep(ctx, r.policy.Clock, r.NextPause())
}

// PauseConflict is Pause capped at MaxConflictInterval, for a conflict
// whose blocking change cannot be watched.
func (r *Retrier) PauseConflict(ctx context.Context) error {
	return Sleep(ctx, r.policy.Clock, min(r.NextPause(), r.policy.MaxConflictInterval))
}
