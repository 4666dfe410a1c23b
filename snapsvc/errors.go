package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// ConnectionError is a failure to reach snapd or to read its answer.
// Fields: Method, Path, Written (whether the whole request was sent, so
// snapd may have acted on it) and Err (the transport's error).
type ConnectionError = snapd.ConnectionError

// ResponseError is an answer from snapd that could not be decoded.
type ResponseError = snapd.ResponseError

// SnapctlError is snapctl's non-zero exit (snapd's "unsuccessful" kind).
// Fields: Args, ExitCode, Stdout, Stderr.
type SnapctlError = snapd.UnsuccessfulError

// ErrNotFound matches, with errors.Is, snapd's answers that a snap,
// service or change does not exist.
var ErrNotFound = snapd.ErrNotFound

// ErrGaveUp matches, with errors.Is, an operation that stopped retrying
// because its policy's attempts or time ran out. The error also wraps the
// last failure (often a *retry.ConflictError).
var ErrGaveUp = errors.New("gave up retrying")

// ErrOutcomeUnknown matches, with errors.Is, an operation that may or may
// not have been carried out: snapd's answer was lost or came too late and
// the change could not be looked up. It is not retryable: running a
// restart again could restart the services twice. Check the services'
// state before acting again.
var ErrOutcomeUnknown = errors.New("outcome unknown")

// OpError is the error every failed Start, Stop, Restart and Refresh returns. It
// names the action, the services, the change (when one was made) and the
// attempts, and wraps the cause.
type OpError struct {
	// Op is "start", "stop", "restart", "refresh", "hold" or "unhold"
	// ("read" and "wait active" for reads).
	Op string
	// Snap is the snap acted on (several are joined with commas).
	Snap string
	// Names are the services (or snaps) the operation targeted.
	Names []string
	// ChangeID is the change the operation made or adopted, if any.
	ChangeID string
	// Attempts is how many requests to act were sent.
	Attempts int
	// Err is the cause.
	Err error
}

func (e *OpError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "snapsvc: %s", e.Op)
	for _, n := range e.Names {
		if n == "" {
			n = `""` // the input, even empty: never "restart : ..."
		}
		b.WriteString(" " + n)
	}
	if e.ChangeID != "" {
		fmt.Fprintf(&b, " (change %s)", e.ChangeID)
	}
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " after %d attempts", e.Attempts)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	if e.Retryable() {
		b.WriteString(" [retryable]")
	} else {
		b.WriteString(" [not retryable]")
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *OpError) Unwrap() error { return e.Err }

// Retryable reports whether running the same operation again later could
// succeed (a conflict or an unreachable snapd, and no change made), as
// opposed to a failure that retrying cannot fix (unknown service, a change
// that ended in error) or must not try (a change was made and may still
// run: ChangeID is set; the outcome is unknown).
func (e *OpError) Retryable() bool {
	if e.ChangeID != "" {
		// A change was made for the operation: the action is under way or
		// over, and running it again would act twice.
		return false
	}
	if errors.Is(e.Err, ErrInvalidName) || errors.Is(e.Err, ErrNoNames) || errors.Is(e.Err, ErrWrongSnap) || errors.Is(e.Err, ErrOutcomeUnknown) {
		return false
	}
	var ce *ChangeError
	if errors.As(e.Err, &ce) {
		return false
	}
	var be *BudgetError
	if errors.As(e.Err, &be) {
		return be.Retryable()
	}
	if errors.Is(e.Err, context.Canceled) || errors.Is(e.Err, context.DeadlineExceeded) || errors.As(e.Err, new(*policyTimeError)) {
		// The caller's context, or the policy's time (MaxElapsedTime,
		// the call's own deadline: policyTimeError), ended before
		// anything was done (a change made, or an unknown outcome, is
		// answered above), while the call waited on someone else's work
		// (an identical restart it joined, in the process or another):
		// a later call may well succeed.
		return true
	}
	return retry.IsRetryable(e.Err)
}

// ChangeError is a change that became ready without succeeding: its
// status is Error, Undone or Hold (or the change vanished). Err is
// snapd's own text ("cannot perform the following tasks: ...").
type ChangeError struct {
	ID      string
	Kind    string
	Summary string
	Status  string
	Err     string
}

