package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
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
	// waited for it and reports its outcome, in this boot or an earlier
	// one. Nothing was sent.
	ReplayAdopted ReplayDecision = "adopted"
	// ReplaySuperseded: a later operation on the same services decided
	// since the intent was recorded (a service-control change made after
	// it: an identical restart it had joined, or someone's stop after an
	// intent to start); the newer decision stands and nothing was sent.
	// A start does not supersede an intent to restart (it leaves a
	// running service as it is).
	ReplaySuperseded ReplayDecision = "superseded"
	// ReplayActed: the intent's request had made no change (or was never
	// sent) and nothing superseded it: Replay carried the operation out.
	ReplayActed ReplayDecision = "acted"
	// ReplayReached: the intent was recorded in an earlier boot, made no
	// change, and the services are in the state it asks for now (for a
	// restart: always, since every process running now started in this
	// boot, after the intent was recorded). Nothing was sent.
	ReplayReached ReplayDecision = "reached"
	// ReplayFailed: Replay could not finish the intent; Err says why, and
	// Kept whether it is left for a later replay.
	ReplayFailed ReplayDecision = "failed"
)

// Replayed is what Replay did with one intent left by a process that
// ended before its operation had an outcome (WithIntents).
type Replayed struct {
	// Snap is the snap whose lock directory held the intent.
	Snap string
	// Path is the intent's record.
	Path string
	// Action and Names are the operation the intent asks for.
	Action string
	Names  []string
	// PID is the process that recorded it.
	PID int
	// EarlierBoot is true for an intent recorded before this boot.
	EarlierBoot bool
	// Decision says what Replay made of it.
	Decision ReplayDecision
	// Result is the operation's outcome: the change adopted, made or
	// superseding it and its status; Status "Done" and no change for
	// ReplayReached; nil with ReplayFailed.
	Result *Result
	// Err is the failure of a replay that did not finish the intent.
	Err error
	// Kept is true when the intent stays for a later replay: Replay's
	// context ended, or its failure may pass (snapd busy or unreachable
	// past the policy, a budget that would not grant a slot, a look-up
	// that could not finish).
	Kept bool
}

// replayState is what an operation replaying an intent starts from.
type replayState struct {
	body     intentBody
	earlier  bool // recorded in an earlier boot
	decision ReplayDecision
}

// errCrashed stands for the answer to a request whose process ended
// before it read it.
var errCrashed = errors.New("the process that sent the request ended before it read snapd's answer")

