package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/internal/flock"
	"github.com/snapsvc/snapsvc/internal/snapd"
)

// ReplayDecision says what Replay made of an intent.
type ReplayDecision string

const (
	// ReplayFinished: the intent's outcome was recorded before its
	// process ended; nothing was sent.
	ReplayFinished ReplayDecision = "finished"
	// ReplayAdopted: the intent's request had made a change (named by the
	// record, or found in snapd's changes as a lost answer's is); Replay
	// waited for it and reports its outcome. Nothing was sent.
	ReplayAdopted ReplayDecision = "adopted"
	// ReplayActed: the intent's request had made no change (or was never
	// sent): Replay carried the operation out.
	ReplayActed ReplayDecision = "acted"
	// ReplayReached: the intent was recorded in an earlier boot and the
	// services are in the state it asks for now (for a restart: always,
	// since every process running now started in this boot, after the
	// intent was recorded). Nothing was sent.
	ReplayReached ReplayDecision = "reached"
	// ReplayFailed: Replay could not finish the intent; Err says why
	// and whether it is left for a later replay (Kept).
	ReplayFailed ReplayDecision = "failed"
)

// Replayed is what Replay did with one intent left by a process that
// ended before its operation had an outcome (WithIntents).
type Replayed struct {
	// Snap is the snap whose lock directory held the intent.
	Snap string
	// Action and Names are the operation the intent asks for.
	Action string
	Names  []string
	// PID is the process that recorded it.
	PID int
	// EarlierBoot is true for an intent recorded before this boot.
	EarlierBoot bool
	// Decision says what Replay made of it.
	Decision ReplayDecision
	// Result is the operation's outcome (nil with ReplayFailed, and with
	// ReplayReached, where no change was made).
	Result *Result
	// Err is the failure of a replay that did not finish the intent.
	Err error
	// Kept is true when the intent stays for a later replay (Replay's
	// context ended, or the outcome of its request is still unknown).
	Kept bool
}

// replayState is what an operation replaying an intent starts from.
type replayState struct {
	body      intentBody
	earlier   bool // recorded in an earlier boot
	decision  ReplayDecision
	recorded  time.Time // the record's send, as a wall time
	recordPID int
}

// errCrashed stands for the answer to a request whose process ended
// before it read it.
var errCrashed = errors.New("the process that sent the request ended before it read snapd's answer")

// Replay finishes the intents (WithIntents) that processes which ended
// before their operations' outcomes left in the lock directories of
// snaps (none named: the Client's own snap, or every snap of a fixed
// lock directory, WithLockDir or a socket of a fake), once each: it takes
// an intent only when no live process holds it (a stopped process is
// never taken for dead), and decides from snapd's records what is left
// to do (see ReplayDecision). An intent of a restart, a start or a stop
// replays as that operation would run, under the snap's lock and, with
// WithRestartBudget, its slot. Intents are replayed one at a time, in the
// order they were recorded. The error is for a lock directory that
// cannot be read; each intent's own failure is in its Replayed.
func (c *Client) Replay(ctx context.Context, snaps ...string) ([]Replayed, error) {
	paths, err := c.intentPaths(snaps)
	if err != nil {
		return nil, err
	}
	var out []Replayed
	for _, p := range paths {
		if ctx.Err() != nil {
			break
		}
		r, ok := c.replayOne(ctx, p)
		if ok {
			out = append(out, r)
		}
	}
	return out, nil
}

// intentFile is an intent record found in a lock directory.
type intentFile struct {
	snap, path string
	mod        time.Time
}

// intentPaths lists the intent records of snaps (see Replay), oldest
// first.
func (c *Client) intentPaths(snaps []string) ([]intentFile, error) {
	if c.lockDirs.none() {
		return nil, fmt.Errorf("cannot replay intents: the Client has no lock directory (WithoutFileLock)")
	}
	type dirSnap struct{ dir, snap string }
	var dirs []dirSnap
	switch {
	case len(snaps) > 0:
		for _, s := range snaps {
			dirs = append(dirs, dirSnap{c.lockDirs.of(s), s})
		}
	case c.lockDirs.fixed != "":
		dirs = append(dirs, dirSnap{c.lockDirs.fixed, ""})
	case c.ownSnap != "":
		dirs = append(dirs, dirSnap{c.lockDirs.of(c.ownSnap), c.ownSnap})
	}
	var found []intentFile
	for _, d := range dirs {
		entries, err := os.ReadDir(d.dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cannot list intents in %s: %w", d.dir, err)
		}
		for _, e := range entries {
			name := e.Name()
			snap, ok := intentSnap(name)
			if !ok || (d.snap != "" && snap != d.snap) {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue // removed meanwhile
			}
			found = append(found, intentFile{snap: snap, path: filepath.Join(d.dir, name), mod: info.ModTime()})
		}
	}
	slices.SortStableFunc(found, func(a, b intentFile) int { return a.mod.Compare(b.mod) })
	return found, nil
}

