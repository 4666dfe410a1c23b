package snapsvc

import (
	"sync/atomic"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Waiting for the change an operation just made, where snapd has notices
// (>= 2.62), in three requests: the POST, one long-poll that returns when
// the change moves on, one read of the change.
//
// A notices long-poll needs a cursor: `after` is a time, and snapd
// answers the notices whose last-repeated is strictly after it
// (daemon/api_notices.go getNotices: parseOptionalTime(query "after"),
// state.NoticeFilter.After). No separate request is needed to get one:
// the time snapsvc got snapd's answer to the POST (answeredAt, on a clock
// that reads snapd's, as findOpChange already requires) is after the
// change's spawn notice (snapd records it when it makes the change,
// before it answers: overlord/state/change.go addNotice on the first
// status), so a long-poll after it skips the spawn and wakes at the next
// status change (Doing -> Done). snapd's answer carries no time of its own
// (daemon/response.go sets no such header; the Date header has whole
// seconds).
//
// The risk is a change that ended before answeredAt: its last notice is
// not after the cursor and the long-poll would sleep through its end. So
// the first long-poll is bounded by firstPollWait: twice the time this
// client's last own change took (snapd's spawn-time to ready-time), plus
// ownPollMargin, at most ownPollMax. A change that ended that early is
// read when it runs out: found late by at most that bound, never missed,
// still in three requests. A change that takes more than twice the last
// one costs two more requests (a read that finds it running, and a
// long-poll from the same cursor). A change whose Doing notice comes after
// answeredAt wakes the long-poll early: its two occurrences (spawn,
// Doing) say it is not ready, and a second long-poll follows (four
// requests). A client's first change, with nothing to go by, takes the
// cursor from a first read of the notices (four requests).
const (
	ownPollMargin = 5 * time.Millisecond
	ownPollMax    = 2 * time.Second
)

// paceState is what a Client has learned about the pace of its own
// changes.
type paceState struct {
	lastOwn atomic.Int64 // the last own change's duration (ns); 0: none yet
}

// firstPollWait returns the timeout of the first long-poll for the
// operation's own change, and false when the client has no change of its
// own to go by.
func (p *paceState) firstPollWait() (time.Duration, bool) {
	d := time.Duration(p.lastOwn.Load())
	if d <= 0 {
		return 0, false
	}
	return min(2*d+ownPollMargin, ownPollMax), true
}

// clockSlack and answerMax bound where the spawn time of a change made by
// a request answered at answeredAt (client clock) may lie for the two
// clocks to count as one: snapd makes the change before it answers.
const (
	clockSlack = 5 * time.Millisecond
	answerMax  = 10 * time.Second
)

// noteOwn records how long an own change took, answered at answeredAt.
// Where the change's spawn time says snapd's clock is not the client's
// (a client built WithClock, snapd in another time), it forgets instead:
// a cursor from the client's clock would mean nothing to snapd.
func (p *paceState) noteOwn(chg *snapd.Change, answeredAt time.Time) {
	if chg == nil || chg.ReadyTime == nil {
		return
	}
	if answeredAt.IsZero() || chg.SpawnTime.After(answeredAt.Add(clockSlack)) || chg.SpawnTime.Before(answeredAt.Add(-answerMax)) {
		p.lastOwn.Store(0)
		return
	}
	if d := chg.ReadyTime.Sub(chg.SpawnTime); d > 0 {
		p.lastOwn.Store(int64(d))
	} else {
		p.lastOwn.Store(1) // known, and instant
	}
}

// ownCursor returns the cursor and first long-poll timeout of a wait for
// the operation's own change just made (see above), and false when the
// wait must read a cursor first.
func (c *Client) ownCursor(wo waitOpts, ids []string) (time.Time, time.Duration, bool) {
	if !wo.fresh || wo.answeredAt.IsZero() || len(ids) != 1 || c.notices.Load() != noticesYes {
		return time.Time{}, 0, false
	}
	d, ok := c.pace.firstPollWait()
	if !ok {
		return time.Time{}, 0, false
	}
	return wo.answeredAt, d, true
}

// ownFirstRead returns how long a wait that polls blind (no notices, no
// state file watched: a confined snap on snapd 2.57) idles before its
// first read of the operation's own change: about as long as the client's
// last own change took (plus ownPollMargin), where the poll schedule
// would read it every 20 ms from the start. A change that takes as long
// as the last one is then read once, ready (three requests in all, where
// a 70 ms restart took five); one that is not ready yet is polled as
// before; one that ended sooner is found up to the difference later. It
// returns false for any other wait.
func (c *Client) ownFirstRead(wo waitOpts, ids []string, watched bool, lastRead time.Time) (time.Duration, bool) {
	if !wo.fresh || watched || !lastRead.IsZero() || len(ids) != 1 {
		return 0, false
	}
	d := time.Duration(c.pace.lastOwn.Load())
	if d <= 0 {
		return 0, false
	}
	return min(d+ownPollMargin, ownPollMax), true
}
