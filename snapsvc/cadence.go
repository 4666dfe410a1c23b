package snapsvc

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// Blind waits: how a conflict is waited out when the end of the blocking
// change cannot be observed.
//
// A wait is blind when snapd has no change notices for this client and
// its state file is not watched (a strictly confined snap cannot see
// /var/lib/snapd; snapd < 2.62 has no notices), or when the blocker cannot
// even be listed. What each snapd lets a snap do on the snap socket
// (/run/snapd-snap.socket; the main socket lets through whoever AppArmor
// lets reach it, a snap with snapd-control included):
//
//   - POST /v2/snapctl: snapAccess, the snap socket only, every snapd
//     (daemon/api_snapctl.go). snapctl start/stop/restart answer once
//     their change is ready; a conflicting one is refused at once, before
//     any change is made (ctlcmd runServiceCommand ->
//     servicestate.Control -> snapstate.CheckChangeConflictMany): cheap.
//   - GET /v2/changes and /v2/changes/{id}: openAccess in 2.57.6
//     (daemon/api_general.go stateChangesCmd: requireSnapdSocket, so the
//     snap socket gets 403 "access denied" whatever the snap plugs);
//     interfaceOpenAccess{snap-refresh-observe} from 2.62 (2.77 adds
//     ros-snapd-support for /v2/changes/{id}): a snap plugging
//     snap-refresh-observe may list and read every change.
//   - GET /v2/notices: none before 2.62 (404 "not found");
//     interfaceOpenAccess{snap-refresh-observe,
//     snap-interfaces-requests-control} from 2.62 (daemon/api_notices.go),
//     and change-update notices need snap-refresh-observe
//     (noticeReadInterfaces).
//   - snapctl is-ready CHANGE (2.76+, ctlcmd/is_ready.go) answers only for
//     changes the calling snap initiated itself ("initiated-by-snap"), so
//     it cannot follow someone else's blocker; no snapctl command lists
//     changes.
//   - POST /v2/apps is openAccess (main socket only) up to 2.76; 2.77
//     lets a snap plugging ros-snapd-support post it on the snap socket
//     if it is also authenticated (interfaceAuthenticatedAccess,
//     daemon/api_apps.go): not a path for an ordinary snap.
//
// So a snap with snap-refresh-observe on snapd >= 2.62 follows the blocker
// with notices, as a host does (see waitChanges); everything else is blind:
// snapctl without snap-refresh-observe or on 2.57, and REST from a
// confined snap with snapd-control on 2.57 (no notices, no state file).
//
// A blind wait retries the refused request on a grid counted from the
// refusal that began the wait (time 0), in three phases:
//
//	[0, 2 s)    retry 1 at 15 ms (± 5 ms), then every 53 ms (± 5 ms)
//	[2 s, 62 s) every 102 ms (± 5 ms): about the snap command's polling
//	62 s on     each step 1.25 times the last, up to the policy's
//	            MaxConflictInterval (1 s by default)
//
// No 1 s window holds more than 20 of the wait's requests (the one
// refused first included), nor, once the window starts 2 s or more into
// the wait, more than 10: the grid keeps to that by itself (20 steps of
// 53 ms less their jitter span more than a second, and so do the 19 after
// the first retry and the refusal; 10 steps of 102 ms too), and a limiter
// on the real send times makes it a bound whatever the answers' delays: a
// retry that would break it waits until the oldest request of the window
// leaves it. Where the
// blockers can be listed (REST; snapctl with snap-refresh-observe but no
// notices) a wait past its first 2 s lists them instead and follows them
// by reading them at the poll interval (WithPollInterval, 100 ms).
//
// The arithmetic. A blocker that ends at a random moment is seen by the
// next retry: within one step, so about 27 ms after it (p50) in the first
// 2 s and about 51 ms after it up to a minute, at about the load of the
// snap command's polling; within 15 ms for the many service changes that
// end within 15 ms of the refusal. Two retries are never less than 30 ms
// apart. A retry whose pause fell behind (a slow answer) takes the next
// grid point ahead, never two at once. Jitter keeps the retries of
// separate processes from marching in step.
//
// A retry costs snapd about what a read of the change costs (the state
// lock, the conflict check against the changes in progress), and it needs
// no second request to act once the blocker is gone: with reads, the read
// that sees the change ready and the request that follows would both be
// needed, and at the same rate the wait would wake later. The price is
// that a blind wait does not name its blocker (Result.WaitedFor stays
// empty for it) and, where it cannot list, cannot tell a blocker waiting
// for a reboot from a slow one: the call's bounds end it.

