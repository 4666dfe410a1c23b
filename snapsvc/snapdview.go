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

// snapdClock relates the client's clock to snapd's stamps, in one place.
// snapd stamps its changes with the machine's wall clock when it makes
// them; the client decides by its monotonic clock. Every comparison of a
// stamp with a moment the client knows (a request's send, its answer) is
// a window here, read through the machine's wall clock at that moment and
// widened by any step of the wall clock against the monotonic one since
// (an NTP step, a VM resumed): a change made while the wall clock stepped
// back 400 ms was stamped before its request's send, and taken for
// someone else's, so the request was sent again (schedule seed 299).
// Ordering between stamps goes by snapd's change ids, never by the stamps.
//
// A snapd whose clock is not the machine's (a fake with an injected one)
// is learned from the client's own changes: each was spawned, on snapd's
// clock, between its request's send and snapd's answer. Both bounds of
// the offset are 0 (one clock) until an own change says better.
type snapdClock struct {
	mu     sync.Mutex
	known  bool
	lo, hi time.Duration // snapd's clock minus the machine's wall clock

	// wall is the machine's wall clock at a reading of the client's (a
	// test's clock steps it apart from the monotonic one); nil: the
	// reading's own.
	wall func(time.Time) time.Time
}

// wallAt returns the machine's wall clock at the client's reading t.
func (p *snapdClock) wallAt(t time.Time) time.Time {
	if p.wall != nil {
		return p.wall(t)
	}
	return t.Round(0)
}

// stepped returns how far the machine's wall clock stepped against the
// monotonic one between the client's readings a and b (0 within
// clockSlack: a slewing clock, a reading's jitter). Readings of a test's
// clock without a monotonic part never step.
func (p *snapdClock) stepped(a, b time.Time) time.Duration {
	d := p.wallAt(b).Sub(p.wallAt(a)) - b.Sub(a)
	if d.Abs() <= clockSlack {
		return 0
	}
	return d
}

// spawnWindow returns the stamps on snapd's clock between which a change
// made for a request sent at sentAt was spawned, read at now: from, the
// earliest; sure, from where snapd's clock had certainly passed the send
// (a change stamped at or after it came after the request); to, the
// latest, when the request was answered at answeredAt (zero: never; to
// is then zero). A step of the wall clock between the send and the answer
// (now, unanswered) widens the window by the step.
func (p *snapdClock) spawnWindow(sentAt, answeredAt, now time.Time) (from, sure, to time.Time) {
	p.mu.Lock()
	lo, hi := p.lo, p.hi
	p.mu.Unlock()
	end := answeredAt
	if end.IsZero() {
		end = now
	}
	step := p.stepped(sentAt, end)
	send := p.wallAt(sentAt)
	from, sure = send.Add(lo+min(0, step)), send.Add(hi)
	if !answeredAt.IsZero() {
		to = p.wallAt(answeredAt).Add(hi + max(0, -step))
	}
	return from, sure, to
}

// noteOffset narrows what is known of snapd's clock with a change spawned
// at spawn (snapd's clock) by a request sent at sentAt and answered at
// answeredAt (the client's). Bounds that no longer meet (snapd's clock
// stepped apart from the machine's) start afresh; a request across which
// the machine's wall clock stepped says nothing.
func (p *snapdClock) noteOffset(spawn, sentAt, answeredAt time.Time) {
	if p.stepped(sentAt, answeredAt) != 0 {
		return
	}
	lo, hi := spawn.Sub(p.wallAt(answeredAt)), spawn.Sub(p.wallAt(sentAt))
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

// onMachineClock reports whether a change spawned at spawn by a request
// sent at sentAt and answered at answeredAt was stamped by the machine's
// wall clock as the client read it, which did not step between: a cursor
// of the client's then reads snapd's notices (owntiming.go).
func (p *snapdClock) onMachineClock(spawn, sentAt, answeredAt time.Time) bool {
	if p.stepped(sentAt, answeredAt) != 0 {
		return false
	}
	return !spawn.Before(p.wallAt(sentAt).Add(-clockSlack)) && !spawn.After(p.wallAt(answeredAt).Add(clockSlack))
}
