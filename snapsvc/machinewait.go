package snapsvc

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/snapsvc/snapsvc/internal/flock"
	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// The machine's wait (share.go says the rule). The operation refused first
// makes the snap's wait record before it lets go of the snap's lock, and
// waits the blocker out as it would alone (conflict.go), publishing there
// what it sees; the others find it before they send (busyElsewhere), or
// on their own refusal, and follow it.

// machineFacts is what a snap's watcher publishes, times on the machine's
// monotonic clock of the boot its record says.
type machineFacts struct {
	// Busy is when the watcher last met the snap busy (a refusal).
	Busy int64 `json:"busy"`
	// Free is when the watcher saw a request of its own go through after
	// waiting: the snap was free then, as far as it could tell.
	Free int64 `json:"free,omitempty"`
	// Blockers are the changes the watcher waits for, where it could
	// list them.
	Blockers []string `json:"blockers,omitempty"`
	// Kind, AllSnaps and Message are the last conflict's, as snapd said
	// it (retry.ConflictError).
	Kind     string `json:"kind,omitempty"`
	AllSnaps bool   `json:"all-snaps,omitempty"`
	Message  string `json:"message,omitempty"`
	// DownSince is when snapd became unreachable to the watcher (0: it
	// answers); DownErr and DownSocket say how.
	DownSince  int64  `json:"down-since,omitempty"`
	DownErr    string `json:"down-error,omitempty"`
	DownSocket string `json:"down-socket,omitempty"`
}

// busy reports whether the facts say the snap is busy: a refusal seen
// after the last time it was seen free.
func (f *machineFacts) busy() bool { return f.Busy > f.Free }

// freeSince reports whether the facts say the snap was free at joined or
// later (the machine's clock). A time ahead of the machine's clock cannot
// be this boot's, and says nothing.
func (f *machineFacts) freeSince(joined int64) bool {
	return f.Free >= joined && f.Free <= machineNow()
}

// conflict is the conflict the facts describe, for a follower's errors
// and events.
func (f *machineFacts) conflict(snap string) *retry.ConflictError {
	ce := &retry.ConflictError{Snap: snap, ChangeKind: f.Kind, AllSnaps: f.AllSnaps, Message: f.Message}
	if ce.Message == "" {
		ce.Message = "snap " + snap + " is busy (seen by another process of this machine)"
	}
	if len(f.Blockers) > 0 {
		ce.ChangeID = f.Blockers[0]
	}
	return ce
}

// unreachable returns the watcher's view of snapd's reachability: since
// when it has been unreachable (zero: it answers) and the last failure.
func (f *machineFacts) unreachable() (time.Time, error) {
	if f.DownSince == 0 {
		return time.Time{}, nil
	}
	return machineTime(f.DownSince), &snapd.ConnectionError{Socket: f.DownSocket, Err: errors.New(f.DownErr)}
}

// factsOf returns the facts of a wait record's frame; none (ok false)
// where it has none.
func factsOf(fr recordFrame, ok bool) (f machineFacts) {
	if ok {
		fr.body(&f)
	}
	return f
}

// machine is a Client's part in what the processes of a machine share
// through the lock directories: the snaps' locks (lockdir.go), one
// watcher per snap (this file) and identical restarts merged
// (machineflight.go).
type machine struct {
	dirs *lockDirs
	on   bool // the Client takes part in the waits and flights (share.go)
}

// newMachine is the part of a Client with lock directories dirs, built in
// hook (""), on the real clock or not (a Client on a clock of its own
// takes no part).
func newMachine(dirs *lockDirs, hook string, realClock bool) machine {
	return machine{dirs: dirs, on: !dirs.none() && hook == "" && realClock}
}

// shares reports whether operation o shares the machine's waits and
// flights: one snap's, from a Client that takes part.
func (m machine) shares(o request) bool { return m.on && len(o.t.snaps) == 1 }

// close ends the lock directories' watches (Client.Close).
func (m machine) close() { m.dirs.close() }

