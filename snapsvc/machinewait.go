package snapsvc

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/snapsvc/snapsvc/internal/flock"
	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// One watcher per machine. The processes of a machine that control one
// snap (a daemon's controllers, a hook, the CLI) each run a Client of
// their own, and would each wait out a blocker with requests of their own:
// snapd's load would grow with their number. They share the lock
// directory (lock.go) already, and through it they share one watcher per
// snap:
//
//   - The operation that meets a conflict takes the snap's watch lock
//     (<snap>.observe, a file lock, without waiting) and becomes the
//     machine's watcher for the snap: it waits the blocker out as it
//     would alone (state file, listing and notices, or the blind cadence:
//     conflict.go) and publishes what it sees in <snap>.facts (written to a
//     temporary file, then renamed over it, in the background: a rename
//     may wait for the file system's journal, and the call must not wait
//     past its bound for it): when it was refused (busy),
//     the blockers it follows, whether snapd answers, and, once a request
//     of its own went through, that the snap is free.
//   - An operation of another process that meets a conflict while the
//     watch lock is held, or that finds the facts saying the snap is
//     busy and an watcher at work before it sends anything, follows
//     instead: it lets go of the snap's file lock and waits for the facts
//     to say the snap is free as of a moment after it began to follow
//     (inotify on the lock directory, which costs snapd nothing), then
//     tries its request. It sends nothing to snapd meanwhile.
//   - Each follower applies its own bounds (its context, its policy's time,
//     its MaxUnreachable to the watcher's view of snapd's reachability):
//     facts shared, never bounds, as in-process shared waits do
//     (processwait.go).
//   - The watcher stops watching when its operation ends. It publishes
//     that the snap is free only when a request of its own went through
//     (after its own change when it waited for it, before it lets go of
//     the snap's file lock): then the followers try, one after the other
//     behind the file lock. An watcher that ends otherwise (its bound, an
//     error), or dies (kill -9: the kernel lets go of its lock), publishes
//     nothing; a follower finds the watch lock free within one poll
//     interval (WithPollInterval: a local flock(2), no request), takes it,
//     and tries its request itself, as the new watcher.
//
// Times in the facts are the machine's monotonic clock (CLOCK_MONOTONIC,
// one for every process of the machine and never stepped), so a follower
// tells a fact read after it began to follow from an older one whatever
// the wall clock does.
//
// Inside a strictly confined snap the lock directory is under
// $SNAP_COMMON, where the default AppArmor template lets the snap read,
// lock, write and link (snapd interfaces/apparmor/template.go:
// /var/snap/{@{SNAP_NAME},@{SNAP_INSTANCE_NAME}}/** mrkix, .../common/**
// wl): everything here needs no interface. Where the lock directory cannot
// be watched (no inotify), a follower reads the facts every poll interval.
//
// A call made from a hook takes no part: a hook of the blocking change
// must never wait behind an watcher that waits for that very change
// (waitIdle's and the conflict's wait skip it for the hook alone). Nor do
// operations on several snaps, Clients without a lock directory
// (WithoutFileLock), or on a clock of the caller's (WithClock).

// machineFacts is what a snap's watcher publishes in the lock directory.
type machineFacts struct {
	// Watcher is the process that wrote the facts.
	Watcher int `json:"watcher"`
	// Busy is when the watcher last met the snap busy (a refusal; the
	// machine's clock, ns).
	Busy int64 `json:"busy"`
	// Free is when an watcher last saw a request of its own go through
	// after waiting: the snap was free then, as far as it could tell.
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

// maxFactsSize bounds what is read of a facts file.
const maxFactsSize = 64 << 10

// machineNow reads the machine's monotonic clock, in ns.
func machineNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now().UnixNano() // not on Linux: never reached there
	}
	return ts.Nano()
}

// machineTime converts a time of the machine's monotonic clock to the
// client's (real) clock.
func machineTime(ns int64) time.Time { return time.Now().Add(-time.Duration(machineNow() - ns)) }

