package snapsvc

import (
	"sync"
	"time"
)

// snapdClock is how snapd's clock reads against the client's (snapd's
// minus the client's), as the client's own changes bound it: each was
// spawned, on snapd's clock, between its request's send and snapd's
// answer, on the client's. Matching a change to the request that made it
// (matching.go) reads the request's send time on snapd's clock through
// it. Both bounds are 0 (one clock, as on one machine) until an own change
// says better.
type snapdClock struct {
	mu     sync.Mutex
	known  bool
	lo, hi time.Duration
}

// snapdTime returns the earliest snapd's clock may read when the client's
// reads t: t itself until an own change says better. (Each own change
// bounds the offset from below by its spawn time less its answer time:
// snapd stamped it before the client read the answer.)
func (p *snapdClock) snapdTime(t time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return t.Add(p.lo)
}

// snapdTimeLate returns the latest snapd's clock may read when the
// client's reads t.
func (p *snapdClock) snapdTimeLate(t time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return t.Add(p.hi)
}

// noteOffset narrows what is known of snapd's clock with a change spawned
// at spawn (snapd's clock) by a request sent at sentAt and answered at
// answeredAt (the client's). Bounds that no longer meet (a clock stepped)
// start afresh.
func (p *snapdClock) noteOffset(spawn, sentAt, answeredAt time.Time) {
	lo, hi := spawn.Sub(answeredAt), spawn.Sub(sentAt)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known && lo <= p.hi+clockSlack && hi >= p.lo-clockSlack {
		p.lo, p.hi = max(p.lo, lo), min(p.hi, hi)
		if p.lo > p.hi {
			p.lo, p.hi = p.hi, p.lo
		}
		return
	}
	p.known, p.lo, p.hi = true, lo, hi
}
