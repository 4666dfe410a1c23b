// Package snapsvc starts, stops and restarts a snap's services, and
// refreshes snaps, through snapd, reliably, from hooks and daemons alike.
//
// snapd refuses a second change on a snap while one is running:
//
//	error: error running snapctl: snap "k8s" has "service-control" change in progress
//
// A Client absorbs that: its callers never conflict with each other, and a
// conflict caused by anyone else is waited out. Each operation waits for the
// change it made and reports the change's real outcome.
//
// # Operations
//
// Start, Stop and Restart take service names ("snap.app") or whole snaps
// ("snap") and return once snapd's change is ready; the Async forms return
// once snapd accepted the request, with an Operation to wait on. The life of
// one operation, each phase a function of operation.go:
//
//	bound     one call value holds every bound of the call (call.go)
//	budget    with WithRestartBudget, a slot per key (budget_*.go)
//	pace      WithMinRestartInterval keeps restarts of a service apart
//	lock      the snap's lock, in and across processes (lock.go); an
//	          identical restart not sent yet may merge, in the process
//	          (processflight.go) or across the machine's (machineflight.go)
//	send      one request to act: POST /v2/apps, or snapctl
//	conflict  someone else's change: wait for it, then send again
//	find      a lost answer: look for the change the request may have made
//	wait      the operation's own change, until it is ready (changewait.go)
//	verdict   Done is success; Error, Undone or Hold is a *ChangeError
//	release   the locks at once; budget slots by the slot rule
//
// Outside a snap the client posts to /v2/apps on /run/snapd.socket. Inside
// one (SNAP_COOKIE set) it runs snapctl over /run/snapd-snap.socket; snapctl
// answers only once its change is ready. In a configure or default-configure
// hook snapd only queues service commands until the hook ends, so operations
// return a Result with Queued set instead of waiting for services that cannot
// start before the hook returns.
//
// EnsureRunning and EnsureStopped act only on the services whose state
// differs; Services, Changes, Change, AbortChange, WaitChange, WaitIdle and
// WaitActive read and wait.
//
// # Refresh
//
// Refresh (and RefreshAsync) refreshes a snap by channel, revision or
// local file (as `snap install --dangerous FILE` does) as an operation
// like Restart: the same lock, conflicts waited out, a lost answer looked
// up (a refresh-snap or install-snap change of the request's summary)
// and never sent twice, its change waited for and judged. "No updates
// available" is a Result with NoUpdate set, not an error. Under
// WithRestartBudget a refresh takes the slots of every service of the
// snap, holds them until its services pass their readiness checks, and
// a refresh that fails or leaves them not ready halts the key.
// HoldRefresh and UnholdRefresh hold a snap's refreshes through snapd
// (2.58 and later; ErrHoldUnsupported before), and Snap reads the holds
// back. Refresh needs REST mode; inside a snap, GateAutoRefresh answers
// snapd's experimental gate-auto-refresh hook under the budget instead.
// docs/refresh.md walks an operator through a fleet's refresh.
//
// # Bounds
//
// Every public call is one call value (call.go) that holds all of its
// bounds: the caller's context; for operations and reads the policy's
// MaxElapsedTime, enforced as a deadline on every request; MaxUnreachable,
// how long snapd may stay unreachable; MaxAttempts; and a look-up reserve, the
// last of the call's time, kept to look up the change of a request whose
// answer is still pending. Every request and pause takes its limits from the
// call; nothing else computes a bound. Work still owed when a call returns (a
// bounded look-up, a budget slot held until its change is ready) runs in the
// background, owned by the Client and ended by Close.
//
// Whether a failed request is sent again is decided in one place, the retry
// rule (retryrule.go): a read is asked again when snapd was unreachable,
// restarting, or its answer was garbled or lost; a request to act is asked
// again only when snapd never saw it, a conflict is waited out, and a lost
// answer is looked up, never sent blindly. Everything else is returned.
//
// # Conflicts
//
// A conflict is recognised in every form snapd sends it (package retry).
// The operation waits for the blocking change and tries again as soon as it
// is ready: where snapd's state file can be watched, a first conflict is
// tried again at its next rewrite; otherwise the blockers are listed and
// followed with snapd's change notices (>= 2.62) or the state file, or by
// polling (wakers.go). Where the blocker's end cannot be seen at all (a
// strictly confined snap without snap-refresh-observe, or on snapd 2.57) the
// request is retried blind, on a jittered grid that never exceeds 20
// requests a second (cadence.go; docs/blind-waits.md). A blocker that waits
// for a reboot ends the operation with an error naming it. The Result
// counts one conflict per blocking change (Conflicts), however many
// requests it refused (Refused: in a blind wait, one per poll).
//
// # Lost answers
//
// A request to act whose answer was lost after it was written may have made
// a change. The operation never sends it again blindly: it looks for the
// change (matching.go: the earliest unclaimed service-control change doing
// exactly what was asked, spawned after the request by snapd's clock) and
// adopts it; only two empty look-ups a settling pause apart prove that
// nothing was made. When the outcome cannot be found out the error matches
// ErrOutcomeUnknown, which is not retryable.
//
// # Shared waits
//
// Callers that wait for the same thing share one wait, so snapd's load does
// not grow with their number: in a process, WaitChange, Operation.Wait and
// WaitIdle callers; across the processes of one host, through their lock
// directory (WithLockDir), the operations that meet a change holding their
// snap. And identical restarts that have not been sent yet become one. They
// share what was seen, never bounds: each caller applies its own context and
// policy, and takes only what was seen after it began to wait. Calls from
// hooks take no part across processes. share.go says how.
//
// # Restart budget
//
// WithRestartBudget makes restarts (and, optionally, stops) take a slot of a
// cluster-wide budget for each service's key, so that no more than a set
// number of machines disrupt a service at once. The contract a backend
// implements is package budget; github.com/snapsvc/snapsvc/etcdbudget and
// github.com/snapsvc/snapsvc/sqlbudget implement it. A slot is fenced right
// before each request that disrupts, and given back only once the
// operation's outcome is final and its services are ready again (the slot
// rule, budget_lifecycle.go), at Close, or when the backend reports it lost.
//
// # Errors
//
// Every failure of an operation is an *OpError naming the action, services,
// change and attempts; its Retryable method says whether trying again later
// could help. errors.Is and errors.As reach the cause: ErrNotFound,
// ErrGaveUp, ErrOutcomeUnknown, *retry.ConflictError, *ChangeError,
// *BudgetError, ErrSnapdNotInstalled.
//
// The fake package serves an in-process snapd, on the real wire protocol,
// for tests of code that uses this package.
package snapsvc