// enterRecord makes the record at path (snap's) this process's, or finds
// the one a peer holds, under the snap's peers lock: with no record there,
// or one let go of (its holder ended or died) or of another boot, it makes
// its own, its first body from body (given the predecessor's frame, if any
// of this boot); with one held, it opens it (whether its holder still
// beats is its reader's to judge, over time). It runs in the background
// (bg), bounded by ctx: the files it makes and removes wait for the file
// system's journal, tens of milliseconds on a disk busy with fsyncs, and
// the call must not wait past its bound for them. Should ctx end first,
// what it entered late is let go of there.
func (m machine) enterRecord(ctx context.Context, bg *background, snap, path string, body func(prev recordFrame, ok bool) any) (*heldRecord, *peerRecord, error) {
	type entered struct {
		own  *heldRecord
		peer *peerRecord
		err  error
	}
	peers := m.dirs.path(snap, peersSuffix)
	done := make(chan entered) // unbuffered: handed over, or let go of once abandoned
	abandoned := make(chan struct{})
	bg.run(func() {
		own, peer, err := m.enterRecordNow(ctx, peers, path, body)
		select {
		case done <- entered{own, peer, err}:
		case <-abandoned:
			switch {
			case own != nil:
				own.end(bg, peers, nil, true)
			case peer != nil:
				peer.close()
			}
		}
	})
	select {
	case e := <-done:
		return e.own, e.peer, e.err
	case <-ctx.Done():
		close(abandoned)
		return nil, nil, ctx.Err()
	}
}

// enterRecordNow is enterRecord's work, peers the snap's peers lock.
func (m machine) enterRecordNow(ctx context.Context, peers, path string, body func(prev recordFrame, ok bool) any) (*heldRecord, *peerRecord, error) {
	l, err := flock.Acquire(ctx, peers)
	if err != nil {
		return nil, nil, err
	}
	defer l.Unlock()
	var prev recordFrame
	var prevOK bool
	p, err := openPeer(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, nil, err
	default:
		f, ok, st := p.look()
		if st != peerGone {
			return nil, p, nil
		}
		prev, prevOK = f, ok
		_, err := flock.RemoveIfSame(path, p.h)
		p.close()
		if err != nil {
			return nil, nil, err
		}
	}
	own, err := createRecord(path, body(prev, prevOK))
	return own, nil, err
}

// machineWatcher is the snap's wait record, held by the operation that
// watches the snap for the machine, and the facts it publishes.
type machineWatcher struct {
	rec   *heldRecord
	peers string // the snap's peers lock
	facts machineFacts
	seq   uint64 // facts published so far (the operation's goroutine)

	wmu     sync.Mutex  // one write at a time, in the background
	written uint64      // the latest seq written
	ended   atomic.Bool // the watcher ended: no write starts (set without wmu: a write may be stalled)
}

// testHookFactsWrite is called before each write of a watcher's facts
// (export_test.go: a file system that stalls).
var testHookFactsWrite = func() {}

// publish writes the watcher's facts as they are now, in the background
// (bg): a write may wait for the file system, and the operation must not
// wait past its bound for it. Writes run one at a time and a write older
// than one already made is skipped, so the record ends with the latest
// facts; none starts once the watcher ended.
func (w *machineWatcher) publish(bg *background, log *slog.Logger) {
	w.seq++
	seq, facts := w.seq, w.facts
	facts.Blockers = append([]string(nil), facts.Blockers...)
	work := func(context.Context) {
		w.wmu.Lock()
		defer w.wmu.Unlock()
		if seq <= w.written || w.ended.Load() {
			return // a later write came first, or the watcher ended
		}
		w.written = seq
		testHookFactsWrite()
		if err := w.rec.publish(facts); err != nil {
			log.Debug("cannot publish what this process sees of the snap", "error", err)
		}
	}
	if !bg.do(interruptGrace, work) {
		work(context.Background())
	}
}

// end ends the watcher and lets go of its record: at once where it has
// nothing more to say (so that the next operation of this process finds it
// gone); with free (its own request went through), once its last facts,
// saying the snap is free, are written, the call waiting for that until
// ctx ends (the rest in the background, bg: a write may wait for the file
// system).
func (w *machineWatcher) end(ctx context.Context, bg *background, free bool) {
	w.ended.Store(true)
	if !free {
		w.rec.end(bg, w.peers, nil, true)
		return
	}
	final := w.facts
	bg.doAwaited(ctx, interruptGrace, func(context.Context) {
		w.wmu.Lock()
		defer w.wmu.Unlock()
		testHookFactsWrite()
		w.rec.end(bg, w.peers, final, true)
	})
}

// deposed reports whether another process took the watcher's place.
func (w *machineWatcher) deposed() bool { return w.rec.isDeposed() }