// machineClock converts a time of the client's (real) clock to the
// machine's monotonic clock.
func machineClock(t time.Time) int64 { return machineNow() - int64(time.Since(t)) }

// machine is a Client's part in what the processes of a machine share
// through its lock directory: one watcher per snap (this file) and
// identical restarts merged (machineflight.go).
type machine struct {
	dir   string    // the lock directory ("": nothing is shared)
	watch *dirWatch // the lock directory's facts and flights; nil without dir
	on    bool      // the Client takes part (see above)
}

// newMachine is the part of a Client with lock directory dir (""), built
// in hook (""), on the real clock or not (a Client on a clock of its own
// takes no part).
func newMachine(dir, hook string, realClock bool) machine {
	if dir == "" {
		return machine{}
	}
	match := func(n string) bool { return strings.HasSuffix(n, factsSuffix) || strings.HasSuffix(n, flightSuffix) }
	return machine{dir: dir, watch: newDirWatch(dir, unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE|unix.IN_MODIFY|unix.IN_DELETE, match),
		on: hook == "" && realClock}
}

// shares reports whether operation o shares the machine's watcher and
// merges: one snap's, from a Client that takes part.
func (m machine) shares(o request) bool { return m.on && len(o.t.snaps) == 1 }

// close ends the lock directory's watch (Client.Close).
func (m machine) close() { m.watch.close() }

const (
	observeSuffix = ".observe"
	factsSuffix   = ".facts"
)

// facts reads snap's facts; none published yet is the zero facts.
func (m machine) facts(snap string) (machineFacts, error) {
	var f machineFacts
	b, err := flock.ReadFile(filepath.Join(m.dir, snap+factsSuffix), maxFactsSize)
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, err
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return machineFacts{}, nil // a file from elsewhere: no facts
	}
	return f, nil
}

// machineWatcher is the watch lock of a snap, held by the operation that
// watches it for the machine, and the facts it publishes.
type machineWatcher struct {
	m     machine
	snap  string
	lock  *flock.Lock
	facts machineFacts
	seq   uint64 // facts published so far (the operation's goroutine)

	wmu     sync.Mutex  // one write at a time, in the background
	written uint64      // the latest seq written
	ended   atomic.Bool // the watcher ended: no write starts (set without wmu: a write may be stalled)
}

// tryWatch takes snap's watch lock if nobody holds it.
func (m machine) tryWatch(snap string) (*machineWatcher, bool, error) {
	l, ok, err := flock.TryAcquire(filepath.Join(m.dir, snap+observeSuffix))
	if err != nil || !ok {
		return nil, false, err
	}
	ob := &machineWatcher{m: m, snap: snap, lock: l}
	// Keep when the snap was last seen free and busy, whoever saw it: a
	// follower that has not read it yet must still find it, and the
	// snap is still busy as far as anyone knows. The rest (the blockers,
	// the conflict, snapd's reachability) was the last watcher's view,
	// which ended with it: startWatching publishes the facts without it.
	if f, err := m.facts(snap); err == nil {
		ob.facts.Busy, ob.facts.Free = f.Busy, f.Free
	}
	ob.facts.Watcher = os.Getpid()
	return ob, true, nil
}

// publish writes the watcher's facts as they are now, in the background
// (bg): the operation never waits for the lock directory's file system. A
// rename waits for the file system's journal, tens of milliseconds on a
// disk busy with fsyncs, which would hold a call past its bound (a
// schedule test's call returned 140 ms past it, in renameat). Writes run
// one at a time and a write older than one already made is skipped, so the
// file ends with the latest facts; none starts once the watcher ended.
//
// note, when set, is logged (debug) once the write is made: "watching"
// is said when what a follower needs to follow is in the file.
func (ob *machineWatcher) publish(bg *background, log *slog.Logger, note string) {
	b, err := json.Marshal(&ob.facts)
	if err != nil {
		log.Debug("cannot publish what this process sees of the snap", "error", err)
		return
	}
	ob.seq++
	seq := ob.seq
	work := func(context.Context) {
		ob.wmu.Lock()
		defer ob.wmu.Unlock()
		if seq <= ob.written || ob.ended.Load() {
			return // a later write came first, or the watcher ended
		}
		ob.written = seq
		ob.write(b, log, note)
	}
	if !bg.do(interruptGrace, work) {
		work(context.Background())
	}
}

