// Package budget is the contract between snapsvc and a restart budget's
// backend: what a backend implements (Budget, Slot, and optionally Fencer
// and Readier), the errors it returns, and the one form of a key
// (CanonicalKey, PauseScopes). It is to snapsvc what database/sql/driver is
// to database/sql: backends (github.com/snapsvc/snapsvc/etcdbudget,
// github.com/snapsvc/snapsvc/sqlbudget) import this small package only;
// users hand a backend to snapsvc.WithRestartBudget, which drives every
// slot through one lifecycle.
//
// A restart budget bounds how many machines of a cluster disrupt the same
// service at once: a restart takes a slot of the service's key (for
// example "k8s.kube-apiserver") and gives it back only once the service is
// ready again.
package budget

import (
	"context"
	"errors"
	"time"
)

// Budget hands out slots. Implementations must be safe for concurrent
// use.
type Budget interface {
	// Acquire waits until a slot of key is free and takes it. While it
	// waits it calls progress (when not nil) whenever what it waits behind
	// changes. It returns promptly once ctx ends, leaving no trace of the
	// waiter behind. Errors that a later attempt could overcome (the
	// coordination service is unreachable) wrap ErrUnavailable; errors
	// from a service that answered and refused wrap ErrRefused.
	Acquire(ctx context.Context, key string, progress func(Wait)) (Slot, error)
}

// Slot is a slot taken from a Budget.
type Slot interface {
	// Key is the key the slot was taken for.
	Key() string
	// Holder identifies this holder, as others waiting see it (for
	// example "node-1 pid 4242").
	Holder() string
	// Lost is closed when the slot was lost before Release: its session
	// expired (the machine was cut off from the coordination service for
	// longer than its lease), so another machine may hold it now.
	Lost() <-chan struct{}
	// Err says why the slot was lost (it wraps ErrSlotLost), nil while the
	// slot is held.
	Err() error
	// Release gives the slot back. It may be called more than once.
	Release(ctx context.Context) error
}

// Fencer is implemented by slots that can confirm, with a read that
// reflects every earlier write of the coordination service (a
// linearizable read), that they are still held and that the holder may
// act now. A budgeted operation calls Fence right before each request that
// disrupts a service (every restart or stop request, every attempt of it,
// and a start under snapsvc.BudgetOptions.StopsAndStarts), so a holder
// that was paused past its lease, or cut off, never acts on a slot someone
// else may hold now.
//
// Fence:
//   - returns nil and how long its confirmation stands, counted from the
//     moment Fence was called (what is left of the slot's lease, less a
//     margin); the operation sends its request only within that time and
//     fences again otherwise;
//   - checks every operator control of the key at that moment (a pause, a
//     maintenance window), not only at the grant: while the key is paused
//     or outside its window it waits, holding the slot, until acting is
//     allowed, the slot is lost or ctx ends (then an error wrapping
//     ErrPaused);
//   - records in the coordination service that the holder is about to act,
//     so a holder that vanishes afterwards is judged as one that may have
//     acted (see Readier);
//   - returns an error wrapping ErrSlotLost once the slot is not held, and
//     one wrapping ErrUnavailable when it cannot tell in time (the
//     operation then does not act).
type Fencer interface {
	Fence(ctx context.Context) (Validity, error)
}

// Validity is how long a Fence's confirmation stands, counted from the
// moment Fence was called: either a duration (ValidFor) or, for a slot
// that no coordination service can take away (one granted without a
// cluster, or on fail-open), no end at all (Unbounded). There is no "very
// long duration" sentinel, so no instant computed from a Validity can
// overflow. The zero Validity is a confirmation that has already run out.
type Validity struct {
	d         time.Duration
	unbounded bool
}

// ValidFor is a confirmation that stands for d (none when d <= 0).
func ValidFor(d time.Duration) Validity { return Validity{d: max(d, 0)} }

// Unbounded is a confirmation with no end: the slot cannot be lost.
func Unbounded() Validity { return Validity{unbounded: true} }

// Until returns the instant the confirmation runs out for a Fence called
// at asked, and false when it never runs out.
func (v Validity) Until(asked time.Time) (time.Time, bool) {
	if v.unbounded {
		return time.Time{}, false
	}
	return asked.Add(v.d), true
}

// Duration returns how long the confirmation stands, and false when it
// never runs out.
func (v Validity) Duration() (time.Duration, bool) { return v.d, !v.unbounded }

// String is the duration, or "unbounded".
func (v Validity) String() string {
	if v.unbounded {
		return "unbounded"
	}
	return v.d.String()
}

// Readier is implemented by slots that record, in the coordination
// service, that the services their holder disrupted are ready again. A
// budgeted operation calls MarkReady once its readiness checks passed
// (before snapsvc.BudgetOptions.Settle and the release) and every other
// operation of the Client sharing the slot is ready too, so a budget can
// tell a holder that vanished after its restart completed (its successor
// need not wait out a lock-delay) from one that vanished between its fence
// and its ready (it may still act, or its service may still be down). An
// error is reported (a "mark-ready-failed" event) and does not fail the
// operation.
type Readier interface {
	MarkReady(ctx context.Context) error
}

// Abandoner is implemented by slots that can be let go of as a holder that
// crashed would be: renewals stop, nothing is deleted or revoked, and the
// coordination service frees the slot only once its lease has run out
// and, for a slot fenced and not marked ready since, once its lock-delay
// has passed too. A later Release does nothing. snapsvc abandons, rather
// than releases, a slot whose change may still run or whose services may
// still be down when it must let go of it anyway (Client.Close, a hold
// past snapsvc.BudgetOptions.MaxHold without knowing its change's end):
// a clean exit is never less safe than a crash. Abandon returns at once.
type Abandoner interface {
	Abandon()
}

// Wait describes a wait for a slot, as Acquire reports it.
type Wait struct {
	// Key is the budget's key.
	Key string
	// Holders identify who holds the key's slots now.
	Holders []string
	// Ahead is how many other waiters are served before this one.
	Ahead int
	// Max is the number of slots of the key.
	Max int
}

// Errors of a restart budget; match them with errors.Is. Backends wrap
// them; snapsvc re-exports them under its own names
// (snapsvc.ErrBudgetUnavailable, ...).
var (
	// ErrUnavailable: the budget's coordination service could not be
	// reached (or has no quorum) within the budget's bound. Retryable,
	// and the only failure on which a fail-open budget grants a slot.
	ErrUnavailable = errors.New("restart budget unavailable")
	// ErrSlotLost: the slot was lost while the operation held it, so
	// another machine may have restarted the service at the same time.
	// The operation itself may have succeeded; not retryable (running it
	// again restarts the services again).
	ErrSlotLost = errors.New("restart budget slot lost")
	// ErrRefused: the coordination service answered and refused the
	// budget (a key it rejects, failed authentication or TLS, a missing
	// table or a read-only database, a waiter's entry deleted by an
	// operator, machines configured with different slot counts for one
	// key). Retrying cannot help until an operator acts; a fail-open
	// budget never grants a slot on it.
	ErrRefused = errors.New("restart budget refused")
	// ErrPaused: the operation held its slot but the key was paused by an
	// operator, or outside its maintenance window, at the moment of
	// acting, until the operation's bounds ended. Nothing was sent.
	// Retryable.
	ErrPaused = errors.New("restart budget paused")
)
