package snapsvc

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Waiting for the change an operation just made, where snapd has notices,
// in three requests: the POST, one long-poll that returns when the change
// moves on, one read of the change. The long-poll's cursor is the client's
// time of snapd's answer (snapd records the change's spawn notice before it
// answers), trusted only while the client's own changes show that its clock
// reads snapd's, and bounded by twice the last own change of the same kind
// took, so a change that ended before the answer is found late by at most
// that bound, never missed. docs/own-change-wait.md derives it; timing.go
// has the constants.

// ownTimings is what a Client has learned about the pace of its own
// changes.
type ownTimings struct {
	mu       sync.Mutex
	byKind   map[string]time.Duration // each kind's last duration; 1ns: instant
	order    []string                 // kinds, oldest first
	clockBad atomic.Bool              // the last own change's times did not fit the client's clock
}

// firstPollWait returns the timeout of the first long-poll for an own
// change of kind, and false when the client has nothing to go by.
func (p *ownTimings) firstPollWait(kind string) (time.Duration, bool) {
	d, ok := p.last(kind)
	if !ok {
		return 0, false
	}
	return min(2*d+ownPollMargin, ownPollMax), true
}

// last returns the last duration of an own change of kind.
func (p *ownTimings) last(kind string) (time.Duration, bool) {
	if p.clockBad.Load() {
		return 0, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	d, ok := p.byKind[kind]
	return d, ok
}

// noteOwn records how long an own change of kind took. Where its spawn
// time did not fit the machine's wall clock as the client read it (fits
// false: a client built WithClock, snapd in another time, a clock
// stepped), the answer-time cursor is turned off until a change fits
// again.
func (p *ownTimings) noteOwn(kind string, chg *snapd.Change, fits bool) {
	if chg == nil || chg.ReadyTime == nil {
		return
	}
	p.clockBad.Store(!fits)
	d := chg.ReadyTime.Sub(chg.SpawnTime)
	if d <= 0 {
		d = 1 // known, and instant
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byKind == nil {
		p.byKind = map[string]time.Duration{}
	}
	if _, ok := p.byKind[kind]; !ok {
		p.order = append(p.order, kind)
		if len(p.order) > ownKinds {
			delete(p.byKind, p.order[0])
			p.order = p.order[1:]
		}
	}
	p.byKind[kind] = d
}

// ownCursor returns the cursor and first long-poll timeout of a wait for
// the operation's own change just made (see above), and false when the
// wait must read a cursor first.
func (w *changeWait) ownCursor(wo waitOpts, ids []string) (time.Time, time.Duration, bool) {
	c := w.c
	if !wo.fresh || wo.answeredAt.IsZero() || len(ids) != 1 || c.view.notices() != noticesYes {
		return time.Time{}, 0, false
	}
	d, ok := c.timings.firstPollWait(wo.kind)
	if !ok || c.view.clock.stepped(wo.answeredAt, c.clock.Now()) != 0 {
		return time.Time{}, 0, false // a wall clock that stepped since: read a cursor
	}
	return c.view.clock.wallAt(wo.answeredAt), d, true
}

// ownFirstRead returns how long a wait that polls blind (no notices, no
// state file watched: a confined snap on snapd 2.57) idles before its
// first read of the operation's own change: about as long as the client's
// last own change of its kind took (plus ownPollMargin), where the poll
// schedule would read it every 20 ms from the start. A change that takes
// as long as the last one is then read once, ready (three requests in all,
// where a 70 ms restart took five); one that is not ready yet is polled
// as before; one that ended sooner is found up to the difference later.
// It returns false for any other wait.
func (w *changeWait) ownFirstRead(wo waitOpts, ids []string, watched bool, lastRead time.Time) (time.Duration, bool) {
	c := w.c
	if !wo.fresh || watched || !lastRead.IsZero() || len(ids) != 1 {
		return 0, false
	}
	d, ok := c.timings.last(wo.kind)
	if !ok {
		return 0, false
	}
	return min(d+ownPollMargin, ownPollMax), true
}

// noteOwn records what an own change of kind, made by a request sent at
// sentAt and answered at answeredAt (the client's clock), says: how long
// such a change takes, and how snapd's clock reads.
func (w *changeWait) noteOwn(kind string, chg *snapd.Change, sentAt, answeredAt time.Time) {
	c := w.c
	if chg == nil || chg.ReadyTime == nil || sentAt.IsZero() || answeredAt.IsZero() {
		return
	}
	c.view.clock.noteOffset(chg.SpawnTime, sentAt, answeredAt)
	c.timings.noteOwn(kind, chg, c.view.clock.onMachineClock(chg.SpawnTime, sentAt, answeredAt))
}
