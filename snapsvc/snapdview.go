package snapsvc

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// snapdView is what a Client has learned about the snapd it talks to, from
// snapd's own answers: whether it serves change notices to this client,
// whether it lets this client list changes, the highest change id it has
// reported, and how its clock reads against the client's. Every operation
// and wait of the Client reads and adds to it; nothing in it is ever a
// bound.
type snapdView struct {
	noticeSupport atomic.Int32 // noticesUnknown, noticesYes or noticesNo
	// noListing: snapd refused to list changes to this client (snapctl
	// without snap-refresh-observe, or on 2.57): it never tries again, and
	// waits it out blind (cadence.go).
	noListing atomic.Bool
	maxID     atomic.Int64 // the highest change id snapd reported
	counted   atomic.Bool  // the client listed snapd's changes at least once
	clock     snapdClock
}

// notice support states.
const (
	noticesUnknown int32 = iota
	noticesYes
	noticesNo
)

// notices returns whether snapd serves change notices to this client
// (noticesYes, noticesNo, or noticesUnknown before it has said).
func (v *snapdView) notices() int32 { return v.noticeSupport.Load() }

// setNotices records what snapd said about its notices.
func (v *snapdView) setNotices(s int32) { v.noticeSupport.Store(s) }

// listingRefused reports whether snapd refused to list changes to this
// client.
func (v *snapdView) listingRefused() bool { return v.noListing.Load() }

// sawChanges notes the ids of changes snapd reported.
func (v *snapdView) sawChanges(chgs ...snapd.Change) {
	v.counted.Store(true)
	for i := range chgs {
		v.saw(chgs[i].ID)
	}
}

// saw notes a change id snapd reported.
func (v *snapdView) saw(id string) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return
	}
	for {
		old := v.maxID.Load()
		if n <= old || v.maxID.CompareAndSwap(old, n) {
			return
		}
	}
}

// sending returns the stamp of a request about to be sent at now: snapd
// numbers its changes in order, so one it had reported before was made
// before the request (matching.go).
func (v *snapdView) sending(now time.Time) sent {
	counted := v.counted.Load()
	return sent{at: now, seen: v.maxID.Load(), counted: counted}
}

// noteListing records that snapd refused to list changes to this client
// (403: snapctl without snap-refresh-observe, or snapd 2.57's snap
// socket), so that its later conflicts go straight to the blind cadence
// instead of paying a refused listing each.
func (v *snapdView) noteListing(err error, mode Mode) {
	if err != nil && mode == ModeSnapctl && isForbidden(err) {
		v.noListing.Store(true)
	}
}

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
