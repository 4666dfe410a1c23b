package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/probe"
)

// The restart budget's contract lives in package budget, which backends
// import; these names are the same types and values, for users of
// WithRestartBudget and for errors.Is.
type (
	// RestartBudget is budget.Budget: it hands out slots (see WithRestartBudget).
	RestartBudget = budget.Budget
	// BudgetSlot is budget.Slot, a slot taken from a RestartBudget.
	BudgetSlot = budget.Slot
	// BudgetFencer is budget.Fencer: slots that confirm they are still held
	// right before each request that disrupts.
	BudgetFencer = budget.Fencer
	// BudgetReadier is budget.Readier: slots that record that their
	// holder's services are ready again.
	BudgetReadier = budget.Readier
	// BudgetAbandoner is budget.Abandoner: slots that can be let go of as
	// a crashed holder's would be, behind the lock-delay.
	BudgetAbandoner = budget.Abandoner
	// BudgetWait is budget.Wait: what a wait for a slot waits behind.
	BudgetWait = budget.Wait
	// BudgetRecorder is budget.Recorder: slots whose budget keeps a
	// history of acts and halts a key after failed ones.
	BudgetRecorder = budget.Recorder
	// BudgetAct is budget.Act: one budgeted act as its holder records it.
	BudgetAct = budget.Act
	// BudgetHalt is budget.Halt: why a key halted itself.
	BudgetHalt = budget.Halt
)

// Errors of a restart budget (package budget's); match them with errors.Is.
var (
	// ErrBudgetUnavailable is budget.ErrUnavailable: the coordination
	// service could not be reached within the budget's bound. Retryable.
	ErrBudgetUnavailable = budget.ErrUnavailable
	// ErrSlotLost is budget.ErrSlotLost: the slot was lost while the
	// operation held it. Not retryable.
	ErrSlotLost = budget.ErrSlotLost
	// ErrBudgetRefused is budget.ErrRefused: the coordination service
	// answered and refused. Not retryable; never fails open.
	ErrBudgetRefused = budget.ErrRefused
	// ErrBudgetPaused is budget.ErrPaused: the key was paused, or outside
	// its window, at the moment of acting, until the operation's bounds
	// ended. Nothing was sent. Retryable.
	ErrBudgetPaused = budget.ErrPaused
	// ErrBudgetWait: no slot became free within BudgetOptions.MaxWait.
	// Retryable.
	ErrBudgetWait = errors.New("no restart budget slot became free in time")
	// ErrBudgetHalted is budget.ErrHalted: the key halted itself after
	// failed restarts and no operator has resumed it. It comes wrapped
	// with ErrBudgetPaused (nothing was sent); not retryable until an
	// operator resumes the key.
	ErrBudgetHalted = budget.ErrHalted
	// ErrAdmissionRefused: BudgetOptions.Admit refused the act until the
	// operation's bounds ended. The slots were held and nothing was
	// sent. Retryable.
	ErrAdmissionRefused = errors.New("the admission check refused the restart")
)

// CanonicalKey is budget.CanonicalKey: the one form of a budget key.
func CanonicalKey(key string) string { return budget.CanonicalKey(key) }

// PauseScopes is budget.PauseScopes: the keys whose pause holds key back.
func PauseScopes(key string) []string { return budget.PauseScopes(key) }

// errBudgetClosed: the Client was closed while the operation waited for
// a slot (or before it asked for one).
var errBudgetClosed = errors.New("the client was closed")

// BudgetError is a failure of a budgeted operation that concerns its slot:
// it could not be had, it was lost, or the service did not become ready
// while the slot was held. It names the key, the holders when known, and
// how long the operation waited for the slot.
type BudgetError struct {
	// Key is the budget's key.
	Key string
	// Holders are who held the key's slots when last seen (empty if not
	// known).
	Holders []string
	// Waited is how long the operation waited for the slot.
	Waited time.Duration
	// Err is the cause: ErrBudgetUnavailable, ErrBudgetWait,
	// ErrBudgetRefused, ErrSlotLost, a *probe.NotReadyError, or the
	// context's error.
	Err error
	// ChangeDone is set when the error came once the operation's change
	// was done (a slot lost while it ran, found when the services were
	// ready): the services were acted on, and only the budget's promise
	// is in doubt. Snapctl cannot always name that change, so this is how
	// a caller tells that the action ran.
	ChangeDone bool
}

