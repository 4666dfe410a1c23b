// Package snapsvc starts, stops and restarts a snap's services through
// snapd, reliably, from hooks and daemons alike.
//
// snapd refuses a second change on a snap while one is running:
//
//	error: error running snapctl: snap "k8s" has "service-control" change in progress
//
// A Client absorbs that. Every Client in a process that reaches the same
// snapd shares one lock per snap, and processes share a file lock, so
// callers of one machine never conflict with each other. A conflict caused
// by anyone else (a "snap set", a refresh, an administrator) is waited out:
// the client finds the blocking change, waits until snapd reports it ready
// (through the notices long-poll on snapd >= 2.62, polling before) and
// retries at once. When the blocker cannot be seen it backs off, bounded
// by its retry.Policy and the context.
//
// Each operation waits for the change it made and reports the change's
// real outcome: a change that ends in Error, Undone or Hold is a
// *ChangeError carrying snapd's own error text and the change id, never a
// success. Every error is an *OpError naming the action, services, change
// and attempts, whose Retryable method says whether trying again later
// could help; errors.Is and errors.As reach the cause (ErrNotFound,
// ErrGaveUp, *retry.ConflictError, *APIError, *ChangeError).
//
// Outside a snap the client posts to /v2/apps on /run/snapd.socket. Inside
// one (SNAP_COOKIE set) it runs snapctl over /run/snapd-snap.socket. In a
// configure or default-configure hook snapd only queues service commands
// until the hook ends, so operations return a Result with Queued set
// instead of waiting for services that cannot start before the hook
// returns.
//
// The fake package serves an in-process snapd for tests of code that uses
// this package.
package snapsvc
