package retry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// conflict is the error snapd answers POST /v2/apps with while another
// change holds the snap (400, no kind; daemon/api_apps.go).
func conflict() error {
	return &snapd.Error{StatusCode: 400, Message: `snap "k8s" has "configure-snap" change in progress`}
}

// verdict is an error that says itself whether retrying helps, as
// snapsvc's *OpError does.
type verdict struct {
	msg string
	ok  bool
}

func (v *verdict) Error() string   { return v.msg }
func (v *verdict) Retryable() bool { return v.ok }

func TestDoStopsAtOnceOnPermanentError(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	notFound := &snapd.Error{StatusCode: 404, Kind: "app-not-found", Message: `snap "k8s" has no service "kubelt"`}
	calls := 0
	err := retry.Loop{Attempts: 5, Delay: 5 * time.Second, Clock: clock}.Do(context.Background(), func() error {
		calls++
		return notFound
	})
	if calls != 1 || err != notFound || len(clock.pauses) != 0 {
		t.Fatalf("calls %d, err %v, pauses %v: want 1 call, the error as returned, no pause", calls, err, clock.pauses)
	}
}

func TestDoRetriesConflictsUntilSuccess(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	calls := 0
	err := retry.Loop{Attempts: 5, Delay: 5 * time.Second, Clock: clock}.Do(context.Background(), func() error {
		calls++
		if calls < 3 {
			return conflict()
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("err %v after %d calls, want success on the 3rd", err, calls)
	}
	if len(clock.pauses) != 2 || clock.pauses[0] != 5*time.Second || clock.pauses[1] != 5*time.Second {
		t.Fatalf("pauses %v, want two of 5s", clock.pauses)
	}
}

func TestDoGivesUpWithoutAFinalPause(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	calls := 0
	var last error
	err := retry.Loop{Attempts: 4, Delay: time.Second, Clock: clock}.Do(context.Background(), func() error {
		calls++
		last = conflict()
		return last
	})
	var stopped *retry.StoppedError
	if !errors.As(err, &stopped) || stopped.Attempts != 4 || stopped.Cause != nil || !stopped.Retryable() {
		t.Fatalf("err %#v, want a retryable StoppedError after 4 attempts", err)
	}
	if calls != 4 || len(clock.pauses) != 3 {
		t.Fatalf("%d calls, pauses %v: want 4 calls and 3 pauses (none after the last)", calls, clock.pauses)
	}
	if !errors.Is(err, last) || !retry.IsConflict(err) {
		t.Fatalf("%v does not keep the last conflict", err)
	}
	if got, want := err.Error(), "gave up after 4 attempts; last error: "+last.Error(); got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
}

func TestDoKeepsTheCauseWhenTheContextEnds(t *testing.T) {
	defer goleak.VerifyNone(t)
	mc := fake.NewManualClock(time.Unix(1000, 0))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	errc := make(chan error, 1)
	go func() {
		errc <- retry.Loop{Attempts: 5, Delay: 5 * time.Second, Clock: testclock.Of(mc)}.Do(ctx, func() error {
			calls++
			return conflict()
		})
	}()
	// The loop pauses 5 s after its first failure; cancel in the pause.
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	testclock.WaitTimerAt(wctx, t, mc, time.Unix(1005, 0))
	cancel()
	err := <-errc
	if calls != 1 {
		t.Fatalf("%d calls, want 1", calls)
	}
	if !errors.Is(err, context.Canceled) || !retry.IsConflict(err) {
		t.Fatalf("%v: want both context.Canceled and the conflict", err)
	}
	if err == context.Canceled || err.Error() == context.Canceled.Error() {
		t.Fatalf("bare %v", err)
	}
	var stopped *retry.StoppedError
	if !errors.As(err, &stopped) || stopped.Retryable() {
		t.Fatalf("%#v: want a StoppedError that is not retryable (the caller gave up)", err)
	}
}

func TestDoKeepsTheContextCause(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	shutdown := errors.New("k8sd shutting down")
	err := retry.Loop{Attempts: 5, Delay: time.Second, Clock: &recordingClock{}}.Do(ctx, func() error {
		cancel(shutdown) // the context ends while the attempt runs
		return conflict()
	})
	if !errors.Is(err, shutdown) || !retry.IsConflict(err) {
		t.Fatalf("%v: want the cancel cause and the conflict", err)
	}
}

func TestDoDoesNotStartAfterTheContextEnded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls := 0
	err := retry.Do(ctx, 5, time.Second, func() error { calls++; return nil })
	if calls != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("calls %d, err %v", calls, err)
	}
}