func (e *ChangeError) Error() string {
	msg := e.Err
	if msg == "" {
		msg = "no error text from snapd"
	}
	if e.ID == "" {
		return fmt.Sprintf("%s change ended %q: %s", e.Kind, e.Status, msg)
	}
	return fmt.Sprintf("change %s (%s) ended %q: %s", e.ID, e.Kind, e.Status, msg)
}

// gaveUpError wraps the last failure of an operation that ran out of
// attempts or time.
type gaveUpError struct {
	reason string
	last   error
}

func (e *gaveUpError) Error() string   { return e.reason + ": " + e.last.Error() }
func (e *gaveUpError) Unwrap() []error { return []error{ErrGaveUp, e.last} }

// interruptedError is an operation whose context ended while it was
// retrying; it keeps the last failure, which says why it was retrying.
type interruptedError struct {
	ctx  error
	last error
}

func (e *interruptedError) Error() string {
	return fmt.Sprintf("%v while retrying; last error: %v", e.ctx, e.last)
}

func (e *interruptedError) Unwrap() []error { return []error{e.ctx, e.last} }

func interrupted(ctx context.Context, last error) error {
	cause := context.Cause(ctx)
	if last == nil {
		return cause
	}
	return &interruptedError{ctx: cause, last: last}
}

// outcomeUnknownError is an operation whose effect could not be found out.
// sent, when set, is when the request whose outcome is unknown was sent,
// known the changes it must not be taken for (blockers it waited out), and
// found, when set, yields what a look-up in the background found for it
// once that look-up ends: a restart budget holds its slots until then, and
// on (budget_lifecycle.go, the slot rule).
type outcomeUnknownError struct {
	reason string
	last   error
	sent   sent
	known  map[string]bool
	found  <-chan lookupResult
}

func (e *outcomeUnknownError) Error() string   { return e.reason + ": " + e.last.Error() }
func (e *outcomeUnknownError) Unwrap() []error { return []error{ErrOutcomeUnknown, e.last} }

// cutOffChangeError is an operation whose time ran out while snapd's answer
// was pending, with a change found that does what the request asked,
// spawned since it was sent: most likely the request's own (the action is
// under way, so retrying would do it twice), though an identical request
// of someone else's cannot be told from it. It matches the context's
// error (or ErrGaveUp) and ErrOutcomeUnknown.
type cutOffChangeError struct {
	id  string
	ctx error
}

func (e *cutOffChangeError) Error() string {
	return fmt.Sprintf("%v while snapd's answer was pending; change %s, made since the request was sent, does what it asked (most likely the request's own; not waited for: do not retry, it would act twice)", e.ctx, e.id)
}

func (e *cutOffChangeError) Unwrap() []error { return []error{e.ctx, ErrOutcomeUnknown} }

// adoptedError is a wait, for a change found after the request's answer
// was lost, that ended before the change was ready. The change does what
// the request asked and was spawned since it was sent, so it is most
// likely the request's own, but an identical request of someone else's
// cannot be told from it: the request's own change may be another one,
// so the outcome is unknown. It matches the wait's error and
// ErrOutcomeUnknown.
type adoptedError struct {
	id  string
	err error
}

func (e *adoptedError) Error() string {
	return fmt.Sprintf("snapd's answer was lost; change %s, found as the request's (most likely its own, though an identical change of someone else's cannot be told from it), was not seen to end: %v", e.id, e.err)
}

func (e *adoptedError) Unwrap() []error { return []error{e.err, ErrOutcomeUnknown} }

// adoptedWaitError is err, from waiting for change id found after a lost
// answer, as an adoptedError unless the change itself failed (a
// *ChangeError: its outcome is known).
func adoptedWaitError(id string, err error) error {
	var ce *ChangeError
	if errors.As(err, &ce) {
		return err
	}
	return &adoptedError{id: id, err: err}
}

// ChangeFailed reports whether the change became ready without doing its
// work: status Error, Undone or Hold. Its outcome is known — the action
// did not happen and nothing of it still runs — so a caller's retry loop
// may make a new change (retry.Do does: a start of kube-apiserver that
// failed because etcd was not up yet may well succeed a moment later). A
// change that is gone or still waiting is not failed: its outcome is not
// known.
func (e *ChangeError) ChangeFailed() bool {
	switch e.Status {
	case snapd.StatusError, snapd.StatusUndone, snapd.StatusHold:
		return true
	}
	return false
}
