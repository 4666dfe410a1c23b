package snapsvc

import (
	"slices"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// A waker decides when a change wait (changewait.go) reads its changes
// next, and which of them. There are three, and a wait uses the best that
// snapd offers it:
//
//   - noticeWaker: snapd's change-update notices (>= 2.62; on the snap
//     socket with snap-refresh-observe), long-polled: only a change whose
//     notice moved is read. It reads the notices before the changes, so a
//     status change after that read repeats its notice later than the
//     cursor and the next long-poll cannot miss it. It is only a wake-up:
//     a failing notices call never ends the wait nor keeps the changes
//     from being read; refused (404 before 2.62, 403 without access) it
//     hands over to one of the others, and after noticeStrikes failures or
//     instant empty answers too, never reading faster than the poll
//     interval meanwhile.
//   - stateFileWaker: the rewrites of snapd's state file (statefile.go),
//     where it can be watched: every status change of a change rewrites it,
//     so a rewrite since the changes were last seen not ready wakes the
//     next read; a safety read comes every stateSafety.
//   - pollWaker: polling, fast at first (pollInterval), for a confined
//     snap on 2.57 that can watch nothing.
type waker interface {
	// wake blocks until the next round of reads is due and returns the
	// changes to read; or, with next set, hands over to another waker
	// (with toRead nil, the wait asks next at once); or ends the wait
	// with an error. An empty toRead asks for another wake.
	wake(w *changeWait) (toRead []string, next waker, err error)
	// reading is told right before a round of reads.
	reading(w *changeWait)
	// read is told after a round of reads that left changes not ready,
	// and whether every read answered.
	read(w *changeWait, ok bool)
}

// firstWaker picks the wait's waker: notices unless snapd is known to
// offer none, with the first long-poll's cursor from the operation's own
// change where the client can trust it (owntiming.go).
func (w *changeWait) firstWaker() waker {
	if w.c.view.notices() == noticesNo {
		return w.pollingWaker(w.firstIdle())
	}
	n := &noticeWaker{needCursor: true}
	if cur, d, ok := w.ownCursor(w.wo, w.ids); ok {
		if d <= ownInstant {
			n.readFirst = true // a kind that has been instant: read it at once
		} else {
			n.cursor, n.needCursor, n.firstWait, n.clientCursor = cur, false, d, true
		}
	}
	return n
}

// pollingWaker is the waker of a wait that cannot use notices: the state
// file where it can be watched (the watch is opened before the first read,
// so no rewrite after it is missed), else polling. idle says whether it
// waits before its first round of reads.
func (w *changeWait) pollingWaker(idle bool) waker {
	if w.c.state.open() {
		// A listing taken just now (wo.listed) is the first read; its mark
		// was taken before it, so a rewrite since wakes the first idle.
		return &stateFileWaker{sw: w.c.state, idle: idle, mark: w.wo.listedMark, marked: w.lastRead.IsZero() && w.wo.listed && w.wo.listedWatched}
	}
	return &pollWaker{idle: idle}
}

// firstIdle reports whether a wait that polls idles before its first read
// because that read would only show what is known: the changes were just
// listed in progress, or, when nothing can be watched, the operation's own
// change was just made (snapd answered once it had made it, so it has not
// run yet). With the state file watched, a read at once lets the rewrite
// that ends the change wake the next (an idle first would be a sleep, and
// the pause after it would delay the read after that rewrite).
func (w *changeWait) firstIdle() bool {
	return w.wo.listed || (w.wo.fresh && !w.c.state.open())
}

// noticeWaker wakes a wait with snapd's change-update notices.
type noticeWaker struct {
	cursor time.Time // notices up to this time have been seen
	// needCursor: the next call reads the notices at once for a cursor in
	// snapd's time. A long-poll may only follow a cursor read before every
	// remaining change was last read successfully (and seen not ready): a
	// change that became ready before the cursor, unseen because its read
	// failed, would otherwise be waited for until the long-poll's timeout.
	needCursor bool
	// clientCursor: the cursor is the client's time of snapd's answer to
	// the request that made the change (owntiming.go), good for one
	// long-poll only, bounded by firstWait; after it the cursor comes from
	// snapd's own notices.
	clientCursor bool
	firstWait    time.Duration
	// readFirst: the change is of a kind that has been instant: read it at
	// once, before any notice.
	readFirst bool
	strikes   int // misbehaviours so far
	calls     int
}

func (n *noticeWaker) wake(w *changeWait) ([]string, waker, error) {
	n.calls++
	if n.readFirst {
		n.readFirst = false // read now; notices from the next round on
		return w.remaining, nil, nil
	}
	news, misbehaved, err := n.poll(w)
	n.needCursor = false
	if n.clientCursor && news == nil {
		// Nothing after the client's time: the change ended before snapd's
		// answer was read, or snapd's clock is behind. Either way the next
		// long-poll takes its cursor from snapd.
		n.needCursor = true
	}
	n.clientCursor = false
	switch {
	case err != nil:
		return nil, nil, err
	case w.c.view.notices() == noticesNo:
		// Refused: the first call hands over as if notices had never been
		// tried; a later one reads at once, then idles.
		return nil, w.pollingWaker(n.calls == 1 && w.firstIdle()), nil
	case news != nil:
		// Only the changes whose notice moved are read: a change becomes
		// ready only with a new change-update occurrence.
		return slices.DeleteFunc(slices.Clone(w.remaining), func(id string) bool {
			occ, moved := news[id]
			// The operation's own change, just made: with one occurrence
			// (spawn) or two (spawn, Doing) it is not ready yet (snapd
			// records one per status change: overlord/state/change.go
			// notifyStatusChange). Only an abort before it started
			// (Do -> Hold) would be missed until the long-poll's timeout.
			return !moved || (w.wo.fresh && occ >= 1 && occ <= 2)
		}), nil, nil
	case misbehaved:
		n.strikes++
		var next waker
		if n.strikes >= noticeStrikes {
			w.c.log(w.k.ctx).Info("snapd's notices misbehave; polling the changes instead", "changes", w.remaining)
			next = w.pollingWaker(true)
		}
		// Whatever the notices did, read the changes no more often than
		// the poll interval.
		if err := w.sleep(w.c.poll, w.remaining); err != nil {
			return nil, nil, err
		}
		return w.remaining, next, nil
	}
	return w.remaining, nil, nil // the long-poll ran out: a safety read
}

func (n *noticeWaker) reading(*changeWait) {}

func (n *noticeWaker) read(_ *changeWait, ok bool) {
	if !ok {
		n.needCursor = true
	}
}

// poll reads (with needCursor: at once) or long-polls the change-update
// notices of the remaining changes after the cursor and moves the cursor on. news maps each change whose
// notice moved (every notice returned, on a first read) to its
// occurrences; it is nil when the changes must all be read: the notices
// misbehaved (failed, answered an empty long-poll long before its timeout,
// or answered nothing newer than the cursor: misbehaved is then true), or
// the long-poll ran out with nothing new (a safety read). Its error is
// only the context's end: every other failure is a misbehaviour.
func (n *noticeWaker) poll(w *changeWait) (news map[string]int, misbehaved bool, err error) {
	c, ctx := w.c, w.k.ctx
	ids, cursor, first := w.remaining, &n.cursor, n.needCursor
	opts := snapd.NoticesOptions{Types: []string{snapd.NoticeChangeUpdate}, Keys: ids, After: *cursor}
	if !first && !cursor.IsZero() {
		opts.Timeout = noticeWait
		if n.firstWait > 0 {
			opts.Timeout, n.firstWait = n.firstWait, 0
		}
	} else {
		opts.After = time.Time{} // a fresh cursor: every notice of ids
	}
	asked := c.clock.Now()
	ns, err := c.main.Notices(ctx, opts)
	w.k.note(err)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return nil, false, waitErr(interrupted(ctx, w.k.last), ids)
	case snapd.IsNotFound(err) || isForbidden(err):
		// snapd < 2.62 has no notices; on the snap socket they need
		// snap-refresh-observe. Poll the changes instead.
		c.view.setNotices(noticesNo)
		return nil, false, nil
	default:
		c.log(ctx).Debug("reading change notices failed; reading the changes", "error", err)
		return nil, true, nil
	}
	c.view.setNotices(noticesYes)
	news = map[string]int{}
	prev := *cursor
	if opts.Timeout == 0 && len(ns) > 0 {
		// A first read sets the cursor in snapd's own time, whatever it
		// was: the newest notice seen.
		*cursor = time.Time{}
	}
	for _, n := range ns {
		if opts.Timeout == 0 || n.LastRepeated.After(prev) {
			news[n.Key] = n.Occurrences
		}
		if n.LastRepeated.After(*cursor) {
			*cursor = n.LastRepeated
		}
	}
	if opts.Timeout == 0 {
		if len(ns) == 0 && cursor.IsZero() {
			// No notice yet: anything from now on is news.
			*cursor = c.view.clock.wallAt(asked)
		}
		// A first read: every change without a notice must be read too.
		for _, id := range ids {
			if _, ok := news[id]; !ok {
				news[id] = -1 // no notice: unknown
			}
		}
		return news, false, nil
	}
	if len(news) > 0 {
		return news, false, nil
	}
	// Nothing new: fine if snapd held the long-poll for its timeout (then
	// read everything once, in case a notice was lost), a misbehaviour if
	// it answered early (that would spin).
	return nil, c.clock.Now().Sub(asked) < opts.Timeout/2, nil
}