// Replay finishes the intents (WithIntents) that processes which ended
// before their operations' outcomes left in lock directories, once each:
// it takes an intent only when no live process holds it (a stopped
// process is never taken for dead), and decides from snapd's records what
// is left to do (see ReplayDecision). Named snaps: those snaps' lock
// directories. None: the Client's own snap's (inside a snap), the fixed
// one (WithLockDir, or a socket of a fake), or, for the system's snapd on
// the host, every snap's under /var/snap and /run/snapsvc (root) or this
// user's own. A snapctl-mode Client replays only its own snap's intents.
// An intent of a restart, a start or a stop replays as that operation
// would run, under the snap's lock and, with WithRestartBudget, its slot;
// intents are replayed one at a time, oldest first (by their records'
// last writes). The error is for a lock directory that cannot be listed;
// each intent's own failure is in its Replayed.
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
	default:
		for _, d := range c.lockDirs.scanned() {
			dirs = append(dirs, dirSnap{d, ""})
		}
	}
	var found []intentFile
	seen := map[string]bool{}
	for _, d := range dirs {
		if seen[d.dir] {
			continue
		}
		seen[d.dir] = true
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
			if c.mode == ModeSnapctl && c.ownSnap != "" && snap != c.ownSnap {
				continue // not this Client's to act on: snapctl acts on its own snap only
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
	out := Replayed{Snap: f.snap, Path: f.path}
	l, ok, err := flock.Claim(f.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return out, false // replayed and removed by another meanwhile
	case err != nil:
		out.Decision, out.Err, out.Kept = ReplayFailed, fmt.Errorf("cannot take the intent record %s: %w", f.path, err), true
		c.replayEvent(out)
		return out, true
	case !ok:
		return out, false
	}
	rec := &intentRecord{lock: l}
	frame, fok := readFrame(l.Read)
	if !fok || !frame.body(&rec.body) {
		// Never written whole (flock.Create links a record only once it
		// is), or damaged by the file system: nothing can be told from it.
		rec.clear()
		out.Decision, out.Err = ReplayFailed, fmt.Errorf("unreadable intent record %s: removed", f.path)
		c.replayEvent(out)
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
	intentPoint("replay-taken")
	k := c.newCall(ctx, callOp, o.action, o.t.names)
	op := c.operationOn(k, o)
	op.intent = rec
	op.replay = &replayState{body: b, earlier: out.EarlierBoot}
	k.log.Info("replaying an intent its process left unfinished", "pid", frame.PID, "earlier_boot", out.EarlierBoot, "change", b.Change)
	res, err := op.runReplay()
	k.end()
	out.Result, out.Err, out.Decision = res, err, op.replay.decision
	if err != nil {
		out.Decision = ReplayFailed
		out.Kept = c.replayMayPass(ctx, err)
	}
	if out.Kept {
		rec.keep()
	} else {
		rec.finish(res, err) // a replay's verdict is final: replayMayPass said so
	}
	c.replayEvent(out)
	return out, true
}

// replayMayPass reports whether a replay that failed with err should leave
// its intent for a later replay: its context ended, or the failure may
// pass (retryable: snapd busy or away past the policy, a budget slot not
// granted), or the look-up of its change could not finish. A failed
// change, a refusal for good, and an outcome no replay can ever learn (a
// restart's, where snapd lets this client list no change) end it.
func (c *Client) replayMayPass(ctx context.Context, err error) bool {
	var oe *OpError
	switch {
	case ctx.Err() != nil:
		return true
	case errors.Is(err, ErrOutcomeUnknown):
		return !c.view.listingRefused()
	case errors.As(err, &oe):
		return oe.Retryable()
	}
	return false
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
// operation's (but for the restart of an earlier boot, which never acts),
// then act, which resumes the intent first (resume). A replay merges with
// no other restart: its request may have made its change already.
func (op *operation) runReplay() (*Result, error) {
	rp := op.replay
	if op.c.budget != nil && !(rp.earlier && op.o.action == "restart") {
		if err := op.takeBudget(); err != nil {
			return nil, err
		}
		if op.hold != nil && rp.body.Act != "" {
			op.hold.actID = rp.body.Act // the act its process began: recorded once
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
//
//  1. A change the record names, or one its last send made (found as a
//     lost answer's is): snapd carries it out whatever became of the
//     process, and across a reboot: waited for, adopted.
//  2. A later operation on the same services: superseded.
//  3. An earlier boot's intent: judged by the services' state.
//  4. Otherwise: sent.
func (op *operation) resume(wait bool) (res *Result, done bool, err error, ended bool) {
	rp := op.replay
	b := rp.body
	adopted := func(res *Result, done bool, err error) (*Result, bool, error, bool) {
		rp.decision = ReplayAdopted
		if op.hold != nil && (res != nil || err != nil) {
			op.hold.acted()
		}
		return res, done, err, true
	}
	if b.Change != "" {
		op.c.snaps.claim(op.o, b.Change)
		op.res.ChangeID = b.Change
		return adopted(op.adopted(b.Change, wait))
	}
	if b.Sent != nil {
		a := attempt{sent: b.Sent.stamp(!rp.earlier), err: errCrashed, step: lookUp}
		a.sentAt = a.sent.at
		res, done, _, err = op.lost(a, wait)
		if res != nil || err != nil {
			if res != nil && res.ChangeID == "" && err == nil {
				rp.decision = ReplayReached // settled from the services' state (no listing)
				return res, done, nil, true
			}
			return adopted(res, done, err)
		}
	}
	if !op.c.view.listingRefused() {
		chg, err := op.supersededBy()
		if isForbidden(err) {
			// snapd lets this client list no change (snapctl without
			// snap-refresh-observe): nothing can supersede as far as it
			// can tell.
			op.c.view.noteListing(err, op.c.mode)
			chg, err = nil, nil
		}
		if err != nil {
			return nil, false, op.c.opError(op.o, "", 0, &outcomeUnknownError{reason: "cannot list snapd's changes to tell whether a later operation superseded the intent", last: err}), true
		}
		if chg != nil {
			rp.decision = ReplaySuperseded
			op.k.log.Info("a later operation on the services superseded the intent; nothing sent", "change", chg.ID, "kind", chg.Kind)
			op.res.ChangeID, op.res.Status = chg.ID, chg.Status
			return op.res, true, nil, true
		}
	}
	if rp.earlier {
		return op.resumeAfterBoot()
	}
	rp.decision = ReplayActed
	return nil, false, nil, false
}

// supersededBy returns the earliest service-control change on the
// intent's services made after the intent was recorded that decides what
// the intent decides (a restart is superseded by a restart or a stop; a
// start or stop by any), or nil.
func (op *operation) supersededBy() (*snapd.Change, error) {
	b := op.replay.body
	chgs, err := op.k.listOnce(snapd.SelectAll)
	if err != nil {
		return nil, err
	}
	from := time.Unix(0, b.Wall)
	if !op.replay.earlier {
		// A step back of the wall clock since the record stamps later
		// changes before it: widen by the step.
		if step := time.Since(from) - time.Duration(bootNow()-b.At); step < -clockSlack {
			from = from.Add(step)
		}
	}
	var best *snapd.Change
	for i := range chgs {
		chg := &chgs[i]
		if chg.Kind != "service-control" || op.known[chg.ID] || chg.SpawnTime.Before(from) {
			continue
		}
		if n, err := strconv.ParseInt(chg.ID, 10, 64); err == nil && n <= b.Seen {
			continue
		}
		if !decidesFor(chg, op.o) {
			continue
		}
		if best == nil || lessID(chg.ID, best.ID) {
			best = chg
		}
	}
	return best, nil
}

// serviceTask reads a service-control task's summary (matching.go's
// expectedSummary says what snapd writes): its action, its snap, and its
// services (none: every running service of the snap).
var serviceTask = regexp.MustCompile(`^Run service command "([a-z-]+)" for (?:services \[(.*)\]|running services) of snap "([^"]+)"$`)

// quotedName is one name of a Go-quoted list.
var quotedName = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// decidesFor reports whether chg, a service-control change, acts on one of
// o's services in a way that decides what o decides.
func decidesFor(chg *snapd.Change, o request) bool {
	for _, t := range chg.Tasks {
		if t.Kind != "service-control" {
			continue
		}
		m := serviceTask.FindStringSubmatch(t.Summary)
		if m == nil {
			continue
		}
		action, list, snap := m[1], m[2], m[3]
		if o.action == "restart" && action != "stop" && action != "restart" && !(o.reload && action == "reload-or-restart") {
			continue
		}
		var apps []string
		for _, q := range quotedName.FindAllString(list, -1) {
			if a, err := strconv.Unquote(q); err == nil {
				apps = append(apps, a)
			}
		}
		for _, n := range o.t.names {
			s, app, _ := strings.Cut(n, ".")
			if s == snap && (app == "" || len(apps) == 0 || slices.Contains(apps, app)) {
				return true
			}
		}
	}
	return false
}

// stamp is the request's send as sent (matching.go) in this process: its
// time a wall time (the send's monotonic reading was another process's).
// In the boot that sent it, a step back of the machine's wall clock since
// (measured against the boot clock both processes share) moves it
// earlier, so that a change the step stamped before the send is still the
// request's; a step forward needs nothing.
func (s *intentSent) stamp(sameBoot bool) sent {
	at := time.Unix(0, s.Wall)
	if sameBoot {
		if step := time.Since(at) - time.Duration(bootNow()-s.Mono); step < -clockSlack {
			at = at.Add(step)
		}
	}
	return sent{at: at, seen: s.Seen, counted: s.Counted}
}

// resumeAfterBoot decides an intent of an earlier boot that made no
// change from the services' state: every process running now started in
// this boot, after the intent was recorded, so a restart is done; a start
// or stop is done if the services are in the state it asks for, and
// carried out otherwise.
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
	// says nothing of what this replay sends.
	op.intent.rebase()
	if err := op.intent.update(func(b *intentBody) { b.Sent, b.At, b.Wall = nil, bootNow(), time.Now().UnixNano() }); err != nil {
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

// awaitStartup holds an operation o of the Client's own back until the
// replay New began is done (WithIntents): an intent it replays is older
// than o, and must not undo o's decision after o made it.
func (c *Client) awaitStartup(ctx context.Context, o request) error {
	if c.startup == nil {
		return nil
	}
	select {
	case <-c.startup.done:
		return nil
	case <-ctx.Done():
		return c.opError(o, "", 0, ctxErr(ctx, "waiting for the replay of the intents an earlier process left"))
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
