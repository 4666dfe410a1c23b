package snapsvc

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

func waitChange(k *call, id string, wo waitOpts) (*snapd.Change, error) {
	chgs, err := waitChanges(k, []string{id}, wo)
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
	// (owntiming.go).
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
	// is sent (a shared wait: processwait.go).
	read func(time.Time)
}

// waitChanges waits until every change in ids is ready, and returns them
// (nil for a change snapd no longer knows).
//
// It is one loop: a waker (wakers.go) says when to read the changes next
// and which of them; the wait reads them, keeps those not ready, and asks
// again. The waker is chosen by what snapd offers: its change notices
// (>= 2.62, long-polled), else the rewrites of its state file, else
// polling; a notices waker that snapd refuses, or that misbehaves, hands
// over to one of the others. A read that failed for a reason that may pass
// (snapd away or restarting, a garbled answer) is asked again within the
// call's bounds (call.go); one the retry rule calls final ends the wait.
// Every pause and idle ends at the call's give-up instant.
func waitChanges(k *call, ids []string, wo waitOpts) (map[string]*snapd.Change, error) {
	w := &changeWait{c: k.c, k: k, wo: wo, ids: ids, remaining: slices.Clone(ids), done: map[string]*snapd.Change{}, started: k.c.clock.Now()}
	if !wo.since.IsZero() {
		w.started = wo.since
	}
	wk := w.firstWaker()
	for {
		toRead, next, err := wk.wake(w)
		if err != nil {
			return nil, err
		}
		if next != nil {
			wk = next
			if toRead == nil {
				continue // the new waker decides
			}
		}
		if len(toRead) == 0 {
			continue
		}
		if err := w.keepCadence(); err != nil {
			return nil, err
		}
		wk.reading(w)
		failed, err := w.read(toRead)
		if err != nil {
			return nil, err
		}
		if len(w.remaining) == 0 {
			if wo.fresh && len(ids) == 1 {
				w.noteOwn(wo.kind, w.done[ids[0]], wo.sentAt, wo.answeredAt)
			}
			return w.done, nil
		}
		wk.read(w, failed == nil)
		if failed != nil {
			if err := w.pause(failed, w.remaining); err != nil {
				return nil, err
			}
		}
	}
}

// changeWait is the state of one waitChanges.
type changeWait struct {
	c         *Client
	k         *call
	wo        waitOpts
	ids       []string
	remaining []string // not seen ready yet
	done      map[string]*snapd.Change
	started   time.Time // the wait's start (or wo.since): polling ramps up from it
	lastRead  time.Time // when the last round of reads began (zero: none yet)
}

// keepCadence keeps a wait that follows on from a blind one (cadence.go)
// to that wait's request budget.
func (w *changeWait) keepCadence() error {
	if w.wo.cadence == nil {
		return nil
	}
	if d := w.wo.cadence.delay(w.c.clock.Now()); d > 0 {
		return w.sleep(d, w.ids)
	}
	return nil
}

// read reads the changes of toRead: those ready (or gone) move to done,
// the rest stay remaining. It returns the last failure to read one (they
// are read again in a later round), and an error that ends the wait: a
// change in Wait when wo.stallOnWait asks for it.
func (w *changeWait) read(toRead []string) (failed error, err error) {
	c, k := w.c, w.k
	w.lastRead = c.clock.Now()
	if w.wo.read != nil {
		w.wo.read(w.lastRead)
	}
	next := slices.DeleteFunc(slices.Clone(w.remaining), func(id string) bool { return slices.Contains(toRead, id) })
	for _, id := range toRead {
		if w.wo.cadence != nil {
			w.wo.cadence.note(c.clock.Now())
		}
		chg, rerr := c.main.Change(k.ctx, id)
		k.note(rerr)
		if rerr != nil {
			if errors.Is(rerr, snapd.ErrNotFound) {
				w.done[id] = nil
				continue
			}
			failed = rerr
			next = append(next, id)
			continue
		}
		c.view.saw(chg.ID)
		if chg.Ready {
			w.done[id] = chg
			continue
		}
		if w.wo.stallOnWait && chg.Status == snapd.StatusWait {
			return nil, &ChangeError{ID: chg.ID, Kind: chg.Kind, Summary: chg.Summary, Status: chg.Status, Err: "waiting"}
		}
		next = append(next, id)
	}
	w.remaining = next
	return failed, nil
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
	if nextStep(reading, err) != askAgain {
		return err
	}
	w.k.log.Debug("cannot read a change while waiting; retrying", "error", err)
	return waitErr(w.k.pause(err), ids)
}
