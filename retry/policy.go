package retry

import (
	"context"
	"errors"
	"fmt"
	"math"
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

// withDefaults fills zero fields from DefaultPolicy. Values Validate
// rejects are replaced by the defaults too, so a policy that was never
// validated still cannot spin.
func (p Policy) withDefaults() Policy {
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

// Retrier is one run of a policy: it counts attempts and hands out pauses.
// It is not safe for concurrent use; each operation makes its own.
type Retrier struct {
	policy   Policy
	backoff  *backoff.ExponentialBackOff
	start    time.Time
	attempts int
	// unreachableSince is when the current run of failures to connect
	// began (zero while snapd answers).
	unreachableSince time.Time
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

// Policy returns the run's policy, its defaults filled in.
func (r *Retrier) Policy() Policy { return r.policy }

// RedialPause is the pause before trying to reach snapd again while it is
// unreachable: RedialInterval, shortened so it runs past neither
// MaxElapsedTime nor MaxUnreachable.
func (r *Retrier) RedialPause() time.Duration {
	d := r.policy.RedialInterval
	if left, bounded := r.Remaining(); bounded && left < d {
		d = left
	}
	if u, ok := r.Unreachable(); ok && r.policy.MaxUnreachable > 0 && r.policy.MaxUnreachable-u < d {
		d = max(r.policy.MaxUnreachable-u, 0)
	}
	return d
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
	if d, ok := r.Unreachable(); ok && r.policy.MaxUnreachable > 0 && d >= r.policy.MaxUnreachable {
		return "gave up: snapd unreachable for " + d.Round(time.Millisecond).String()
	}
	return ""
}

// Observe records the outcome of an attempt or a read: a failure to
// connect to snapd (see IsUnreachable) starts or continues a run of
// unreachability, anything else (an answer, even an error one) ends it.
// It returns true when err starts a new run.
func (r *Retrier) Observe(err error) (began bool) {
	if !IsUnreachable(err) {
		r.unreachableSince = time.Time{}
		return false
	}
	if r.unreachableSince.IsZero() {
		r.unreachableSince = r.policy.Clock.Now()
		return true
	}
	return false
}

// ObserveSince records a failure to reach snapd (see IsUnreachable) that
// someone else observed, in a run of unreachability that began at since;
// for this run it counts from since or from the run's own start, whichever
// is later. A nil or other err ends the run. It returns true when it
// starts a new run.
func (r *Retrier) ObserveSince(err error, since time.Time) (began bool) {
	if err != nil && !IsUnreachable(err) {
		r.unreachableSince = time.Time{}
		return false
	}
	if err == nil {
		r.unreachableSince = time.Time{}
		return false
	}
	if since.Before(r.start) {
		since = r.start
	}
	began = r.unreachableSince.IsZero()
	if began || since.Before(r.unreachableSince) {
		r.unreachableSince = since
	}
	return began
}

// UnreachableSince returns when the current run of unreachability began,
// and false while snapd answers.
func (r *Retrier) UnreachableSince() (time.Time, bool) {
	return r.unreachableSince, !r.unreachableSince.IsZero()
}

// Unreachable returns how long snapd has been unreachable, and false when
// the last observed outcome was an answer.
func (r *Retrier) Unreachable() (time.Duration, bool) {
	if r.unreachableSince.IsZero() {
		return 0, false
	}
	return r.policy.Clock.Now().Sub(r.unreachableSince), true
}

// UnreachableDeadline returns when the run of unreachability gives up
// (the earlier of MaxUnreachable and MaxElapsedTime), and false when
// snapd is reachable or neither bound is set.
func (r *Retrier) UnreachableDeadline() (time.Time, bool) {
	if r.unreachableSince.IsZero() {
		return time.Time{}, false
	}
	var at time.Time
	if r.policy.MaxUnreachable > 0 {
		at = r.unreachableSince.Add(r.policy.MaxUnreachable)
	}
	if r.policy.MaxElapsedTime > 0 {
		if end := r.start.Add(r.policy.MaxElapsedTime); at.IsZero() || end.Before(at) {
			at = end
		}
	}
	return at, !at.IsZero()
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

// NextPause returns the next jittered backoff pause, at most MaxInterval
// (backoff jitters around an interval that is itself capped, so the jitter
// alone could take it past the cap), shortened so it does not run past
// MaxElapsedTime.
func (r *Retrier) NextPause() time.Duration {
	d := r.backoff.NextBackOff()
	if d == backoff.Stop || d > r.policy.MaxInterval {
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

// Pause waits for the next backoff pause or until ctx is done. While
// snapd is unreachable (Observe) the pause is RedialInterval instead:
// re-dialling a missing socket costs snapd nothing, and the operation
// goes ahead as soon as the socket appears.
func (r *Retrier) Pause(ctx context.Context) error {
	if _, ok := r.Unreachable(); ok {
		return Sleep(ctx, r.policy.Clock, r.RedialPause())
	}
	return Sleep(ctx, r.policy.Clock, r.NextPause())
}

// PauseConflict waits ConflictPause, for a conflict whose blocking change
// cannot be watched.
func (r *Retrier) PauseConflict(ctx context.Context) error {
	return Sleep(ctx, r.policy.Clock, r.ConflictPause())
}

// ConflictPause is the next backoff pause capped at MaxConflictInterval:
// the pause before asking again after a conflict.
func (r *Retrier) ConflictPause() time.Duration {
	return min(r.NextPause(), r.policy.MaxConflictInterval)
}