// ---- the operation's side (operation.go's act loop and conflict.go's
// blockerWait call these) ----

// watchOrFollow decides, for an operation whose request snapd refused
// with ce, whether it watches the snap for the machine (false: it waits
// the conflict out itself, publishing what it sees) or follows another
// process's watcher (true: from joined, on the machine's clock).
func (op *operation) watchOrFollow(ce *retry.ConflictError) (joined int64, follow bool) {
	joined = machineNow() // before the record is read: a snap seen free since counts
	if !op.c.machine.shares(op.o) {
		return 0, false
	}
	if op.watcher != nil && op.watcher.deposed() {
		op.stopWatching() // another process took its place: follow it
	}
	busy := func(f *machineFacts) {
		f.Busy, f.Blockers = machineNow(), nil
		f.Kind, f.AllSnaps, f.Message = ce.ChangeKind, ce.AllSnaps, ce.Message
	}
	if op.watcher != nil {
		busy(&op.watcher.facts)
		op.publish()
		return 0, false
	}
	// The record says busy before the snap's lock is let go of: an
	// operation of another process that takes it next finds it, and
	// follows rather than send a request bound to be refused.
	if op.enterWait(func(f *machineFacts) { busy(f) }) {
		return joined, true
	}
	return 0, false
}

// enterWait makes the operation the machine's watcher of its snap, its
// first facts set by init (those of a predecessor of this boot kept: Busy
// and Free), or finds the watcher another process is; it reports true,
// with op.followed set, for the latter. Where the lock directory fails it
// (or the call ends first) the operation waits on its own: false.
func (op *operation) enterWait(init func(*machineFacts)) (follow bool) {
	c, k := op.c, op.k
	snap := op.o.t.snaps[0]
	var facts machineFacts
	own, peer, err := c.machine.enterRecord(k.ctx, c.bg, snap, c.machine.dirs.path(snap, waitSuffix), func(prev recordFrame, ok bool) any {
		f := factsOf(prev, ok)
		facts = machineFacts{Busy: f.Busy, Free: f.Free}
		init(&facts)
		return facts
	})
	switch {
	case err != nil:
		k.log.Debug("cannot share the wait with the machine's other processes", "error", err)
		return false
	case peer != nil:
		op.followed = peer
		return true
	}
	op.startWatching(&machineWatcher{rec: own, peers: c.machine.dirs.path(snap, peersSuffix), facts: facts})
	k.log.Debug(watchingNote) // the operation's logger names the snap
	return false
}

// watchingNote is logged once an operation became the machine's watcher
// of its snap, its first facts written.
const watchingNote = "watching the snap for the machine's processes"

// startWatching makes the operation the machine's watcher of its snap.
// What its call learns of snapd's reachability is published too.
func (op *operation) startWatching(w *machineWatcher) {
	op.watcher = w
	op.k.onNote = func() {
		since, down := op.k.rt.unreachableSince()
		f := &op.watcher.facts
		switch {
		case !down && f.DownSince == 0:
			return
		case !down:
			f.DownSince, f.DownErr, f.DownSocket = 0, "", ""
		case f.DownSince != 0:
			return // the run already published
		default:
			f.DownSince = machineClock(since)
			if op.k.last != nil {
				f.DownErr = op.k.last.Error()
			}
			if ce, ok := asConnectionError(op.k.last); ok {
				f.DownSocket = ce.Socket
			}
		}
		op.publish()
	}
}

// publishBlockers publishes the blockers the watcher follows.
func (op *operation) publishBlockers(ids []string) {
	if op.watcher != nil && len(ids) > 0 {
		op.watcher.facts.Blockers = ids
		op.publish()
	}
}

// publish writes the watcher's facts, in the background; a failure
// leaves the followers to their bounds and to taking over, and is only
// logged.
func (op *operation) publish() { op.watcher.publish(op.c.bg, op.k.log) }

// stopWatching ends the operation's watching, once it is over (before it
// lets go of the snap's file lock): if a request of its own went through,
// the snap is free for the followers to try theirs.
func (op *operation) stopWatching() {
	if op.followed != nil {
		op.followed.close()
		op.followed = nil
	}
	if op.watcher == nil {
		return
	}
	op.k.onNote = nil
	free := op.res.ChangeID != "" || op.res.Status != "" || op.res.Queued
	if free {
		op.watcher.facts.Free = machineNow()
		op.watcher.facts.Blockers = nil
	}
	op.watcher.end(op.k.ctx, op.c.bg, free)
	op.watcher = nil
}

