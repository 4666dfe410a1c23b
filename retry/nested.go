package retry

import "time"

// NestedPolicy returns the policy for an operation that runs inside k8sd's
// own retry loop, RetryFor(ctx, 5, 5*time.Second, ...) around every
// service call, ported to Do: Loop{Attempts: 5, Delay: 5 * time.Second}.
// NestedPolicy(). See Loop.NestedPolicy for what it bounds and why.
func NestedPolicy() Policy {
	return Loop{Attempts: 5, Delay: 5 * time.Second}.NestedPolicy()
}

// NestedPolicy returns the policy for snapsvc's operations called inside
// the loop, so that the loop and the operations share one bound, the
// loop's Attempts × Delay (RetryFor's own worst case with the same
// arguments: 25 s for 5 attempts 5 s apart):
//
//   - MaxElapsedTime is Attempts × Delay: an operation held by a change
//     that never ends gives up (retryable, snapsvc's ErrGaveUp) once the
//     loop's whole time has passed, and Do, which starts no attempt after
//     that time, stops: the loop ends after about Attempts × Delay, not
//     Attempts times that. A blocker that ends sooner is waited out as
//     soon as it is ready, in the first attempt.
//   - MaxUnreachable is Delay: a socket that stays missing while snapd is
//     installed (snapd restarting, a machine still booting) costs one
//     Delay per attempt, re-dialled every RedialInterval; Do starts the
//     next attempt at once (the attempt took its Delay), so the loop ends
//     after Attempts × Delay, as RetryFor's five failed commands and
//     pauses did.
//   - MaxInterval is 2 s, so a blocker that cannot be watched is tried
//     again at least that often.
//   - ChangeWait is negative: once snapd accepted the operation, its own
//     change is waited for as long as it takes (the context bounds it),
//     as the snap command the loop used to run waited for its change: a
//     control-plane service that takes 40 s to start is not a failure.
//
// The worst case inside Do is therefore one bound plus what the loop had
// already spent when its last attempt began: at most Attempts × Delay when
// the snap is held from the first attempt, under twice that when earlier
// attempts failed for other reasons (a failed change, each followed by a
// full Delay) and a blocker that never ends arrives at the last one.
// Inside a loop that pauses a full Delay after every failure whatever the
// attempt took (k8sd's RetryFor kept as it is), the bounds add up:
// Attempts × (MaxElapsedTime + Delay).
//
// The policy's time bounds everything before snapd accepts the operation
// (waiting out others' changes, reaching snapd); the wait for the
// operation's own change, and its readiness under a restart budget, are
// bounded by the caller's context.
func (l Loop) NestedPolicy() Policy {
	p := DefaultPolicy()
	p.MaxInterval = 2 * time.Second
	p.ChangeWait = -1
	if l.Delay > 0 {
		p.MaxElapsedTime = time.Duration(max(l.Attempts, 1)) * l.Delay
		p.MaxUnreachable = l.Delay
	}
	return p
}
