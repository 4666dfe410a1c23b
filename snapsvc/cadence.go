package snapsvc

import (
	"math/rand/v2"
	"slices"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// Blind waits: how a conflict is waited out when the end of the blocking
// change cannot be observed (docs/blind-waits.md says what each snapd lets
// a snap see, and derives the numbers). A wait is blind when snapd serves
// this client no change notices and its state file is not watched, or when
// the blocker cannot even be listed: snapctl without snap-refresh-observe
// or on snapd 2.57, and REST from a confined snap on 2.57.
//
// A blind wait retries the refused request on a jittered grid counted from
// the refusal that began it: at 15 ms, then every 53 ms for 2 s, every
// 102 ms until a minute, then growing to the policy's MaxConflictInterval
// (timing.go). No 1 s window holds more than 20 of the wait's requests, nor
// 10 once the window starts 2 s or more into the wait: the grid keeps to
// that by itself, and admit makes it a bound whatever the answers' delays.
// Where the blockers can be listed, a wait past its first 2 s lists them
// and follows them instead. A retry costs snapd about what a read of the
// change costs, and needs no second request once the blocker is gone; the
// price is that a blind wait does not name its blocker.

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