// busyElsewhere reports, before an attempt, whether another process of the
// machine watches the snap busy, and the conflict it met: the operation
// then follows it (op.followed) rather than send a request bound to be
// refused. Where the record says busy but its watcher is gone (its
// operation gave up, or it died), the operation becomes the watcher and
// sends.
func (op *operation) busyElsewhere() (ce *retry.ConflictError, joined int64, busy bool) {
	c := op.c
	if op.watcher != nil || !c.machine.shares(op.o) {
		return nil, 0, false
	}
	snap := op.o.t.snaps[0]
	joined = machineNow() // before the record is read: a snap seen free since counts
	p, err := openPeer(c.machine.dirs.path(snap, waitSuffix))
	if err != nil {
		return nil, 0, false // none (or none to read): nobody watches
	}
	fr, ok, st := p.look()
	f := factsOf(fr, ok)
	switch {
	case !f.busy():
		p.close()
		return nil, 0, false
	case st == peerGone:
		// Busy as far as anyone knows, and nobody watches: watch, and
		// send (a watcher of another process may be found instead).
		p.close()
		if !op.enterWait(func(*machineFacts) {}) {
			return nil, 0, false
		}
		fr, ok, _ = op.followed.look()
		f = factsOf(fr, ok)
	default:
		op.followed = p
	}
	return f.conflict(snap), joined, true
}

// follow follows op.followed until it says the snap was free as of joined
// (the machine's clock) or later, sending nothing, without the snap's file
// lock: tryFresh then; tryAgain once the operation took the place of a
// watcher gone or silent; or the call's end.
func (op *operation) follow(ce *retry.ConflictError, joined int64) (next, error) {
	var then next
	err := op.withoutFileLocks(func() (err error) {
		then, err = op.followFacts(ce, joined)
		return err
	})
	if op.followed != nil {
		op.followed.close()
		op.followed = nil
	}
	return then, err
}

// followFacts is follow's wait.
func (op *operation) followFacts(ce *retry.ConflictError, joined int64) (next, error) {
	c, k := op.c, op.k
	snap := op.o.t.snaps[0]
	fr, ok, _ := op.followed.look()
	f := factsOf(fr, ok)
	ev := k.event(EventConflict)
	ev.Blockers, ev.Err = f.Blockers, ce
	k.last = ce
	if !op.reportConflict(ev) {
		return 0, interrupted(k.ctx, ce)
	}
	k.log.Info("conflict; another process of this machine waits it out: following what it sees", "watcher", fr.PID, "changes", f.Blockers, "kind", ce.ChangeKind, "attempt", op.res.Attempts)
	w := c.machine.dirs.watch(snap)
	for {
		var mark uint64
		watched := w.open()
		if watched {
			mark = w.mark()
		}
		fr, ok, st := op.followed.look()
		f := factsOf(fr, ok)
		op.res.WaitedFor = appendNew(op.res.WaitedFor, f.Blockers...)
		if f.freeSince(joined) {
			k.log.Debug("the machine's watcher saw the snap free; trying again", "watcher", fr.PID)
			op.held = nil
			return tryFresh, nil
		}
		// The watcher's view of snapd's reachability, this call's bounds.
		since, downErr := f.unreachable()
		k.noteSince(downErr, since)
		if left, ok := k.left(); ok && left <= 0 {
			if err := k.exhausted(ce); err != nil {
				return 0, err
			}
		}
		switch st {
		case peerSilent:
			k.log.Info("the process that waits the conflict out for this machine has stopped (no beat for "+peerSilence.String()+"); taking its place", "watcher", fr.PID)
			if _, err := op.followed.depose(k.ctx, c.machine.dirs.path(snap, peersSuffix)); err != nil {
				return 0, interrupted(k.ctx, k.last)
			}
			fallthrough
		case peerGone:
			if st == peerGone {
				k.log.Info("the process that waited the conflict out for this machine is gone; taking over", "watcher", fr.PID)
			}
			op.followed.close()
			op.followed = nil
			if op.enterWait(func(nf *machineFacts) { nf.Busy = max(nf.Busy, f.Busy) }) {
				continue // another process took it first: follow it
			}
			return tryAgain, nil
		}
		if err := op.awaitLockDir(watched, mark, true); err != nil {
			return 0, err
		}
	}
}
