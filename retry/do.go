package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Do calls fn until it succeeds, at most attempts times (the first
// included), pausing delay between attempts. It has the shape of k8sd's
// control.RetryFor, so a port changes one name. It keeps RetryFor's useful
// retries and drops the harmful ones; the rule (ShouldRetry) is:
//
//   - never repeat a request whose outcome is unknown: snapd's answer was
//     lost after the request was sent, or a change was made and may still
//     run (a --no-wait call, a wait cut short, snapsvc.ErrOutcomeUnknown);
//     running a restart again could restart the services twice;
//   - never retry bad input or a refusal that stays true: an invalid name,
//     an unknown flag, an unknown service, a setup error, snapd not
//     installed — every error that says of itself it is not retryable,
//     other than a failed change;
//   - retry a change that failed (status Error or Undone: the outcome is
//     known, nothing of it runs): a start of kube-apiserver before etcd is
//     ready fails once and succeeds on a later attempt, as k8sd expects;
//   - retry conflicts and an unreachable snapd (snapsvc's own policy
//     already absorbs most of them), and errors that say nothing about
//     themselves (the loop body's own, a Kubernetes API call), as
//     RetryFor did.
//
// It also returns, when ctx ends, an error matching both the context's
// cause and the last failure (errors.Is), not a bare context.Canceled, and
// does not pause after the last attempt.
//
// Its time is bounded as RetryFor's was: RetryFor(n, d) around a command
// that fails at once ends after n × d (it pauses d after every failure),
// and Do ends by the same n × d whatever the attempts take. Attempts start
// at least d apart, from the start of one to the start of the next, so an
// attempt that already waited (snapsvc waiting out a change that holds the
// snap, or for snapd's socket) is followed by no further pause, and no
// attempt starts once n × d have passed since the first one. Inside the
// loop, snapsvc's operations use the policy Loop.NestedPolicy derives
// from the same two numbers (retry.NestedPolicy is k8sd's: 5 attempts, 5
// s): a blocker that never ends, or a socket that stays missing, ends the
// loop after about n × d, as the snap command's failures did.
//
// Do(ctx, n, d, fn) is Loop{Attempts: n, Delay: d}.Do(ctx, fn).
func Do(ctx context.Context, attempts int, delay time.Duration, fn func() error) error {
	return Loop{Attempts: attempts, Delay: delay}.Do(ctx, fn)
}

// Loop is a fixed-delay retry loop for callers that keep their own loop
// around snapsvc's operations. The zero value makes one attempt.
type Loop struct {
	// Attempts bounds the calls of fn, the first included (values below 1
	// mean 1).
	Attempts int
	// Delay is the least time from the start of one attempt to the start
	// of the next: the pause after a failed attempt is Delay less the
	// time the attempt took. The loop also starts no attempt once
	// Attempts × Delay have passed since its first one (its bound: the
	// time RetryFor took to fail with the same arguments); a zero Delay
	// means no pause and no such bound.
	Delay time.Duration
	// Retryable decides whether a failure is worth another attempt. The
	// default, nil, is ShouldRetry (the rule in Do's documentation). A
	// loop that wants the operation's own verdict alone (a failed change
	// not retried either) sets IsRetryable.
	Retryable func(error) bool
	// Clock drives the pauses; nil means the real clock.
	Clock Clock
}

// Do runs the loop; see the package function Do. A failure that is not
// retryable is returned as fn returned it. When the attempts run out the
// error, a *StoppedError, says so and wraps the last failure. When ctx
// ends (before an attempt, during one or during a pause) the
// *StoppedError wraps both context.Cause(ctx) and the last failure.
func (l Loop) Do(ctx context.Context, fn func() error) error {
	attempts := max(l.Attempts, 1)
	retryable := l.Retryable
	if retryable == nil {
		retryable = ShouldRetry
	}
	clock := l.Clock
	if clock == nil {
		clock = RealClock()
	}
	var last error
	var began, end time.Time // the first attempt's start, and the loop's bound
	for n := 1; ; n++ {
		if ctx.Err() != nil {
			return &StoppedError{Attempts: n - 1, Cause: context.Cause(ctx), Last: last}
		}
		started := clock.Now()
		if n == 1 && l.Delay > 0 {
			began, end = started, started.Add(time.Duration(attempts)*l.Delay)
		}
		err := fn()
		if err == nil {
			return nil
		}
		last = err
		if ctx.Err() != nil {
			return &StoppedError{Attempts: n, Cause: context.Cause(ctx), Last: last}
		}
		if !retryable(err) {
			return err
		}
		if n >= attempts {
			return &StoppedError{Attempts: n, Last: last}
		}
		if l.Delay <= 0 {
			continue
		}
		next := started.Add(l.Delay)
		if now := clock.Now(); next.Before(now) {
			next = now // the attempt took a delay or more: no pause
		}
		if !next.Before(end) {
			return &StoppedError{Attempts: n, Last: last, Bound: end.Sub(began)}
		}
		if Sleep(ctx, clock, next.Sub(clock.Now())) != nil {
			return &StoppedError{Attempts: n, Cause: context.Cause(ctx), Last: last}
		}
	}
}

// ShouldRetry is Loop's default rule (see Do): whether a loop kept around
// the calls, as k8sd's RetryFor, should try again. It is not the answer to
// "can retrying help?", which is IsRetryable's: it also retries a failed
// change (a later start may succeed) and errors that say nothing of
// themselves, as RetryFor did. In this order:
//
//  1. an outcome that is not known (Classify answers Indeterminate: a
//     lost answer to a request to act, an error with Indeterminate()
//     true) is not retried;
//  2. the first error in err's chain with a Retryable() bool method
//     (snapsvc's *OpError, StoppedError) decides when it answers true;
//  3. a failed change (an error in the chain with a ChangeFailed() bool
//     method answering true: snapsvc's *ChangeError with status Error,
//     Undone or Hold) is retried;
//  4. otherwise a Retryable() verdict of false stands (bad input, an
//     unknown service, a change that may still run, snapd not installed);
//  5. an error with no verdict is classified: snapd's own answers as
//     Classify says (conflicts and unreachable snapd yes, refusals no), a
//     context's error no, and anything else — errors from outside
//     snapsvc — yes, as RetryFor did.
func ShouldRetry(err error) bool {
	if err == nil {
		return false
	}
	class := Classify(err)
	if class == Indeterminate {
		return false
	}
	var r interface{ Retryable() bool }
	verdict := errors.As(err, &r)
	if verdict && r.Retryable() {
		return true
	}
	var f interface{ ChangeFailed() bool }
	if errors.As(err, &f) && f.ChangeFailed() {
		return true
	}
	if verdict {
		return false
	}
	if class != Permanent {
		return true
	}
	return !fromSnapd(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// IsRetryableOnce is IsRetryable, under the name it had as Loop's
// default before v0.2.0.
//
// Deprecated: use IsRetryable, which answers the same.
func IsRetryableOnce(err error) bool { return IsRetryable(err) }

// fromSnapd reports whether err carries an answer of snapd's or a failure
// to reach it.
func fromSnapd(err error) bool {
	var (
		apiErr  *snapd.Error
		respErr *snapd.ResponseError
		connErr *snapd.ConnectionError
		ctlErr  *snapd.UnsuccessfulError
	)
	return errors.As(err, &apiErr) || errors.As(err, &respErr) || errors.As(err, &connErr) || errors.As(err, &ctlErr)
}

// StoppedError is a Loop that ended without success while fn kept failing
// with retryable errors: its attempts ran out, its time bound passed
// (Bound), or its context ended.
type StoppedError struct {
	// Attempts is how many times fn was called.
	Attempts int
	// Cause is context.Cause of the loop's context when that ended the
	// loop, nil when the attempts ran out.
	Cause error
	// Last is fn's last failure (nil if the context ended before the
	// first attempt).
	Last error
	// Bound is the loop's time bound (Attempts × Delay) when it ended the
	// loop before its attempts ran out, else 0.
	Bound time.Duration
}

func (e *StoppedError) Error() string {
	var what string
	switch {
	case e.Cause != nil:
		what = fmt.Sprintf("%v after %d attempts", e.Cause, e.Attempts)
	case e.Bound > 0:
		what = fmt.Sprintf("gave up after %d attempts in the loop's %v", e.Attempts, e.Bound)
	default:
		what = fmt.Sprintf("gave up after %d attempts", e.Attempts)
	}
	if e.Last == nil {
		return what
	}
	return what + "; last error: " + e.Last.Error()
}

// Unwrap returns the context's cause and the last failure, so errors.Is
// and errors.As reach both.
func (e *StoppedError) Unwrap() []error {
	var out []error
	if e.Cause != nil {
		out = append(out, e.Cause)
	}
	if e.Last != nil {
		out = append(out, e.Last)
	}
	return out
}

// Retryable reports whether running the loop again later could help: the
// last failure was retryable (the loop stops at once otherwise), so yes
// when the attempts or the loop's time ran out, and no when the context
// ended (the caller gave up).
func (e *StoppedError) Retryable() bool { return e.Cause == nil && e.Last != nil }