func TestDoAsksTheErrorFirst(t *testing.T) {
	clock := &recordingClock{}
	// Looks like a conflict, but the error itself says retrying won't help
	// (snapsvc: a change that ended in error carries snapd's text).
	calls := 0
	err := retry.Loop{Attempts: 5, Clock: clock}.Do(context.Background(), func() error {
		calls++
		return &verdict{msg: `snap "k8s" has changes in progress`, ok: false}
	})
	if calls != 1 || err == nil {
		t.Fatalf("calls %d, err %v: want 1", calls, err)
	}
	// Unclassifiable text, but the error says retrying helps.
	calls = 0
	_ = retry.Loop{Attempts: 3, Clock: clock}.Do(context.Background(), func() error {
		calls++
		return &verdict{msg: "busy", ok: true}
	})
	if calls != 3 {
		t.Fatalf("calls %d, want 3", calls)
	}
	// Plain errors nobody classified (the loop body's own) are retried,
	// as RetryFor did, unless the loop says otherwise.
	calls = 0
	_ = retry.Loop{Attempts: 3, Clock: clock}.Do(context.Background(), func() error { calls++; return errors.New("disk full") })
	if calls != 3 {
		t.Fatalf("plain error: calls %d, want 3", calls)
	}
	calls = 0
	_ = retry.Loop{Attempts: 3, Clock: clock, Retryable: retry.IsRetryable}.Do(context.Background(), func() error { calls++; return errors.New("disk full") })
	if calls != 1 {
		t.Fatalf("Retryable override: calls %d, want 1", calls)
	}
}

func TestDoNests(t *testing.T) {
	clock := &recordingClock{}
	inner := 0
	outer := 0
	err := retry.Loop{Attempts: 2, Clock: clock}.Do(context.Background(), func() error {
		outer++
		return retry.Loop{Attempts: 3, Clock: clock}.Do(context.Background(), func() error {
			inner++
			return conflict()
		})
	})
	if outer != 2 || inner != 6 {
		t.Fatalf("outer %d inner %d: an exhausted inner loop is retryable for the outer one", outer, inner)
	}
	if !retry.IsConflict(err) {
		t.Fatalf("%v lost the conflict", err)
	}
}

// The nested policy is the loop's: its time is the loop's bound, and a
// missing socket is waited for one of the loop's delays.
func TestNestedPolicyDerivesFromTheLoop(t *testing.T) {
	for _, c := range []struct {
		loop                 retry.Loop
		elapsed, unreachable time.Duration
	}{
		{retry.Loop{Attempts: 5, Delay: 5 * time.Second}, 25 * time.Second, 5 * time.Second},
		{retry.Loop{Attempts: 30, Delay: 2 * time.Second}, time.Minute, 2 * time.Second},
		{retry.Loop{Attempts: 3}, retry.DefaultPolicy().MaxElapsedTime, retry.DefaultPolicy().MaxUnreachable},
	} {
		p := c.loop.NestedPolicy()
		if p.MaxElapsedTime != c.elapsed || p.MaxUnreachable != c.unreachable || p.Validate() != nil {
			t.Errorf("%+v: MaxElapsedTime %v MaxUnreachable %v, want %v and %v", c.loop, p.MaxElapsedTime, p.MaxUnreachable, c.elapsed, c.unreachable)
		}
	}
	if n, l := retry.NestedPolicy(), (retry.Loop{Attempts: 5, Delay: 5 * time.Second}).NestedPolicy(); n.MaxElapsedTime != l.MaxElapsedTime || n.MaxUnreachable != l.MaxUnreachable {
		t.Fatalf("NestedPolicy %+v is not k8sd's loop's %+v", n, l)
	}
}

