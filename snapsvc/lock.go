package snapsvc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/snapsvc/snapsvc/retry"
)

// snapLock serialises operations on one snap of one snapd within the
// process. It also remembers changes made by asynchronous operations that
// nobody has seen finish yet: the next operation waits for them before
// acting, so it does not run into them as a conflict.
type snapLock struct {
	sem *semaphore.Weighted

	mu          sync.Mutex
	pending     []string
	waiting     map[string]*flight   // identical restarts not yet holding the lock
	lastRestart map[string]time.Time // for WithMinRestartInterval
	own         []string             // recent changes this process made
}

var locks = struct {
	sync.Mutex
	m map[string]*snapLock
}{m: map[string]*snapLock{}}

// processSnaps is this process's registry of the snaps of one snapd (its
// instance key): each snap's lock, the changes pending on it, the identical
// restarts merging behind it, its services' last restarts and the changes
// claimed by operations. Every Client of the process that reaches that
// snapd shares it.
type processSnaps struct{ instance string }

// of returns snap's entry.
func (p processSnaps) of(snap string) *snapLock { return lockFor(p.instance, snap) }

// addPending records a change of this process that the next operation on
// o's snaps must wait for.
func (p processSnaps) addPending(o request, id string) {
	for _, s := range o.t.snaps {
		p.of(s).addPending(id)
	}
}

func lockFor(instance, snap string) *snapLock {
	key := instance + "\x00" + snap
	locks.Lock()
	defer locks.Unlock()
	l := locks.m[key]
	if l == nil {
		l = &snapLock{sem: semaphore.NewWeighted(1)}
		locks.m[key] = l
	}
	return l
}

func (l *snapLock) addPending(id string) {
	l.mu.Lock()
	l.pending = append(l.pending, id)
	l.mu.Unlock()
}

func (l *snapLock) takePending() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pending
	l.pending = nil
	return p
}

// snapLocks is the set of locks one operation holds.
type snapLocks struct {
	dirs    *lockDirs                 // of the cross-process locks (none: none)
	what    []byte                    // its locks' records' body: what the operation does (snapLockBody)
	waiting func(holder []byte) error // called before the operation first waits for a lock another process holds; its error ends the wait
	mem     []*snapLock
	files   []*heldRecord
}

// lock takes the in-process lock of every snap (sorted, so two
// multi-snap operations cannot deadlock), then the cross-process locks
// in their lock directories (lockdir.go), for what. Waiting honours ctx.
func (p processSnaps) lock(ctx context.Context, snaps []string, dirs *lockDirs, what []byte, waiting func(holder []byte) error) (*snapLocks, error) {
	h := &snapLocks{dirs: dirs, what: what, waiting: waiting}
	for _, s := range snaps {
		l := p.of(s)
		if err := l.sem.Acquire(ctx, 1); err != nil {
			h.release()
			return nil, fmt.Errorf("waiting for the lock of snap %q: %w", s, err)
		}
		h.mem = append(h.mem, l)
	}
	if err := h.lockFiles(ctx, snaps); err != nil {
		h.release()
		return nil, err
	}
	return h, nil
}

// releaseFiles lets other processes have the snaps while this one waits
// for someone else's change: a hook run by that change may need them.
func (l *snapLocks) releaseFiles() {
	for i := len(l.files) - 1; i >= 0; i-- {
		l.files[i].end(nil, "", nil, false)
	}
	l.files = nil
}

// lockFiles takes the cross-process file locks of snaps.
func (l *snapLocks) lockFiles(ctx context.Context, snaps []string) error {
	if l.dirs.none() {
		return nil
	}
	for _, s := range snaps {
		fl, err := l.dirs.lockSnap(ctx, s, l.what, l.waiting)
		var ji *joinInstead
		if errors.As(err, &ji) {
			l.releaseFiles()
			return err
		}
		if err != nil {
			l.releaseFiles()
			return fmt.Errorf("cross-process lock of snap %q: %w", s, err)
		}
		l.files = append(l.files, fl)
	}
	return nil
}