// testHookFactsWrite is called before each write of an watcher's facts
// (export_test.go: a file system that stalls).
var testHookFactsWrite = func() {}

// write writes the facts b.
func (ob *machineWatcher) write(b []byte, log *slog.Logger, note string) {
	testHookFactsWrite()
	if err := flock.WriteFile(filepath.Join(ob.m.dir, ob.snap+factsSuffix), b); err != nil {
		log.Debug("cannot publish what this process sees of the snap", "error", err)
	} else if note != "" {
		log.Debug(note, "snap", ob.snap)
	}
}

// end ends the watcher: no write starts from now on; with free, the
// facts (saying the snap is free) are written first, the call waiting for
// that until ctx ends (the rest in the background, bg). The watch lock
// is let go of before end returns, so the next operation of this process
// finds it free. A write the file system holds up may land after that: it
// can only be older than what a next watcher writes when it begins, or
// say free, which a follower checks by trying its request.
func (ob *machineWatcher) end(ctx context.Context, bg *background, log *slog.Logger, free bool) {
	var b []byte
	if free {
		var err error
		if b, err = json.Marshal(&ob.facts); err != nil {
			log.Debug("cannot publish what this process sees of the snap", "error", err)
			b = nil
		}
	}
	ob.ended.Store(true)
	if b != nil {
		bg.doAwaited(ctx, interruptGrace, func(context.Context) {
			ob.wmu.Lock()
			defer ob.wmu.Unlock()
			ob.write(b, log, "")
		})
	}
	_ = ob.lock.Unlock()
}

// ---- the operation's side (operation.go's run loop calls these) ----

// watchOrFollow decides, for an operation whose request snapd refused
// with ce, whether it watches the snap for the machine (false: it waits
// the conflict out itself, publishing what it sees) or follows another
// process's watcher (true: from joined, on the machine's clock).
func (op *operation) watchOrFollow(ce *retry.ConflictError) (joined int64, follow bool) {
	joined = machineNow() // before the watch lock is tried: a snap seen free since counts
	if !op.c.machine.shares(op.o) {
		return 0, false
	}
	started := op.watcher == nil
	if started {
		ob, ok, err := op.c.machine.tryWatch(op.o.t.snaps[0])
		switch {
		case err != nil:
			op.k.log.Debug("cannot share the wait with the machine's other processes", "error", err)
			return 0, false
		case !ok:
			return joined, true
		}
		op.startWatching(ob)
	}
	f := &op.watcher.facts
	f.Busy, f.Blockers = machineNow(), nil
	f.Kind, f.AllSnaps, f.Message = ce.ChangeKind, ce.AllSnaps, ce.Message
	if started {
		op.announce()
	} else {
		op.publish()
	}
	return 0, false
}

