// Package probe checks whether a service actually serves, not merely that
// systemd started it: a finished snapd change only means "systemctl start"
// returned.
//
// A Probe is one check (an HTTP(S) GET, a TCP or Unix-socket connect, a
// command, or a Go function). Wait repeats a probe at an interval until it
// succeeds a number of times in a row, each check bounded by a timeout and
// the checks started within MaxWait and the context. Remote endpoints are
// probed the same way as local ones, so a service can wait for a dependency
// on another machine.
//
// Time is read from a retry.Clock, so tests drive intervals and timeouts
// without sleeping.
package probe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// Probe is one readiness check.
type Probe interface {
	// Check returns nil if the target is ready. It must return promptly
	// once ctx is done.
	Check(ctx context.Context) error
	// String describes the probe for errors and logs, for example
	// "GET https://127.0.0.1:6443/readyz".
	String() string
}

// Options control Wait.
type Options struct {
	// Interval is the pause between two checks (default 1s).
	Interval time.Duration
	// Timeout bounds one check (default 5s).
	Timeout time.Duration
	// SuccessThreshold is how many checks in a row must succeed
	// (default 1). A failure resets the count.
	SuccessThreshold int
	// MaxWait bounds, on Clock, the time in which checks start (0: only ctx
	// bounds it); a check started before it runs out may still use its
	// whole Timeout.
	MaxWait time.Duration
	// Clock drives intervals, timeouts and MaxWait (default: real time).
	Clock retry.Clock
}

// Defaults for Options.
const (
	DefaultInterval = time.Second
	DefaultTimeout  = 5 * time.Second
)

// WithDefaults returns o with zero fields set to their defaults.
func (o Options) WithDefaults() Options {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.SuccessThreshold <= 0 {
		o.SuccessThreshold = 1
	}
	if o.Clock == nil {
		o.Clock = retry.RealClock()
	}
	return o
}

// ErrNotReady matches, with errors.Is, every error Wait returns when the
// probe did not become ready.
var ErrNotReady = errors.New("not ready")

// errMaxWait is the cause of a wait that ran out of MaxWait.
var errMaxWait = errors.New("maximum wait exceeded")

// NotReadyError is returned by Wait when the probe did not succeed in time.
// It names the probe and carries its last error.
type NotReadyError struct {
	// Probe describes the probe (its String).
	Probe string
	// Waited is how long Wait waited, on its clock.
	Waited time.Duration
	// Checks is how many checks ran.
	Checks int
	// Successes is the run of successful checks at the end (short of the
	// threshold).
	Successes, Threshold int
	// Last is the last check's error (nil if the last check succeeded).
	Last error
	// Cause is why waiting stopped: the context's cause, or that MaxWait
	// ran out.
	Cause error
}

// Error names the probe, how long it was waited for, why waiting stopped
// and the last check's error.
func (e *NotReadyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "probe %s: not ready after %s (%d checks", e.Probe, e.Waited.Round(time.Millisecond), e.Checks)
	if e.Successes > 0 {
		fmt.Fprintf(&b, ", %d of %d required successes in a row", e.Successes, e.Threshold)
	}
	fmt.Fprintf(&b, "): %v", e.Cause)
	if e.Last != nil {
		fmt.Fprintf(&b, "; last error: %v", e.Last)
	}
	return b.String()
}

// Unwrap returns ErrNotReady, the cause and the last error.
func (e *NotReadyError) Unwrap() []error {
	errs := []error{ErrNotReady, e.Cause}
	if e.Last != nil {
		errs = append(errs, e.Last)
	}
	return errs
}

// Wait checks p until it succeeds SuccessThreshold times in a row, pausing
// Interval between checks. The first check runs at once. It returns a
// *NotReadyError naming the probe and its last error when MaxWait runs out
// or ctx ends first. Wait starts no goroutine that outlives it.
func Wait(ctx context.Context, p Probe, o Options) error {
	o = o.WithDefaults()
	start := o.Clock.Now()
	var deadline time.Time
	if o.MaxWait > 0 {
		deadline = start.Add(o.MaxWait)
	}
	var (
		last      error
		checks    int
		successes int
	)
	notReady := func(cause error) error {
		return &NotReadyError{Probe: p.String(), Waited: o.Clock.Now().Sub(start), Checks: checks,
			Successes: successes, Threshold: o.SuccessThreshold, Last: last, Cause: cause}
	}
	for {
		if ctx.Err() != nil {
			return notReady(context.Cause(ctx))
		}
		checks++
		err := Once(ctx, p, o.Timeout, o.Clock)
		if ctx.Err() != nil {
			// Keep the last real failure rather than the cancellation
			// that cut this check short.
			if err != nil && (last == nil || !errors.Is(err, ctx.Err())) {
				last = err
			}
			return notReady(context.Cause(ctx))
		}
		if err == nil {
			successes++
			last = nil
			if successes >= o.SuccessThreshold {
				return nil
			}
		} else {
			successes = 0
			last = err
		}
		pause := o.Interval
		if !deadline.IsZero() {
			left := deadline.Sub(o.Clock.Now())
			if left <= 0 {
				return notReady(fmt.Errorf("%w (%s)", errMaxWait, o.MaxWait))
			}
			pause = min(pause, left)
		}
		if err := retry.Sleep(ctx, o.Clock, pause); err != nil {
			return notReady(context.Cause(ctx))
		}
	}
}

// CheckTimeoutError is the error of a check that ran out of its timeout.
type CheckTimeoutError struct {
	// Timeout is the limit that ran out.
	Timeout time.Duration
	// Err is what the check returned once cancelled.
	Err error
}

// Error says how long the check ran and what it returned.
func (e *CheckTimeoutError) Error() string {
	return fmt.Sprintf("check timed out after %s: %v", e.Timeout, e.Err)
}

// Unwrap returns the check's own error.
func (e *CheckTimeoutError) Unwrap() error { return e.Err }

var errCheckTimeout = errors.New("check timeout")

// Once runs one check of p, cancelling it after timeout on clock (nil:
// real time). A check cut short by the timeout returns a
// *CheckTimeoutError.
func Once(ctx context.Context, p Probe, timeout time.Duration, clock retry.Clock) error {
	if clock == nil {
		clock = retry.RealClock()
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	t := clock.NewTimer(timeout)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-t.C():
			cancel(errCheckTimeout)
		case <-stop:
		}
	}()
	err := p.Check(cctx)
	close(stop)
	t.Stop()
	wg.Wait()
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(cctx), errCheckTimeout) {
		return &CheckTimeoutError{Timeout: timeout, Err: err}
	}
	return err
}

// Func returns a Probe that calls f. name describes it in errors.
func Func(name string, f func(ctx context.Context) error) Probe {
	return funcProbe{name: name, f: f}
}

type funcProbe struct {
	name string
	f    func(ctx context.Context) error
}

func (p funcProbe) Check(ctx context.Context) error { return p.f(ctx) }
func (p funcProbe) String() string                  { return p.name }