// pending reports whether an earlier asynchronous operation of this
// process left a change running on one of the snaps.
func (l *snapLocks) pending() bool {
	for _, s := range l.mem {
		s.mu.Lock()
		n := len(s.pending)
		s.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

func (l *snapLocks) release() {
	l.releaseFiles()
	for i := len(l.mem) - 1; i >= 0; i-- {
		l.mem[i].sem.Release(1)
	}
	l.mem = nil
}

// lock takes the snaps' locks (unless snapd only queues the command, in a
// configure hook: such a call cannot collide with our other operations,
// and making it wait for them could deadlock the hook), then waits for the
// changes earlier asynchronous operations of this process left running.
// A restart that must keep its distance from the last one (pace) waits
// with the locks released, so it holds up no other operation; a restart of
// the same service may go ahead meanwhile, hence the loop.
func (op *operation) lock() error {
	c := op.c
	for {
		if !c.queuesInHook() {
			h, err := c.snaps.lock(op.k.ctx, op.o.t.snaps, c.lockDirs, op.o.lockBody(c.lockDirs), op.aboutToWaitForLock)
			if err != nil {
				return err
			}
			op.locks = h
		}
		if !c.interval.must(op.o) {
			break
		}
		op.unlock()
		if err := op.pace(); err != nil {
			return err
		}
	}
	op.flight.close() // processflight.go: no identical restart of this process joins from now on
	if op.locks != nil && op.locks.pending() {
		if err := op.waitPending(); err != nil {
			op.unlock()
			return err
		}
	}
	if c.hook != "" {
		op.skip = ownHookChange(op.k, op.o.t.snaps)
	}
	return nil
}

// waitPending waits for the changes earlier asynchronous operations of
// this process left running on the snaps.
func (op *operation) waitPending() error {
	if op.locks == nil {
		return nil
	}
	var pending []string
	for _, l := range op.locks.mem {
		pending = append(pending, l.takePending()...)
	}
	if len(pending) == 0 {
		return nil
	}
	op.k.log.Debug("waiting for this process's earlier changes", "changes", pending)
	if _, err := waitChanges(op.k, pending, waitOpts{}); err != nil {
		for _, l := range op.locks.mem {
			for _, id := range pending {
				l.addPending(id)
			}
		}
		return err
	}
	return nil
}

func (op *operation) unlock() {
	if op.locks != nil {
		op.locks.release()
		op.locks = nil
	}
}

// lockBody is the body of the records of the cross-process locks (in
// dirs) an operation of o takes: what it does.
func (o request) lockBody(dirs *lockDirs) []byte {
	if dirs.none() {
		return nil
	}
	b, _ := json.Marshal(snapLockBody{For: o.action + " " + o.t.String()})
	return b
}

// aboutToWait is called when the operation is about to wait, for a lock
// another process holds or out someone else's change, its request not
// sent: the flight it leads opens to the machine's identical restarts, or
// it joins one of them found under way (a *joinInstead: machineflight.go).
func (op *operation) aboutToWait() error { return op.lead.open(op.k.ctx) }

// aboutToWaitForLock is aboutToWait for the snap's lock, held by another
// process doing holder: one doing the same request does not make the
// flight visible yet. Should that one's request be refused, it makes its
// own flight visible as it waits the blocker out, and this one joins it
// once it takes the lock; made visible now, this flight would have it
// join this one instead, whose request has not met the blocker, and which
// would then be refused in turn.
func (op *operation) aboutToWaitForLock(holder []byte) error {
	if op.lead == nil || bytes.Equal(holder, op.o.lockBody(op.c.lockDirs)) {
		return nil
	}
	return op.aboutToWait()
}

// withoutFileLocks runs wait, a wait for someone else's change, with the
// snaps' cross-process locks let go of: a hook that change runs, or
// another process, may need them. This process's own locks stay held, so
// identical restarts queued behind the operation can still merge. The
// file locks are taken back once wait returned nil; an error ends the
// operation, which lets go of everything.
func (op *operation) withoutFileLocks(wait func() error) error {
	if op.locks != nil {
		op.locks.releaseFiles()
	}
	if err := wait(); err != nil {
		return err
	}
	return op.relockFiles()
}

// relockFiles takes back the cross-process locks let go while waiting.
func (op *operation) relockFiles() error {
	if op.locks == nil {
		return nil
	}
	return op.locks.lockFiles(op.k.ctx, op.o.t.snaps)
}

// instanceKey identifies a snapd by the directory of its sockets: both
// sockets of one snapd live side by side (/run on a real system, one temp
// directory for a fake), so a REST client and a snapctl client of one
// process share their per-snap locks.
func instanceKey(socket string) string {
	abs, err := filepath.Abs(socket)
	if err != nil {
		abs = socket
	}
	return filepath.Dir(abs)
}

// pace is the pace phase: it waits until every service the operation
// restarts was last restarted by this process at least the minimum
// restart interval ago (WithMinRestartInterval), so bursts of restarts
// cannot trip systemd's start limit. A whole-snap restart counts for each
// of its services and the other way round.
func (op *operation) pace() error {
	k, o := op.k, op.o
	for k.c.interval.must(o) {
		wait := k.c.interval.left(o)
		if wait <= 0 {
			return nil
		}
		k.log.Info("pacing restart", "wait", wait) // the operation's logger names the services
		if err := k.sleep(wait); err != nil {
			return fmt.Errorf("waiting for the minimum restart interval: %w", err)
		}
	}
	return nil
}

// restartInterval keeps restarts of one service made through the process
// at least min apart (WithMinRestartInterval; 0: no limit). The last
// restart of each service is kept in the process's registry of snaps
// (lock.go), so every Client of the process counts.
type restartInterval struct {
	snaps processSnaps
	min   time.Duration
	clock retry.Clock
}

// must reports whether o is a restart that must still wait.
func (ri restartInterval) must(o request) bool {
	return o.action == "restart" && ri.min > 0 && ri.left(o) > 0
}

// left returns how long o must still wait.
func (ri restartInterval) left(o request) time.Duration {
	now := ri.clock.Now()
	var wait time.Duration
	for _, s := range o.t.snaps {
		l := ri.snaps.of(s)
		l.mu.Lock()
		for key, last := range l.lastRestart {
			if restartsOverlap(key, o.t.names) {
				if d := last.Add(ri.min).Sub(now); d > wait {
					wait = d
				}
			}
		}
		l.mu.Unlock()
	}
	return wait
}

// record notes that snapd accepted a restart of o's services now. Every
// Client records its restarts, with WithMinRestartInterval or not: the
// interval counts every restart made through the process.
func (ri restartInterval) record(o request) {
	if o.action != "restart" {
		return
	}
	now := ri.clock.Now()
	for _, s := range o.t.snaps {
		l := ri.snaps.of(s)
		l.mu.Lock()
		if l.lastRestart == nil {
			l.lastRestart = map[string]time.Time{}
		}
		for _, n := range o.t.names {
			if snapOf(n) == s {
				l.lastRestart[n] = now
			}
		}
		l.mu.Unlock()
	}
}

// restartsOverlap reports whether restarting names touches the service (or
// snap) key.
func restartsOverlap(key string, names []string) bool {
	for _, n := range names {
		if n == key || n == snapOf(key) || key == snapOf(n) {
			return true
		}
	}
	return false
}

func snapOf(name string) string {
	snap, _, _ := strings.Cut(name, ".")
	return snap
}
