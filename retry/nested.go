package retry

import "time"

// NestedPolicy returns the policy for an operation that runs inside the
// caller's own retry loop, such as k8sd's RetryFor(ctx, 5, 5*time.Second,
// ...) around every service call. It is DefaultPolicy with its time bound
// cut from 5 minutes to 30 seconds and its longest pause from 5 s to 2 s:
// long enough to wait out the usual blockers (a "snap set" and its
// configure hook, another process's restart) with no error reaching the
// caller, short enough that the loops nest to minutes rather than hours.
// Around RetryFor(5, 5 s) the worst case is 5 × 30 s + 4 × 5 s = 170 s,
// against about 25 minutes with DefaultPolicy.
//
// MaxUnreachable stays DefaultPolicy's 30 s, so an absent snapd is also
// given up on within the same bound.
//
// A conflict whose blocking change can be seen is still waited out as soon
// as that change is ready; the 30 seconds only bound how long. When the
// policy runs out the operation fails with a retryable error (snapsvc's
// ErrGaveUp), which the caller's loop retries; pair it with Do, which stops
// at once on errors retrying cannot fix.
func NestedPolicy() Policy {
	p := DefaultPolicy()
	p.MaxInterval = 2 * time.Second
	p.MaxElapsedTime = 30 * time.Second
	return p
}
