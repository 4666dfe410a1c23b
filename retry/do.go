package retry

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Do calls fn until it succeeds, at most attempts times (the first
// included), pausing delay between attempts. It has the shape of k8sd's
// control.RetryFor, so a port changes one name, and fixes what such loops
// get wrong:
//
//   - it stops at once on an error retrying cannot fix (see Loop.Retryable):
//     a start that failed in snapd is reported once, not made into five
//     changes;
//   - when ctx ends it returns an error matching both the context's error
//     and the last failure (errors.Is), not a bare context.Canceled;
//   - it does not pause after the last attempt.
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
	// Delay is the pause between two attempts.
	Delay time.Duration
	// Retryable decides whether a failure is worth another attempt. The
	// default, nil, asks the error: an error with a Retryable() bool
	// method anywhere in its chain (snapsvc's *OpError has one; it answers
	// false for bad input, a change that ended in error and an outcome
	// that is unknown) decides; otherwise Classify does, so snapd's
	// conflicts and an unreachable snapd are retried and everything it
	// cannot classify is not. A loop that must also retry other errors
	// (RetryFor retried anything) sets its own.
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
	var last error
	for n := 1; ; n++ {
		if ctx.Err() != nil {
			return &StoppedError{Attempts: n - 1, Cause: context.Cause(ctx), Last: last}
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
		if Sleep(ctx, l.Clock, l.Delay) != nil {
			return &StoppedError{Attempts: n, Cause: context.Cause(ctx), Last: last}
		}
	}
}

// ShouldRetry reports whether another attempt after err could succeed: the
// first error in err's chain with a Retryable() bool method decides
// (snapsvc's *OpError, StoppedError), otherwise Classify does. It is
// Loop's default. Unlike IsRetryable, which classifies snapd's answers
// alone, it lets snapsvc's verdict win: a change that ended in Error, or
// an outcome that is unknown, is not retried although the underlying
// answer may look transient.
func ShouldRetry(err error) bool {
	var r interface{ Retryable() bool }
	if errors.As(err, &r) {
		return r.Retryable()
	}
	return IsRetryable(err)
}

// StoppedError is a Loop that ended without success while fn kept failing
// with retryable errors: its attempts ran out, or its context ended.
type StoppedError struct {
	// Attempts is how many times fn was called.
	Attempts int
	// Cause is context.Cause of the loop's context when that ended the
	// loop, nil when the attempts ran out.
	Cause error
	// Last is fn's last failure (nil if the context ended before the
	// first attempt).
	Last error
}

func (e *StoppedError) Error() string {
	var what string
	if e.Cause != nil {
		what = fmt.Sprintf("%v after %d attempts", e.Cause, e.Attempts)
	} else {
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
// when the attempts ran out, and no when the context ended (the caller
// gave up).
func (e *StoppedError) Retryable() bool { return e.Cause == nil && e.Last != nil }