// stateFileWaker wakes a wait at snapd's state file's rewrites.
type stateFileWaker struct {
	sw   *dirWatch
	idle bool // wait before the next round (not after a failed one)
	// mark, when marked, is the watch's mark taken before every remaining
	// change was last seen not ready: a rewrite since wakes the idle.
	// Otherwise (a read failed, the change just made) it sleeps the poll
	// interval.
	mark   uint64
	marked bool
}

func (s *stateFileWaker) wake(w *changeWait) ([]string, waker, error) {
	if s.idle {
		if err := s.wait(w); err != nil {
			return nil, nil, err
		}
	}
	s.idle = true
	return w.remaining, nil, nil
}

func (s *stateFileWaker) reading(*changeWait) { s.mark, s.marked = s.sw.mark(), true }

func (s *stateFileWaker) read(_ *changeWait, ok bool) {
	if !ok {
		s.marked, s.idle = false, false // read again at once, after the pause
	}
}

// wait waits for a rewrite after the mark or, at the latest, the safety
// interval (stateSafety, or the poll interval if longer); without a mark,
// it sleeps the poll interval.
func (s *stateFileWaker) wait(w *changeWait) error {
	c, k, ids := w.c, w.k, w.remaining
	if !s.marked {
		return w.sleep(w.pollInterval(w.started), ids)
	}
	d := max(c.poll, stateSafety)
	left, bounded := k.left()
	if bounded && left < d {
		d = left // the call's time ends first
	}
	woke, err := s.sw.waitFrom(k.ctx, d, s.mark)
	if err != nil {
		if k.ctx.Err() != nil {
			return waitErr(interrupted(k.ctx, k.last), ids)
		}
		// The watch broke (the Client is closing, say): poll.
		k.log.Debug("cannot watch snapd's state file; polling", "error", err)
		return w.sleep(w.pollInterval(w.started), ids)
	}
	if woke {
		if gap := pollGap - c.clock.Now().Sub(w.lastRead); gap > 0 {
			return w.sleep(gap, ids)
		}
		return nil
	}
	if bounded && d == left {
		return waitErr(k.exhausted(nil), ids)
	}
	return nil
}

// pollWaker wakes a wait that can watch nothing at the poll interval.
type pollWaker struct {
	idle bool // wait before the next round (not after a failed one)
}

func (p *pollWaker) wake(w *changeWait) ([]string, waker, error) {
	if p.idle {
		d, ok := w.ownFirstRead(w.wo, w.ids, false, w.lastRead)
		if !ok {
			d = w.pollInterval(w.started)
		}
		if err := w.sleep(d, w.remaining); err != nil {
			return nil, nil, err
		}
	}
	p.idle = true
	return w.remaining, nil, nil
}

func (p *pollWaker) reading(*changeWait) {}

func (p *pollWaker) read(_ *changeWait, ok bool) {
	if !ok {
		p.idle = false // read again at once, after the pause
	}
}

// pollInterval is the pause before the next read of a wait that started
// at started: short at first, when most service changes end, then the
// client's poll interval (and never longer than it).
func (w *changeWait) pollInterval(started time.Time) time.Duration {
	c := w.c
	d := c.poll
	switch since := c.clock.Now().Sub(started); {
	case since < pollFastFor:
		d = min(d, pollFast)
	case since < pollMidFor:
		d = min(d, pollMid)
	}
	return d
}