// Attempts start Delay apart: an attempt that took part of the delay is
// followed by the rest of it only.
func TestDoPacesFromTheStartOfEachAttempt(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	calls := 0
	err := retry.Loop{Attempts: 3, Delay: 5 * time.Second, Clock: clock}.Do(context.Background(), func() error {
		calls++
		clock.now = clock.now.Add(2 * time.Second) // the attempt waited 2 s
		return conflict()
	})
	if calls != 3 || !retry.IsConflict(err) {
		t.Fatalf("calls %d, err %v", calls, err)
	}
	if len(clock.pauses) != 2 || clock.pauses[0] != 3*time.Second || clock.pauses[1] != 3*time.Second {
		t.Fatalf("pauses %v, want two of 3s (5 s apart, each attempt took 2 s)", clock.pauses)
	}
}

// Issue 27, item 7: a foreign change that never ends, inside k8sd's
// RetryFor(5, 5 s) ported to Do, failed after 175 s (5 attempts × the 30 s
// nested policy, and 4 pauses) where the snap command's loop failed after
// 25 s. The nested policy now waits the loop's whole bound, and the loop
// starts no attempt after it: one attempt, 25 s, no pause.
func TestDoStuckBlockerEndsAtTheLoopsBound(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	loop := retry.Loop{Attempts: 5, Delay: 5 * time.Second, Clock: clock}
	calls := 0
	err := loop.Do(context.Background(), func() error {
		calls++
		clock.now = clock.now.Add(loop.NestedPolicy().MaxElapsedTime) // held until the policy gave up
		return conflict()
	})
	var stopped *retry.StoppedError
	if calls != 1 || len(clock.pauses) != 0 || !errors.As(err, &stopped) || stopped.Bound != 25*time.Second || !stopped.Retryable() || !retry.IsConflict(err) {
		t.Fatalf("calls %d, pauses %v, err %v: want 1 call, no pause, a retryable StoppedError at the loop's 25 s keeping the conflict", calls, clock.pauses, err)
	}
	if got := clock.now.Sub(time.Unix(0, 0)); got != 25*time.Second {
		t.Fatalf("the loop ended after %v, want 25s", got)
	}
	if want := "gave up after 1 attempts in the loop's 25s; last error: "; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("message %q, want it to start %q", err, want)
	}
}

// Issue 27, item 7: a socket that stays missing while snapd is installed
// cost 30 s per call (the nested policy's MaxUnreachable), 170 s in the
// loop. Now one delay per attempt and no pause between them: 25 s.
func TestDoMissingSocketEndsAtTheLoopsBound(t *testing.T) {
	clock := &recordingClock{now: time.Unix(0, 0)}
	loop := retry.Loop{Attempts: 5, Delay: 5 * time.Second, Clock: clock}
	unreachable := &snapd.ConnectionError{Method: "POST", Path: "/v2/apps", Err: errors.New("dial unix /run/snapd.socket: connect: no such file or directory")}
	calls := 0
	err := loop.Do(context.Background(), func() error {
		calls++
		clock.now = clock.now.Add(loop.NestedPolicy().MaxUnreachable)
		return unreachable
	})
	if calls != 5 || len(clock.pauses) != 0 || !errors.Is(err, unreachable) {
		t.Fatalf("calls %d, pauses %v, err %v: want 5 calls of one delay each and no pause", calls, clock.pauses, err)
	}
	if got := clock.now.Sub(time.Unix(0, 0)); got != 25*time.Second {
		t.Fatalf("the loop ended after %v, want 25s", got)
	}
}

// failedChange is an error like snapsvc's *ChangeError.
type failedChange struct{ failed bool }

func (f *failedChange) Error() string      { return "change 7 (service-control) ended \"Error\"" }
func (f *failedChange) ChangeFailed() bool { return f.failed }

// opError is like snapsvc's *OpError around a cause: not retryable once a
// change was made.
type opError struct {
	err error
	ok  bool
}

