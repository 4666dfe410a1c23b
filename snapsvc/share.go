package snapsvc

import (
	"errors"

	"github.com/snapsvc/snapsvc/retry"
)

// What callers share, said once. Callers that want the same thing from
// snapd at the same time are peers: the goroutines of one process
// (process scope, in memory), and the processes of one machine (machine
// scope, through the lock directory). Whatever the scope, peers share in
// two ways, by one rule each:
//
//   - A wait. One peer, the watcher, waits for the thing (a change to be
//     ready, a snap to be idle, the change that blocks a snap to end) and
//     publishes what it sees as facts: outcomes, with when they were
//     gathered, and since when snapd has been unreachable. The others are
//     followers: they send snapd nothing, apply their own bounds to those
//     facts (their context, their policy's time, their MaxUnreachable
//     judged on the watcher's view), and take only an outcome gathered
//     after they began to follow. Peers share facts, never bounds. A
//     follower takes over when the watcher ends, dies or falls silent.
//   - A flight. Identical restarts merge into one: the first is the
//     leader, the others join it and share its change. A restart joins
//     only a flight whose request is not sent yet, so the restart still
//     happens after every joiner's call began; joiners share only the
//     change's own outcome (Done, or failed), and act themselves when the
//     leader ends otherwise.
//
// Where each lives:
//
//	          process (memory)                 machine (lock directory)
//	wait      processwait.go: WaitChange,      machinewait.go: the change that
//	          Operation.Wait, WaitIdle         blocks a snap, for its operations
//	flight    processflight.go: restarts       machineflight.go: restarts of
//	          waiting for the snap's lock      the machine's processes
//
// An operation's restart goes through both flights, the process's first
// (merge), and meets a conflict through the machine's wait (the conflict
// phase's following wait, conflict.go). Within a process, operations on a
// snap hold its lock in turn (lock.go), so one of them at a time meets a
// blocker: the machine's wait is what spares snapd the others.
//
// Calls from a hook take no part in the machine's sharing: a hook of the
// blocking change must never wait behind a watcher that waits for that
// very change. Nor do operations on several snaps, Clients without a lock
// directory (WithoutFileLock) or on a clock of the caller's (WithClock).

// awaitLockDir waits, for the operation, for news in the machine's lock
// directory after mark (watched: the directory's watch works; else it
// polls), at most one poll interval and at most peerLook (a peer that
// stopped publishes nothing: it is looked at again then), within the
// call's bounds.
//
// The joiner's difference, said here only: a follower of the machine's
// watcher (byGiveUp) stops at its give-up instant, the end of its
// policy's time or of its MaxUnreachable judged on the watcher's view of
// snapd (a *gaveUpError); a joiner of a flight stops only at its context's
// end (its deadline, and the policy's MaxElapsedTime on the real clock):
// its leader's attempts are what meet snapd, as for a joiner in the
// process, so it does not judge snapd's reachability itself. The error is
// the call's end: interrupted (the context), or the give-up.
func (op *operation) awaitLockDir(watched bool, mark uint64, byGiveUp bool) error {
	k := op.k
	d := min(op.c.poll, peerLook)
	left, bounded := k.left()
	bounded = bounded && byGiveUp
	if bounded && left < d {
		d = left
	}
	woke, err := false, errNotWatched
	if watched {
		woke, err = op.c.machine.dirs.watch(op.o.t.snaps[0]).waitFrom(k.ctx, d, mark)
	}
	switch {
	case k.ctx.Err() != nil:
		return interrupted(k.ctx, k.last)
	case err != nil: // not watched, or the watch broke (Close): poll
		if retry.Sleep(k.ctx, retry.RealClock(), d) != nil {
			return interrupted(k.ctx, k.last)
		}
	}
	if !woke && bounded && d == left {
		return k.exhausted(nil)
	}
	return nil
}

// errNotWatched stands for a lock directory that cannot be watched.
var errNotWatched = errors.New("the lock directory is not watched")
