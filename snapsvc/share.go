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
//     leader ends otherwise. A leader says "sent" before each attempt and
//     "open" again after one that provably did nothing (refused by a
//     conflict, or never written); one that never waits (the snap's lock
//     free, snapd not refusing it) sends at once, and nobody could have
//     joined it: its flight is only made visible once it is about to wait.
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
// (the merge phase), and meets a conflict through the machine's wait (the
// conflict phase's following wait, conflict.go). Within a process,
// operations on a snap hold its lock in turn (lock.go), so one of them at
// a time meets a blocker: the machine's wait is what spares snapd the
// others.
//
// In the machine's scope every peer's part is a record in the snap's lock
// directory (lockdir.go says where that is; records.go, what a record is
// and when a peer trusts one: this boot's, its lock held, its beat
// moving):
//
//	SNAP.lock         the snap's lock, held by the operation acting on it,
//	                  let go of while it waits out someone else's change
//	SNAP.wait         the snap's wait: its watcher's facts
//	SNAP.HASH.flight  a flight of identical restarts (HASH: of the mode,
//	                  cookie, hook and request): its phase, then outcome
//	SNAP.peers        a short lock: records made, removed or deposed
//
// Calls from a hook take no part in the machine's sharing: a hook of the
// blocking change must never wait behind a watcher that waits for that
// very change. Nor do operations on several snaps, Clients without a lock
// directory (WithoutFileLock) or on a clock of the caller's (WithClock).

// awaitLockDir waits for news in the snap's lock directory after mark
// (watched: its watch works; else it polls), for at most a poll interval
// and peerLook, within the call's bounds: byGiveUp also ends it at the
// give-up instant (a *gaveUpError), the joiner's difference, said here
// only: a joiner does not judge snapd's reachability (its leader's
// attempts meet snapd), and stops at its context's end alone.
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
