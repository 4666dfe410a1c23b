package snapsvc

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

func (k *call) waitChange(id string, wo waitOpts) (*snapd.Change, error) {
	chgs, err := k.waitChanges([]string{id}, wo)
	if err != nil {
		return nil, err
	}
	chg := chgs[id]
	if chg == nil {
		return nil, &ChangeError{ID: id, Status: "gone", Err: "snapd no longer knows the change (pruned?)"}
	}
	return chg, changeOutcome(chg)
}

// changeOutcome returns nil for a change that is Done, else a *ChangeError.
func changeOutcome(chg *snapd.Change) error {
	if chg.Status == snapd.StatusDone {
		return nil
	}
	return &ChangeError{ID: chg.ID, Kind: chg.Kind, Summary: chg.Summary, Status: chg.Status, Err: chg.Err}
}

// waitOpts modify waitChanges.
type waitOpts struct {
	// listed says ids were just seen in progress in a listing: a wait
	// that polls (no notices) takes it for its first read and idles
	// first. listedMark, when listedWatched, is the state watch's mark
	// taken before the listing, so a rewrite since wakes that first idle.
	listed        bool
	listedWatched bool
	listedMark    uint64
	// fresh says ids is the operation's own change, just made: a notice
	// with one or two occurrences (spawn, Doing) means it is not ready.
	// answeredAt, when known, is when snapd answered the request that made
	// it, and sentAt when the request was sent: a cursor for the notices
	// (owncursor.go).
	fresh      bool
	sentAt     time.Time
	answeredAt time.Time
	kind       string // the operation's kind (op.key): what its pace is learned for
	// stallOnWait also gives up on a change in Wait (waiting for a reboot
	// or a manual step: it will not become ready by itself), returning a
	// *ChangeError for it.
	stallOnWait bool
	// found says the change was found after the request's answer was
	// lost, not named by snapd: an identical change of someone else's
	// cannot be told from it, so a wait that ends before the change is
	// ready leaves the outcome unknown (see adoptedError).
	found bool
	// since, when not zero, is when the caller began waiting (a blind
	// wait that turned to listing, cadence.go): polling paces itself from
	// then rather than from the wait's own start.
	since time.Time
	// cadence, when not nil, is that blind wait's cadence: the reads keep
	// to its request budget.
	cadence *cadence
	// read, when not nil, is told when each round of reads of the changes
	// is sent (a shared wait: watcher.go).
	read func(time.Time)
}