// intentSnap returns the snap of an intent record's file name
// (SNAP.ID.intent).
func intentSnap(name string) (string, bool) {
	if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, intentSuffix) {
		return "", false
	}
	snap, _, ok := strings.Cut(strings.TrimSuffix(name, intentSuffix), ".")
	return snap, ok && snap != ""
}

// replayOne replays the intent at f; ok is false when it was not this
// process's to replay (held by its live process, or replayed by another
// meanwhile).
func (c *Client) replayOne(ctx context.Context, f intentFile) (Replayed, bool) {
	l, ok, err := flock.Claim(f.path)
	if err != nil || !ok {
		return Replayed{}, false
	}
	rec := &intentRecord{lock: l, peers: c.lockDirs.path(f.snap, peersSuffix)}
	out := Replayed{Snap: f.snap}
	frame, fok := readFrame(l.Read)
	if !fok || !frame.body(&rec.body) {
		// A record cut short as it was made (never written whole: its
		// maker died before linking it, which flock.Create rules out, or
		// a file system that lost it): nothing can be told from it.
		rec.clear()
		out.Decision, out.Err = ReplayFailed, fmt.Errorf("unreadable intent record %s: removed", f.path)
		return out, true
	}
	rec.frame, rec.size = frame, mustSize(l)
	b := rec.body
	out.Action, out.Names, out.PID = b.Action, b.Names, frame.PID
	out.EarlierBoot = frame.Boot != bootID()
	rec.frame.PID = os.Getpid() // its boot stays the record's until the replay acts (resumeAfterBoot)
	if b.Outcome != "" {
		rec.clear()
		out.Decision = ReplayFinished
		out.Result = &Result{ChangeID: b.Change, Status: b.Outcome}
		c.replayEvent(out)
		return out, true
	}
	o, err := c.prepare(b.Action, b.Names, b.set)
	if err != nil {
		rec.clear() // the names are no longer valid: nothing will ever act on them
		out.Decision, out.Err = ReplayFailed, err
		c.replayEvent(out)
		return out, true
	}
	_ = rec.update(func(b *intentBody) { b.Replays++ })
	intentPoint("replay-taken")
	k := c.newCall(ctx, callOp, o.action, o.t.names)
	op := c.operationOn(k, o)
	op.intent = rec
	op.replay = &replayState{body: b, earlier: out.EarlierBoot, recordPID: frame.PID}
	k.log.Info("replaying an intent its process left unfinished", "pid", frame.PID, "earlier_boot", out.EarlierBoot, "change", b.Change)
	res, err := op.runReplay()
	k.end()
	rec.end(ctx, res, err)
	out.Result, out.Err, out.Decision = res, err, op.replay.decision
	if err != nil {
		out.Decision = ReplayFailed
		out.Kept = ctx.Err() != nil || errors.Is(err, ErrOutcomeUnknown)
	}
	c.replayEvent(out)
	return out, true
}

// mustSize is the size of the record's file, which every rewrite keeps.
func mustSize(l *flock.Lock) int {
	b, err := l.Read(maxRecordSize)
	if err != nil {
		return 0
	}
	return len(b)
}

// replayEvent reports a replay to the observers.
func (c *Client) replayEvent(r Replayed) {
	ev := Event{Kind: EventReplayed, Op: r.Action, Names: r.Names, Err: r.Err}
	if r.Result != nil {
		ev.ChangeID = r.Result.ChangeID
	}
	c.events.emit(ev)
}

