package snapsvc

import (
	"errors"
	"io/fs"
	"strconv"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/snapsvc/snapsvc/retry"
)

// retrier is the run of a retry.Policy for one call (call.go): it counts
// the call's attempts, hands out its pauses and tracks the run of failures
// to reach snapd. It is not safe for concurrent use; each call makes its
// own.
type retrier struct {
	p       retry.Policy
	backoff *backoff.ExponentialBackOff
	start   time.Time
	n       int // attempts started
	// downSince is when the current run of failures to connect
	// began (zero while snapd answers).
	downSince time.Time
	// downTries counts the failures to connect of this call in the
	// current run (a run begun by what someone else saw counts two: it
	// lasted).
	downTries int
}

// newRetrier starts a run of policy p now.
func newRetrier(p retry.Policy) *retrier {
	p = p.WithDefaults()
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.InitialInterval),
		backoff.WithMaxInterval(p.MaxInterval),
		backoff.WithMultiplier(p.Multiplier),
		backoff.WithRandomizationFactor(p.RandomizationFactor),
		backoff.WithMaxElapsedTime(0), // bounded below, on our clock
		backoff.WithClockProvider(p.Clock),
	)
	b.Reset()
	return &retrier{p: p, backoff: b, start: p.Clock.Now()}
}

// policy returns the run's policy, its defaults filled in.
func (r *retrier) policy() retry.Policy { return r.p }

// redialPause is the pause before trying to reach snapd again while it is
// unreachable: RedialInterval, shortened so it runs past neither
// MaxElapsedTime nor MaxUnreachable.
func (r *retrier) redialPause() time.Duration {
	d := r.p.RedialInterval
	if left, bounded := r.remaining(); bounded && left < d {
		d = left
	}
	if u, ok := r.unreachable(); ok && r.p.MaxUnreachable > 0 && r.p.MaxUnreachable-u < d {
		d = max(r.p.MaxUnreachable-u, 0)
	}
	return d
}

// attempt records the start of an attempt and returns its number
// (1-based).
func (r *retrier) attempt() int {
	r.n++
	return r.n
}

// attempts returns how many attempts have started.
func (r *retrier) attempts() int { return r.n }

// elapsed returns the time since the run started.
func (r *retrier) elapsed() time.Duration { return r.p.Clock.Now().Sub(r.start) }

// outOfAttempts reports whether MaxAttempts attempts have started.
func (r *retrier) outOfAttempts() bool {
	return r.p.MaxAttempts > 0 && r.n >= r.p.MaxAttempts
}

// exhausted reports why no further attempt may start, or "" if one may;
// last is the failure that ended the last attempt, if known.
func (r *retrier) exhausted(last error) string {
	if r.p.MaxAttempts > 0 && r.n >= r.p.MaxAttempts {
		return "gave up after " + strconv.Itoa(r.n) + " attempts"
	}
	if r.p.MaxElapsedTime > 0 && r.elapsed() >= r.p.MaxElapsedTime {
		return "gave up after " + r.elapsed().Round(time.Millisecond).String()
	}
	if d, ok := r.unreachable(); ok && r.p.MaxUnreachable > 0 && d >= r.p.MaxUnreachable {
		if r.downTries <= 1 && d < r.p.RedialInterval {
			// Tried once, with no time to try again (WithGiveUp(0) in
			// snapservices): no duration passed worth naming.
			return "gave up at the first try: snapd unreachable" + unreachableWhy(last)
		}
		return "gave up: snapd unreachable for " + d.Round(time.Millisecond).String() + unreachableWhy(last)
	}
	return ""
}

// unreachableWhy says in a few words why snapd could not be reached, from
// the failure to connect: " (its socket is missing)", " (connection
// refused: nothing listens on its socket)", or "" (the error says).
func unreachableWhy(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, fs.ErrNotExist):
		return " (its socket is missing)"
	case errors.Is(err, syscall.ECONNREFUSED):
		return " (connection refused: nothing listens on its socket)"
	}
	return ""
}

// note records the outcome of an attempt or a read: a failure to
// connect to snapd (see IsUnreachable) starts or continues a run of
// unreachability, anything else (an answer, even an error one) ends it.
// It returns true when err starts a new run.
func (r *retrier) note(err error) (began bool) {
	if !retry.IsUnreachable(err) {
		r.downSince, r.downTries = time.Time{}, 0
		return false
	}
	r.downTries++
	if r.downSince.IsZero() {
		r.downSince = r.p.Clock.Now()
		return true
	}
	return false
}

// noteSince records a failure to reach snapd (see IsUnreachable) that
// someone else saw, in a run of unreachability that began at since;
// for this run it counts from since or from the run's own start, whichever
// is later. A nil or other err ends the run. It returns true when it
// starts a new run.
func (r *retrier) noteSince(err error, since time.Time) (began bool) {
	if err == nil || !retry.IsUnreachable(err) {
		r.downSince, r.downTries = time.Time{}, 0
		return false
	}
	if since.Before(r.start) {
		since = r.start
	}
	began = r.downSince.IsZero()
	if began || since.Before(r.downSince) {
		r.downSince = since
	}
	r.downTries = max(r.downTries, 2)
	return began
}

// unreachableSince returns when the current run of unreachability began,
// and false while snapd answers.
func (r *retrier) unreachableSince() (time.Time, bool) {
	return r.downSince, !r.downSince.IsZero()
}

// unreachable returns how long snapd has been unreachable, and false when
// the last outcome seen was an answer.
func (r *retrier) unreachable() (time.Duration, bool) {
	if r.downSince.IsZero() {
		return 0, false
	}
	return r.p.Clock.Now().Sub(r.downSince), true
}

// unreachableDeadline returns when the run of unreachability gives up
// (the earlier of MaxUnreachable and MaxElapsedTime), and false when
// snapd is reachable or neither bound is set.
func (r *retrier) unreachableDeadline() (time.Time, bool) {
	if r.downSince.IsZero() {
		return time.Time{}, false
	}
	var at time.Time
	if r.p.MaxUnreachable > 0 {
		at = r.downSince.Add(r.p.MaxUnreachable)
	}
	if r.p.MaxElapsedTime > 0 {
		if end := r.start.Add(r.p.MaxElapsedTime); at.IsZero() || end.Before(at) {
			at = end
		}
	}
	return at, !at.IsZero()
}

// remaining returns the time left before MaxElapsedTime, and false when
// the policy sets no such bound.
func (r *retrier) remaining() (time.Duration, bool) {
	if r.p.MaxElapsedTime <= 0 {
		return 0, false
	}
	left := r.p.MaxElapsedTime - r.elapsed()
	if left < 0 {
		left = 0
	}
	return left, true
}

// nextPause returns the next jittered backoff pause, at most MaxInterval
// (backoff jitters around an interval that is itself capped, so the jitter
// alone could take it past the cap), shortened so it does not run past
// MaxElapsedTime.
func (r *retrier) nextPause() time.Duration {
	d := r.backoff.NextBackOff()
	if d == backoff.Stop || d > r.p.MaxInterval {
		d = r.p.MaxInterval
	}
	if max := r.p.MaxElapsedTime; max > 0 {
		if left := max - r.elapsed(); left < d {
			d = left
		}
	}
	if d < 0 {
		d = 0
	}
	return d
}

// conflictPause is the next backoff pause capped at MaxConflictInterval:
// the pause before asking again after a conflict.
func (r *retrier) conflictPause() time.Duration {
	return min(r.nextPause(), r.p.MaxConflictInterval)
}