// waitChanges waits until every change in ids is ready, and returns them
// (nil for a change snapd no longer knows).
//
// Where snapd has notices (>= 2.62) it long-polls the changes'
// change-update notices and reads the changes when one arrives; it reads
// the notices before the changes, so a status change after that read
// repeats its notice later than the cursor and the next long-poll cannot
// miss it. A failing notices call never ends the wait and never keeps the
// changes from being read (the notices are only a wake-up); after
// noticeStrikes failures or instant empty answers the wait polls instead,
// and it never reads the changes more often than the poll interval.
// Without notices it polls each change at the poll interval. Failures to
// reach snapd are retried within the call's bounds; every pause and idle
// of the wait ends at the call's give-up instant (call.go).
//
// read, when not nil, is told the time each round of reads began (for a
// shared wait: a joiner takes only what was read after it joined).
func (k *call) waitChanges(ids []string, wo waitOpts) (map[string]*snapd.Change, error) {
	c := k.c
	w := &changeWait{c: c, k: k}
	ctx := k.ctx
	done := map[string]*snapd.Change{}
	remaining := slices.Clone(ids)
	useNotices := c.view.notices() != noticesNo
	var cursor time.Time // notices up to this time have been seen
	strikes := 0
	// A long-poll may only follow a cursor read before every remaining
	// change was last read successfully (and seen not ready): a change
	// that became ready before the cursor, unseen because its read failed,
	// would otherwise be waited for until the long-poll's timeout.
	needCursor := true
	// clientCursor: the cursor is the client's time of snapd's answer
	// (owncursor.go), good for one long-poll only: after it, the cursor
	// comes from snapd's own notices.
	clientCursor := false
	// readFirst: the change is of a kind that has been instant: read it
	// at once, before any notice.
	readFirst := false
	if cur, d, ok := w.ownCursor(wo, ids); ok && useNotices {
		if d <= ownInstant {
			readFirst = true
		} else {
			cursor, needCursor, w.firstWait, clientCursor = cur, false, d, true
		}
	}
	started := c.clock.Now()
	if !wo.since.IsZero() {
		started = wo.since
	}
	// Where snapd has no notices its state file wakes us (the watch is
	// opened before the first read, so no rewrite after it is missed).
	var sw *stateWatch
	watch := func() {
		if c.state.open() {
			sw = c.state
		}
	}
	if !useNotices {
		watch()
	}
	// A wait that will poll idles before its first read when that read
	// would only show what is known: the changes were just listed in
	// progress, or, when it polls blind (no state watch), the operation's
	// own change was just made (snapd answered once it had made it, so it
	// has not run yet). With the watch, a read at once lets the rewrite
	// that ends the change wake the next (a first idle would be a sleep,
	// and the pause after it would delay the read after that rewrite).
	firstIdle := func() bool { return wo.listed || (wo.fresh && sw == nil) }
	// With the state file watched, an idle waits for a rewrite after
	// mark, taken before every remaining change was last seen not ready
	// (marked); otherwise (the watch opened since, a read failed, the
	// change just made) it sleeps the poll interval.
	var lastRead time.Time
	mark, marked := wo.listedMark, wo.listed && wo.listedWatched
	retrying := false // the last round failed and paused: read at once
	for round := 0; ; round++ {
		// With notices, only the changes whose notice moved are read: a
		// change becomes ready only with a new change-update occurrence.
		toRead := remaining
		if readFirst {
			readFirst = false // read now; notices from the next round on
		} else if useNotices {
			news, misbehaved, err := w.notices(remaining, &cursor, needCursor)
			needCursor = false
			if clientCursor && news == nil {
				// Nothing after the client's time: the change ended
				// before snapd's answer was read, or snapd's clock is
				// behind. Either way the next long-poll takes its cursor
				// from snapd.
				needCursor = true
			}
			clientCursor = false
			switch {
			case err != nil:
				return nil, err
			case c.view.notices() == noticesNo:
				useNotices = false
				watch()
				if firstIdle() && round == 0 {
					continue // idle before the first read
				}
			case news != nil:
				toRead = slices.DeleteFunc(slices.Clone(remaining), func(id string) bool {
					occ, moved := news[id]
					// The operation's own change, just made: with one
					// occurrence (spawn) or two (spawn, Doing) it is not
					// ready yet (snapd records one per status change:
					// overlord/state/change.go notifyStatusChange). Only
					// an abort before it started (Do -> Hold) would be
					// missed until the long-poll's timeout.
					return !moved || (wo.fresh && occ >= 1 && occ <= 2)
				})
				if len(toRead) == 0 {
					continue
				}
			case misbehaved:
				strikes++
				if strikes >= noticeStrikes {
					c.log(ctx).Info("snapd's notices misbehave; polling the changes instead", "changes", remaining)
					useNotices = false
					watch()
				}
				// Whatever the notices did, read the changes no more
				// often than the poll interval.
				if err := w.sleep(c.poll, remaining); err != nil {
					return nil, err
				}
			}
		} else if (round > 0 || firstIdle()) && !retrying {
			if d, ok := w.ownFirstRead(wo, ids, sw != nil, lastRead); ok {
				if err := w.sleep(d, ids); err != nil {
					return nil, err
				}
			} else if err := w.idle(remaining, sw, started, lastRead, mark, marked); err != nil {
				return nil, err
			}
		}
		retrying = false
		if wo.cadence != nil {
			// A wait that follows on from a blind one keeps to its
			// request budget (cadence.go).
			if d := wo.cadence.delay(c.clock.Now()); d > 0 {
				if err := w.sleep(d, ids); err != nil {
					return nil, err
				}
			}
		}
		lastRead = c.clock.Now()
		if wo.read != nil {
			wo.read(lastRead)
		}
		marked = sw != nil
		if marked {
			mark = sw.mark()
		}
		next := slices.DeleteFunc(slices.Clone(remaining), func(id string) bool { return slices.Contains(toRead, id) })
		var failed error
		for _, id := range toRead {
			if wo.cadence != nil {
				wo.cadence.note(c.clock.Now())
			}
			chg, err := c.main.Change(ctx, id)
			k.observe(err)
			if err != nil {
				if errors.Is(err, snapd.ErrNotFound) {
					done[id] = nil
					continue
				}
				failed, marked = err, false
				next = append(next, id)
				continue
			}
			c.view.saw(chg.ID)
			if chg.Ready {
				done[id] = chg
				continue
			}
			if wo.stallOnWait && chg.Status == snapd.StatusWait {
				return nil, &ChangeError{ID: chg.ID, Kind: chg.Kind, Summary: chg.Summary, Status: chg.Status, Err: "waiting"}
			}
			next = append(next, id)
		}
		remaining = next
		if len(remaining) == 0 {
			if wo.fresh && len(ids) == 1 {
				w.noteOwn(wo.kind, done[ids[0]], wo.sentAt, wo.answeredAt)
			}
			return done, nil
		}
		if failed != nil {
			needCursor = true
			if err := w.pause(failed, remaining); err != nil {
				return nil, err
			}
			retrying = true
		}
	}
}