// cadence paces the retries of one blind wait.
type cadence struct {
	clock retry.Clock
	cap   time.Duration // the longest step
	start time.Time     // the refusal that began the wait; zero: none yet
	grid  time.Time     // the last retry's grid point
	step  time.Duration // the step after grid
	n     int           // retries so far
	sent  []time.Time   // send times of the wait's requests, the last cadenceFastMax
	rnd   func() float64
}

func newCadence(clock retry.Clock, capStep time.Duration) *cadence {
	if capStep <= 0 {
		capStep = retry.DefaultPolicy().MaxConflictInterval
	}
	return &cadence{clock: clock, cap: max(capStep, cadenceSlowStep), rnd: rand.Float64}
}

// begun reports whether a blind wait is under way, and since when.
func (cd *cadence) begun() (time.Time, bool) { return cd.start, !cd.start.IsZero() }

// reset ends the blind wait: the next refusal begins a new one.
func (cd *cadence) reset() { cd.start, cd.n, cd.sent = time.Time{}, 0, cd.sent[:0] }

// steady reports whether the wait is still within its first cadenceSteady.
func (cd *cadence) steady() bool {
	return cd.start.IsZero() || cd.clock.Now().Sub(cd.start) < cadenceSteady
}

// jitter returns a uniform offset in [-j, j].
func (cd *cadence) jitter(j time.Duration) time.Duration {
	return time.Duration((2*cd.rnd() - 1) * float64(j))
}

// next returns the pause before the next retry, counted from now; sentAt
// is when the request just refused was sent (the first one begins the
// wait).
func (cd *cadence) next(sentAt time.Time) time.Duration {
	now := cd.clock.Now()
	if cd.start.IsZero() {
		cd.start, cd.n = sentAt, 0
	}
	cd.note(sentAt)
	cd.n++
	var at time.Time
	if cd.n == 1 {
		cd.grid, cd.step = cd.start.Add(cadenceFirst), cadenceStep
		at = cd.grid.Add(cd.jitter(cadenceFirstJitter))
	} else {
		for {
			cd.grid = cd.grid.Add(cd.step)
			step := cd.step
			switch into := cd.grid.Sub(cd.start); {
			case into >= cadenceSteady+cadenceSlowFor:
				cd.step = min(time.Duration(float64(cd.step)*cadenceGrowth), cd.cap)
			case into >= cadenceSteady:
				cd.step = cadenceSlowStep
			}
			at = cd.grid.Add(cd.jitter(min(cadenceJitter, step/5)))
			if at.After(now) {
				break
			}
			// Behind (a slow answer): the next grid point ahead.
		}
	}
	return max(cd.admit(at).Sub(now), 0)
}

// note records a request of the wait sent at t (a refused retry, or a
// listing that found no blocker it could follow), keeping the send times
// sorted and the last cadenceFastMax of them.
func (cd *cadence) note(t time.Time) {
	i := len(cd.sent)
	for i > 0 && cd.sent[i-1].After(t) {
		i--
	}
	cd.sent = slices.Insert(cd.sent, i, t)
	if len(cd.sent) > cadenceFastMax {
		cd.sent = cd.sent[len(cd.sent)-cadenceFastMax:]
	}
}

// delay returns how long a request due at t must wait to keep to the
// wait's request budget (see admit).
func (cd *cadence) delay(t time.Time) time.Duration { return cd.admit(t).Sub(t) }

// admit returns the earliest time, at or after at, when one more request
// keeps every window of cadenceWindow within its bound: cadenceFastMax
// requests, or cadenceSlowMax for a window that starts cadenceSteady or
// more into the wait. The windows that matter start at a request already
// sent, less than cadenceWindow before at.
func (cd *cadence) admit(at time.Time) time.Time {
	for moved := true; moved; {
		moved = false
		for i, s := range cd.sent {
			if !at.Before(s.Add(cadenceWindow)) {
				continue // the window from s ends before at
			}
			limit := cadenceFastMax
			if s.Sub(cd.start) >= cadenceSteady {
				limit = cadenceSlowMax
			}
			if n := len(cd.sent) - i + 1; n > limit {
				at, moved = s.Add(cadenceWindow), true
			}
		}
	}
	return at
}