// startWatching makes the operation the machine's watcher of its snap;
// its caller publishes its facts at once (announce), so that none of the
// last watcher's view (its blockers, snapd unreachable since when it saw
// it) passes for this one's while it sends and waits for its own change.
// What its call learns of snapd's reachability is published too.
func (op *operation) startWatching(ob *machineWatcher) {
	op.watcher = ob
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
func (op *operation) publish() { op.watcher.publish(op.c.bg, op.k.log, "") }

// watchingNote is logged once an watcher's first facts are written.
const watchingNote = "watching the snap for the machine's processes"

// announce publishes the facts of an watcher that just began, and says
// so once they are written.
func (op *operation) announce() { op.watcher.publish(op.c.bg, op.k.log, watchingNote) }

// stopWatching ends the operation's watching, once it is over (before
// it lets go of the snap's file lock): if a request of its own went
// through, the snap is free for the followers to try theirs.
func (op *operation) stopWatching() {
	if op.watcher == nil {
		return
	}
	op.k.onNote = nil
	free := op.res.ChangeID != "" || op.res.Status != "" || op.res.Queued
	if free {
		op.watcher.facts.Free = machineNow()
		op.watcher.facts.Blockers = nil
	}
	op.watcher.end(op.k.ctx, op.c.bg, op.k.log, free)
	op.watcher = nil
}

// busyElsewhere reports, before an attempt, whether another process of the
// machine watches the snap busy, and the conflict it met: the operation
// then follows it rather than send a request bound to be refused. Where
// the facts say busy but nobody watches (the watcher ended or died), the
// operation becomes the watcher and sends.
func (op *operation) busyElsewhere() (ce *retry.ConflictError, joined int64, busy bool) {
	c := op.c
	if op.watcher != nil || !c.machine.shares(op.o) {
		return nil, 0, false
	}
	snap := op.o.t.snaps[0]
	joined = machineNow() // before the facts are read: a snap seen free since counts
	f, err := c.machine.facts(snap)
	if err != nil || !f.busy() {
		return nil, 0, false
	}
	ob, ok, err := c.machine.tryWatch(snap)
	switch {
	case err != nil:
		return nil, 0, false
	case ok:
		op.startWatching(ob)
		op.announce()
		return nil, 0, false
	}
	return f.conflict(snap), joined, true
}

// follow waits for the machine's watcher of the snap (another process)
// to see it free as of joined (the machine's clock, when the operation
// found the snap busy) or later, within the call's bounds and without a
// request to snapd, without the snap's file lock (withoutFileLocks, as
// every wait for someone else's change). It returns tryFresh
// once the snap was seen free; tryAgain when nobody watches any more (the
// watcher ended, or died) and this operation took over; or the call's
// end.
func (op *operation) follow(ce *retry.ConflictError, joined int64) (next, error) {
	var then next
	err := op.withoutFileLocks(func() (err error) {
		then, err = op.followFacts(ce, joined)
		return err
	})
	return then, err
}

// followFacts is follow's wait.
func (op *operation) followFacts(ce *retry.ConflictError, joined int64) (next, error) {
	c, k := op.c, op.k
	snap := op.o.t.snaps[0]
	f, _ := c.machine.facts(snap)
	ev := k.event(EventConflict)
	ev.Blockers, ev.Err = f.Blockers, ce
	c.events.emit(ev)
	k.last = ce
	k.log.Info("conflict; another process of this machine waits it out: following what it sees", "watcher", f.Watcher, "changes", f.Blockers, "kind", ce.ChangeKind, "attempt", op.res.Attempts)
	w := c.machine.watch
	for {
		var mark uint64
		watched := w.open()
		if watched {
			mark = w.mark()
		}
		f, err := c.machine.facts(snap)
		if err != nil {
			k.log.Debug("cannot read what the machine's watcher sees", "error", err)
		}
		op.res.WaitedFor = appendNew(op.res.WaitedFor, f.Blockers...)
		if f.Free >= joined {
			k.log.Debug("the machine's watcher saw the snap free; trying again", "watcher", f.Watcher)
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
		if ob, ok, err := c.machine.tryWatch(snap); err == nil && ok {
			op.startWatching(ob)
			op.announce()
			if f, err := c.machine.facts(snap); err == nil && f.Free >= joined {
				return tryFresh, nil
			}
			k.log.Info("the process that waited the conflict out for this machine is gone; taking over", "watcher", f.Watcher)
			return tryAgain, nil
		}
		if err := op.awaitLockDir(watched, mark, true); err != nil {
			return 0, err
		}
	}
}