// changeWait is the state of one waitChanges.
type changeWait struct {
	c *Client
	k *call
	// firstWait, when set, bounds the first long-poll (owncursor.go).
	firstWait time.Duration
}

// notices reads (first: at once) or long-polls the change-update notices
// of ids after *cursor and moves the cursor on. news maps each change whose
// notice moved (every notice returned, on a first read) to its
// occurrences; it is nil when the changes must all be read: the notices
// misbehaved (failed, answered an empty long-poll long before its timeout,
// or answered nothing newer than the cursor: misbehaved is then true), or
// the long-poll ran out with nothing new (a safety read). Its error is
// only the context's end: every other failure is a misbehaviour.
func (w *changeWait) notices(ids []string, cursor *time.Time, first bool) (news map[string]int, misbehaved bool, err error) {
	c, ctx := w.c, w.k.ctx
	opts := snapd.NoticesOptions{Types: []string{snapd.NoticeChangeUpdate}, Keys: ids, After: *cursor}
	if !first && !cursor.IsZero() {
		opts.Timeout = noticeWait
		if w.firstWait > 0 {
			opts.Timeout, w.firstWait = w.firstWait, 0
		}
	} else {
		opts.After = time.Time{} // a fresh cursor: every notice of ids
	}
	asked := c.clock.Now()
	ns, err := c.main.Notices(ctx, opts)
	w.k.observe(err)
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
			*cursor = asked
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

// idle waits before the next read of a polling wait: until snapd rewrites
// its state file (sw) or, at the latest, the poll interval.
// With marked, a rewrite since mark (taken before the changes were last
// seen not ready) ends the idle; without, it sleeps the poll interval.
func (w *changeWait) idle(ids []string, sw *stateWatch, started, lastRead time.Time, mark uint64, marked bool) error {
	c, k := w.c, w.k
	if sw == nil || !marked {
		return w.sleep(w.pollInterval(started), ids)
	}
	d := max(c.poll, stateSafety)
	left, bounded := k.left()
	if bounded && left < d {
		d = left // the call's time ends first
	}
	woke, err := sw.waitFrom(k.ctx, d, mark)
	if err != nil {
		if k.ctx.Err() != nil {
			return waitErr(interrupted(k.ctx, k.last), ids)
		}
		// The watch broke (the Client is closing, say): poll.
		k.log.Debug("cannot watch snapd's state file; polling", "error", err)
		return w.sleep(w.pollInterval(started), ids)
	}
	if woke {
		if gap := pollGap - c.clock.Now().Sub(lastRead); gap > 0 {
			return w.sleep(gap, ids)
		}
		return nil
	}
	if bounded && d == left {
		return waitErr(k.exhausted(nil), ids)
	}
	return nil
}

// sleep waits d within the call's bounds (call.sleep); a give-up says
// which changes were being waited for.
func (w *changeWait) sleep(d time.Duration, ids []string) error {
	return waitErr(w.k.sleep(d), ids)
}

// waitErr names the change a wait that ended was waiting for.
func waitErr(err error, ids []string) error {
	var g *gaveUpError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &g):
		return &gaveUpError{reason: g.reason + " waiting for change " + ids[0], last: g.last}
	}
	return fmt.Errorf("waiting for change %s: %w", ids[0], err)
}

// pause decides whether a failed read of a change while waiting is worth
// another try (snapd restarting or unreachable, a garbled answer) and
// pauses if so, within the call's bounds.
func (w *changeWait) pause(err error, ids []string) error {
	if w.k.ctx.Err() != nil {
		return waitErr(interrupted(w.k.ctx, err), ids)
	}
	if !retry.IsRetryable(err) {
		return err
	}
	w.k.log.Debug("cannot read a change while waiting; retrying", "error", err)
	return waitErr(w.k.pause(err), ids)
}