func (e *opError) Error() string   { return "snapsvc: start k8s.kube-apiserver: " + e.err.Error() }
func (e *opError) Unwrap() error   { return e.err }
func (e *opError) Retryable() bool { return e.ok }

// The rule of Do, case by case: how many times fn runs within 4 attempts.
func TestDoRule(t *testing.T) {
	lostPost := &snapd.ConnectionError{Method: "POST", Path: "/v2/apps", Connected: true, Written: true, Err: errors.New("EOF")}
	for _, c := range []struct {
		name  string
		err   error
		calls int
	}{
		// A start whose change failed (kube-apiserver before etcd) is
		// tried again, as k8sd's RetryFor loops expect.
		{"failed change", &opError{err: &failedChange{failed: true}}, 4},
		{"failed change wrapped", fmt.Errorf("failed to start services: %w", &opError{err: &failedChange{failed: true}}), 4},
		// A change that may still run is not repeated.
		{"change not failed", &opError{err: &failedChange{failed: false}}, 1},
		// An outcome that is unknown is never repeated.
		{"lost answer to a POST", lostPost, 1},
		{"lost answer in an OpError", &opError{err: lostPost, ok: true}, 1},
		{"indeterminate", &opError{err: indeterminate{}, ok: true}, 1},
		// Bad input and refusals that stay true are not retried.
		{"bad input", &opError{err: errors.New("invalid service name \"k8s.kube_let\"")}, 1},
		{"unknown service", &snapd.Error{StatusCode: 404, Kind: "app-not-found", Message: "no such app"}, 1},
		{"context error", fmt.Errorf("inner: %w", context.DeadlineExceeded), 1},
		// Conflicts, an unreachable snapd and foreign errors are retried.
		{"conflict", conflict(), 4},
		{"unreachable", &snapd.ConnectionError{Method: "POST", Path: "/v2/apps", Err: errors.New("connection refused")}, 4},
		{"foreign", errors.New("the server is currently unable to handle the request"), 4},
		{"retryable verdict", &opError{err: errors.New("busy"), ok: true}, 4},
	} {
		calls := 0
		err := retry.Loop{Attempts: 4, Clock: &recordingClock{}}.Do(context.Background(), func() error {
			calls++
			return c.err
		})
		if calls != c.calls {
			t.Errorf("%s: %d calls, want %d", c.name, calls, c.calls)
		}
		if !errors.Is(err, c.err) {
			t.Errorf("%s: %v lost the failure", c.name, err)
		}
	}
}

// indeterminate is an error that says its outcome is unknown.
type indeterminate struct{}

func (indeterminate) Error() string       { return "outcome unknown" }
func (indeterminate) Indeterminate() bool { return true }

// Issue 44, item 7: three predicates beside Retryable() answered "can
// retrying help?" differently: IsRetryable called a conflict whose
// operation had made a change (snapsvc's *OpError: not retryable)
// retryable. IsRetryable is the one question: the error's verdict first,
// then its class; IsRetryableOnce, deprecated, answers the same.
func TestIsRetryableAsksTheErrorFirst(t *testing.T) {
	notFound := &snapd.Error{StatusCode: 404, Kind: "app-not-found", Message: `snap "k8s" has no service "kubelt"`}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"a conflict, as snapd answered it", conflict(), true},
		{"an unknown service", notFound, false},
		{"a conflict whose operation made a change", &opError{err: conflict(), ok: false}, false},
		{"wrapped", fmt.Errorf("restarting: %w", &opError{err: conflict(), ok: false}), false},
		{"an operation that says it may be retried", &opError{err: notFound, ok: true}, true},
		{"nil", nil, false},
	} {
		if got := retry.IsRetryable(c.err); got != c.want {
			t.Errorf("%s: IsRetryable %v, want %v", c.name, got, c.want)
		}
		if got := retry.IsRetryableOnce(c.err); got != c.want {
			t.Errorf("%s: IsRetryableOnce %v, want %v", c.name, got, c.want)
		}
	}
}