// runReplay is the phase table of a replay: its budget's slot, as any
// operation's, then act, which resumes the intent first (resume). A
// replay merges with no other restart: its request may have made its
// change already.
func (op *operation) runReplay() (*Result, error) {
	if op.c.budget != nil {
		if err := op.takeBudget(); err != nil {
			return nil, err
		}
	}
	res, _, err := op.act(true)
	if op.hold != nil {
		err = op.hold.end(op.k, op.o, res, err)
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// resume decides, under the snaps' locks, what is left of the intent op
// replays, from snapd's records: ended says op's outcome is decided
// (res, done, err); otherwise the operation sends its request as usual.
func (op *operation) resume(wait bool) (res *Result, done bool, err error, ended bool) {
	rp := op.replay
	b := rp.body
	if b.Change != "" {
		// snapd made the change: it carries it out whatever became of
		// the process that asked (its changes outlive a crash and a
		// reboot). Wait for it.
		rp.decision = ReplayAdopted
		if op.hold != nil {
			op.hold.acted()
		}
		op.c.snaps.claim(op.o, b.Change)
		op.res.ChangeID = b.Change
		res, done, err = op.adopted(b.Change, wait)
		if !rp.earlier {
			return res, done, err, true
		}
		op.res.Status = "" // an earlier boot's change: the state now says what is left
	}
	if rp.earlier {
		return op.resumeAfterBoot()
	}
	if b.Sent == nil {
		rp.decision = ReplayActed // nothing was ever sent
		return nil, false, nil, false
	}
	// Sent, and its answer never read: the lost answer's look-up
	// (lostanswer.go) on the record's stamp, which also settles a start
	// or stop from the services' state where snapd lets nobody list its
	// changes.
	a := attempt{sent: b.Sent.stamp(), err: errCrashed, step: lookUp}
	a.sentAt = a.sent.at
	res, done, _, err = op.lost(a, wait)
	if res != nil || err != nil {
		rp.decision = ReplayAdopted
		if op.hold != nil && res != nil && res.ChangeID != "" {
			op.hold.acted()
		}
		return res, done, err, true
	}
	rp.decision = ReplayActed
	return nil, false, nil, false
}

// stamp is the request's send as sent (matching.go) in this process: its
// time a wall time (the send's monotonic reading was another process's),
// moved earlier by any step of the machine's wall clock since, measured
// against the monotonic clock both processes share, so that a change the
// step stamped before the send is still the request's.
func (s *intentSent) stamp() sent {
	at := time.Unix(0, s.Wall)
	step := time.Since(at) - time.Duration(machineNow()-s.Mono)
	if step.Abs() > clockSlack {
		at = at.Add(-step.Abs())
	}
	return sent{at: at, seen: s.Seen, counted: s.Counted}
}

// resumeAfterBoot decides an intent of an earlier boot from the services'
// state: every process running now started in this boot, after the intent
// was recorded, so a restart is done; a start or stop is done if the
// services are in the state it asks for, and carried out otherwise.
func (op *operation) resumeAfterBoot() (*Result, bool, error, bool) {
	rp := op.replay
	if op.o.action == "restart" {
		rp.decision = ReplayReached
		op.res.Status = snapd.StatusDone
		return op.res, true, nil, true
	}
	svcs, err := op.k.services(op.o.t.names)
	if err != nil {
		return nil, false, op.c.opError(op.o, "", 0, fmt.Errorf("cannot read the services' state to replay an intent of an earlier boot: %w", err)), true
	}
	if op.o.reached(svcs) {
		rp.decision = ReplayReached
		op.res.Status = snapd.StatusDone
		return op.res, true, nil, true
	}
	rp.decision = ReplayActed
	op.res.ChangeID = ""
	// From now on the record is this boot's, and the earlier boot's send
	// and change say nothing of what this replay sends: a replay of this
	// replay must not take that change for its request's.
	op.intent.rebase()
	if err := op.intent.update(func(b *intentBody) { b.Sent, b.Change, b.At = nil, "", machineNow() }); err != nil {
		return nil, false, op.c.opError(op.o, "", 0, err), true
	}
	return nil, false, nil, false
}

// replayRun is the replay New begins (WithIntents).
type replayRun struct {
	done     chan struct{}
	replayed []Replayed
	err      error
}

// startReplay begins the replay of the intents of the Client's lock
// directories (Replay with no snaps named), in the background: Close
// ends it.
func (c *Client) startReplay() {
	run := &replayRun{done: make(chan struct{})}
	c.startup = run
	if !c.bg.do(time.Duration(1<<62), func(ctx context.Context) {
		defer close(run.done)
		run.replayed, run.err = c.Replay(ctx)
	}) {
		close(run.done)
	}
}

// Startup waits, within ctx, for the replay of unfinished intents the
// Client began when it was made (WithIntents), and returns what it did
// (nothing, without WithIntents).
func (c *Client) Startup(ctx context.Context) ([]Replayed, error) {
	if c.startup == nil {
		return nil, nil
	}
	select {
	case <-c.startup.done:
		return slices.Clone(c.startup.replayed), c.startup.err
	case <-ctx.Done():
		return nil, ctxErr(ctx, "waiting for the replay of unfinished intents")
	}
}