func (e *BudgetError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "restart budget %s", e.Key)
	if e.Waited > 0 {
		fmt.Fprintf(&b, ": waited %s", e.Waited.Round(time.Millisecond))
	}
	if len(e.Holders) > 0 {
		fmt.Fprintf(&b, " (slot held by %s)", strings.Join(e.Holders, ", "))
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	if e.ChangeDone {
		b.WriteString(" (after the change was done)")
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *BudgetError) Unwrap() error { return e.Err }

// Retryable reports whether a later attempt could succeed: the budget was
// unreachable (including a fence that could not confirm the slot in time;
// nothing was sent then) or no slot came free in time. A refused budget,
// a lost slot, a service that did not become ready, a closed Client and a
// cancelled context are not.
func (e *BudgetError) Retryable() bool {
	if errors.Is(e.Err, ErrBudgetRefused) || errors.Is(e.Err, ErrSlotLost) || errors.Is(e.Err, ErrBudgetHalted) {
		return false
	}
	return errors.Is(e.Err, ErrBudgetUnavailable) || errors.Is(e.Err, ErrBudgetWait) ||
		errors.Is(e.Err, ErrBudgetPaused) || errors.Is(e.Err, ErrAdmissionRefused)
}

// BudgetOptions configure WithRestartBudget.
type BudgetOptions struct {
	// Key maps a service name ("snap.app") to its budget key. A
	// whole-snap name given to an operation ("snap") stands for every one
	// of its services (read from snapd's apps listing), each mapped by
	// Key, so a whole-snap restart and a restart of one of its services
	// exclude each other. Keys are put in canonical form (CanonicalKey).
	// Default: the name itself.
	Key func(name string) string
	// Ready returns the readiness check of a name, or nil when the
	// change being Done is enough. The slot is held until every check of
	// the operation passed.
	Ready func(name string) probe.Probe
	// Probe sets how Ready's checks are repeated (interval, timeout,
	// successes in a row, MaxWait). Its Clock defaults to the client's.
	Probe probe.Options
	// Settle is how long the slot is still held after the checks passed.
	Settle time.Duration
	// MaxWait bounds the wait for a slot (0: only the context bounds it);
	// past it the operation fails with ErrBudgetWait, retryable.
	MaxWait time.Duration
	// StopsAndStarts also budgets stops: a Stop of a service that is
	// running takes its slot and keeps it after the Stop returns, until a
	// Start of that service through this Client made it ready again (or
	// the Client is closed). Starts of services whose slot this Client
	// does not hold take none: starting takes nothing down.
	StopsAndStarts bool
	// ReleaseTimeout bounds one attempt to give a slot back, and how long
	// Close waits for the releases still running in the background
	// (default DefaultReleaseTimeout). It never delays an operation's
	// return past its context's deadline: see WithRestartBudget.
	ReleaseTimeout time.Duration
	// MaxHold bounds how long slots stay held in the background, after
	// their operation returned, without knowing the change's end: snapd
	// is away, or refuses this client its changes (a snap without
	// snap-refresh-observe). It is the bound on not knowing: a hold whose
	// change snapd shows keeps on past it (each time it runs out the
	// change is read once), and a hold that can follow its change ends
	// when snapd shows it ready and the services are. Past it the slots are abandoned, as
	// a crashed holder's would be (budget.Abandoner: the budget frees
	// them once their lease and lock-delay have run out), with a
	// "hold-expired" event, then "abandoned" and a warning; never given
	// back while the change may run. 0 means DefaultMaxHold; negative, no
	// bound but Close.
	MaxHold time.Duration
	// Admit, when set, is the application's admission check ("2 of 3
	// mons in quorum", ceph's ok-to-stop): asked once the operation holds
	// its slots and they are fenced, right before its first request to
	// act. nil admits. An error refuses: the operation keeps its slots
	// (so its place: nobody else restarts meanwhile), and asks again
	// with backoff (AdmitRetry) within the call's bounds, fencing again
	// before it acts; a refusal is not a failure and never hands the slot
	// on. When the call's bounds end first it fails with
	// ErrAdmissionRefused (retryable), nothing sent. Each refusal is an
	// "admission-refused" event.
	Admit func(ctx context.Context, a Admission) error
	// AdmitRetry is the pause between admission checks after a refusal:
	// it starts at its Initial and doubles to its Max (default 1 s to
	// 15 s).
	AdmitRetry AdmitBackoff
	// Progress, when set, receives what the budget does. It is called from
	// the operation's goroutine and, for releases and lost slots, from
	// background goroutines, possibly after the operation returned; it
	// must not block.
	Progress func(BudgetEvent)
}

// Admission is what an admission check (BudgetOptions.Admit) is asked:
// may this operation disrupt these services now?
type Admission struct {
	// Action is "restart", "stop", "start" or "refresh"; Services the
	// names the operation acts on (a whole snap's name stands for its
	// services; a refresh names its snap).
	Action   string
	Services []string
	// Keys are the budget keys whose slots the operation holds.
	Keys []string
	// Refusals is how many times the check refused this operation so far.
	Refusals int
}

// AdmitBackoff is the pause between admission checks after a refusal.
type AdmitBackoff struct {
	// Initial is the first pause (default 1 s); each refusal doubles it,
	// up to Max (default 15 s).
	Initial, Max time.Duration
}

// DefaultReleaseTimeout is BudgetOptions.ReleaseTimeout's default.
const DefaultReleaseTimeout = 10 * time.Second

// DefaultMaxHold is BudgetOptions.MaxHold's default: longer than a
// service's restart takes even when systemd waits out its stop timeout
// twice (90 s each by default), short enough that a rollout does not
// stall for long behind a machine that cannot see its change.
const DefaultMaxHold = 10 * time.Minute

// Budget event kinds, BudgetEvent.Kind.
const (
	// BudgetWaiting: the operation waits for a slot (Wait says behind
	// whom); sent again whenever that changes.
	BudgetWaiting = "waiting"
	// BudgetAcquired: the slot was taken (Waited: how long it took).
	BudgetAcquired = "acquired"
	// BudgetFenced: right before a request that disrupts, the slot was
	// confirmed still held (only for slots implementing BudgetFencer).
	BudgetFenced = "fenced"
	// BudgetFenceFailed: the fence could not confirm the slot (Err); the
	// request was not sent.
	BudgetFenceFailed = "fence-failed"
	// BudgetReady: the readiness checks passed; the settle time starts.
	BudgetReady = "ready"
	// BudgetMarkReadyFailed: the slot implements BudgetReadier and could
	// not record that its services are ready again (Err); the operation
	// goes on.
	BudgetMarkReadyFailed = "mark-ready-failed"
	// BudgetReleased: the slot was given back (Held: for how long it was
	// held).
	BudgetReleased = "released"
	// BudgetLost: the slot was lost while held (Err says why). Sent once
	// per slot.
	BudgetLost = "lost"
	// BudgetSettling: the operation returned with its outcome not final
	// (its change may still run, or whether it made one is unknown; Err
	// says why): the slot stays held, following snapd's records, until
	// the change is ready and the services are.
	BudgetSettling = "settling"
	// BudgetHoldExpired: a slot held past its operation reached
	// BudgetOptions.MaxHold without snapd's records showing the change's
	// end (Err says why). An "abandoned" event follows.
	BudgetHoldExpired = "hold-expired"
	// BudgetHoldRunning: a slot held past its operation reached
	// BudgetOptions.MaxHold while snapd's records show its change (in
	// progress, or ready and being followed to its end): it is held on,
	// and looked at again after MaxHold.
	BudgetHoldRunning = "hold-running"
	// BudgetAbandoned: the slot was let go of as a crashed holder's would
	// be (budget.Abandoner), its change possibly still running or its
	// services possibly still down: at Close, or past MaxHold without
	// snapd's records showing the change's end. The budget frees it once
	// its lease runs out and its lock-delay has passed.
	BudgetAbandoned = "abandoned"
	// BudgetReleaseFailed: an attempt to give the slot back failed (Err,
	// Attempt); it is tried again in the background, up to 5 attempts or
	// until Close, after which (Final) the slot is freed only when the
	// budget expires it (its lease).
	BudgetReleaseFailed = "release-failed"
	// BudgetAdmissionRefused: BudgetOptions.Admit refused the act (Err);
	// the slots stay held and the check is asked again.
	BudgetAdmissionRefused = "admission-refused"
	// BudgetRecorded: the hold's act was recorded in the budget's history
	// (slots implementing BudgetRecorder; Act).
	BudgetRecorded = "recorded"
	// BudgetRecordFailed: the act could not be recorded (Err); the
	// operation's outcome is unchanged.
	BudgetRecordFailed = "record-failed"
	// BudgetHalted: the act's failure halted its key (Halt): no machine
	// acts on it until an operator resumes it. Logged as a warning.
	BudgetHalted = "halted"
)

// BudgetEvent reports a step of a budgeted operation.
type BudgetEvent struct {
	// Time is when it happened, on the client's clock.
	Time time.Time
	// Kind is one of the Budget* kinds: "waiting", "acquired", "fenced",
	// "fence-failed", "ready", "mark-ready-failed", "released", "lost",
	// "release-failed", "settling", "hold-running", "hold-expired",
	// "abandoned".
	Kind string
	// Key is the budget's key.
	Key string
	// Holder is this holder (every kind but "waiting").
	Holder string
	// Wait is what the operation waits behind ("waiting").
	Wait BudgetWait
	// Waited is how long the operation has waited for the slot
	// ("waiting", "acquired").
	Waited time.Duration
	// Held is how long the slot has been held ("fenced", "fence-failed",
	// "ready", "released", "lost", "release-failed"): for "released",
	// the slot's hold time.
	Held time.Duration
	// Attempt is the release attempt ("released", "release-failed"),
	// from 1.
	Attempt int
	// Final ("release-failed") says no attempt follows: the slot is freed
	// only when the budget expires it. The last of the attempts is final,
	// and so is one that Close kept from being made (Err says so).
	Final bool
	// Err is why the slot was lost ("lost"), the fence failed
	// ("fence-failed"), the release failed ("release-failed"), the
	// admission check refused ("admission-refused") or the record failed
	// ("record-failed").
	Err error
	// Act is what was recorded ("recorded", "halted").
	Act *BudgetAct
	// Halt is the key's halt ("halted").
	Halt *BudgetHalt
}

// WithRestartBudget makes restarts take a slot of b for each name they
// restart, sorted by key (so two operations cannot deadlock), and hold it
// through the restart until the service is ready again (opts.Ready, then
// opts.Settle). A Refresh takes the slots of every service of its snap, as
// a restart of the whole snap does, and holds them the same way. With opts.StopsAndStarts it also applies to stops of
// running services. Without this option no budget is consulted, which is
// what a first bootstrap, before any cluster exists, needs.
//
// Right before each request that disrupts (the restart or stop request,
// every attempt of it) the operation checks that its slots are still held
// and that it may act now: Lost, then BudgetFencer.Fence when the slot
// implements it; the request is then written only while the fence's
// confirmation stands. A slot lost by then stops the operation before it
// acts (a *BudgetError wrapping ErrSlotLost, not retryable); a fence that
// cannot tell stops it too (ErrBudgetUnavailable, retryable: nothing was
// sent).
//
// Slots are given back only once the operation's outcome is final and its
// services are ready (the slot rule, below: a change that may still run,
// or an unknown outcome, keeps them held in the background until the
// change is ready and the services are). Close, and MaxHold without
// knowing the change's end, abandon the slots of holds whose change may
// still run or whose services may still be down (the budget frees them as
// a crashed holder's, behind the lock-delay: budget.Abandoner), and so do
// the slots a Stop kept; a Start that took them and failed keeps them. The release runs in
// the background: the operation waits for its first attempt only until its
// context ends, so a slow release (a lease revoke while etcd is
// unreachable) never delays its return past the deadline. A failed release
// is reported ("release-failed" event and a log line) and tried again in
// the background; Close waits for that work, at most ReleaseTimeout.
//
// Calls that snapd only queues (inside a configure hook) take no slot: the
// restart happens after the hook, out of the operation's sight. A restart
// paced by WithMinRestartInterval waits out its interval before taking a
// slot. Operations of one Client on the same key share one slot, so
// identical restarts still merge into one change.
func WithRestartBudget(b RestartBudget, opts BudgetOptions) Option {
	return func(s *settings) { s.budget = &budgetRunner{b: b, opts: opts} }
}
