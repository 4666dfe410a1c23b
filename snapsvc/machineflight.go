package snapsvc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/snapsvc/snapsvc/internal/flock"
	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Identical restarts merged across the processes of a machine. In a
// process, identical restarts waiting for a snap's lock merge (processflight.go);
// across processes they merge through the lock directory, by one rule: a
// restart joins another's only while that one's request has not been
// sent, so the restart still happens after the joiner's call began.
//
// The in-process leader of a restart (processflight.go) enters the machine's
// flight for its request (<snap>.<hash of mode, cookie and request>.flight)
// before it waits for the snap's lock:
//
//   - with none under way, it creates the flight, its file made with the
//     leader's lock held from the start (flock.Create), and leads it: its
//     file says "open" until the request is about to be sent, "sent" from
//     right before each attempt, "open" again after an attempt that
//     provably did nothing (refused by a conflict, or never written), and
//     at last the outcome, before the leader removes the file and lets go
//     of its lock;
//   - with one under way and open, it joins: it sends nothing, and waits
//     for the outcome (inotify on the lock directory, and every poll
//     interval whether the leader let go of its lock, within its own
//     call's bounds). A change Done, or a *ChangeError, is every joiner's
//     outcome, with the same change id; any other end of the leader's (its
//     own bound, an unknown outcome, a leader killed: its lock let go with
//     no outcome) says nothing of the joiner's, which acts itself;
//   - with one under way and sent, it waits until it is open again (its
//     request refused by a conflict), then joins, or until it is over,
//     then enters anew.
//
// A restart joins only on a phase read open after this process's
// identical restarts stopped joining it (closeFlight): the other
// process's request may be sent the moment after its phase was read, and
// a restart of this process whose call begins then must not take that
// request's change for its own.
//
// Entering is serialised per snap by a short lock (<snap>.flights), held
// while a flight is looked up, created or found abandoned and removed;
// the leader rewrites its file in place without it, and a reader checks
// what it read (a checksum) and reads again if it met a write halfway.
// Restarts from a hook, of several snaps, without a lock directory or on a
// caller's clock take no part, as in machinewait.go.

const (
	flightSuffix  = ".flight"
	flightsSuffix = ".flights"
)

// Phases of a machine flight.
const (
	flightOpen = "open" // the leader's request is not being sent: joinable
	flightSent = "sent" // the request is being sent, or may have acted
	flightDone = "done" // the outcome is in
)

// flightRecord is the content of a flight's file.
type flightRecord struct {
	Leader  int            `json:"leader"` // the leader's process
	Phase   string         `json:"phase"`
	Outcome *flightOutcome `json:"outcome,omitempty"`
}

// flightOutcome is how the leader's restart ended.
type flightOutcome struct {
	// Shared says the outcome is the change's own (Done, or failed), which
	// every joiner shares; anything else is the leader's alone.
	Shared    bool         `json:"shared"`
	ChangeID  string       `json:"change,omitempty"`
	Status    string       `json:"status,omitempty"`
	Attempts  int          `json:"attempts,omitempty"`
	Conflicts int          `json:"conflicts,omitempty"`
	WaitedFor []string     `json:"waited-for,omitempty"`
	Failed    *ChangeError `json:"failed,omitempty"` // the change's failure
	// Answer is snapd's answer that reported the failure, where the
	// leader's error holds it beside Failed (snapctl's "cannot perform
	// the following tasks": changeFailure, matching.go), so that a
	// joiner's error is the leader's for errors.Is and errors.As.
	Answer *flightAnswer `json:"answer,omitempty"`
}

// flightAnswer is a *snapd.Error as a flight's file holds it.
type flightAnswer struct {
	Method      string             `json:"method,omitempty"`
	Path        string             `json:"path,omitempty"`
	StatusCode  int                `json:"status-code,omitempty"`
	Kind        string             `json:"kind,omitempty"`
	Value       json.RawMessage    `json:"value,omitempty"`
	Message     string             `json:"message,omitempty"`
	Maintenance *snapd.Maintenance `json:"maintenance,omitempty"`
}

// sharedFailure returns, for a leader's error err that is its change's
// failure (a *ChangeError), the outcome its joiners share: the change's
// failure, snapd's answer beside it if any, and the attempts and change
// the leader's *OpError names.
func sharedFailure(err error, ce *ChangeError) *flightOutcome {
	out := &flightOutcome{Shared: true, Failed: ce, ChangeID: ce.ID}
	var oe *OpError
	if errors.As(err, &oe) {
		out.Attempts, out.ChangeID = oe.Attempts, oe.ChangeID
	}
	var ans *snapd.Error
	if errors.As(err, &ans) {
		out.Answer = &flightAnswer{Method: ans.Method, Path: ans.Path, StatusCode: ans.StatusCode, Kind: ans.Kind,
			Value: ans.Value, Message: ans.Message, Maintenance: ans.Maintenance}
	}
	return out
}

// failure is the cause of a joiner's error for the failure out shares,
// as its leader's error has it: the change's failure, joined with
// snapd's answer where the leader's holds one.
func (out *flightOutcome) failure() error {
	if a := out.Answer; a != nil {
		return errors.Join(out.Failed, &snapd.Error{Method: a.Method, Path: a.Path, StatusCode: a.StatusCode, Kind: a.Kind,
			Value: a.Value, Message: a.Message, Maintenance: a.Maintenance})
	}
	return out.Failed
}

// encodeFlight is a record as written: JSON, a newline, its checksum.
func encodeFlight(rec flightRecord) []byte {
	b, _ := json.Marshal(rec)
	return fmt.Appendf(b, "\n%08x", crc32.ChecksumIEEE(b))
}

// decodeFlight reads a record written by encodeFlight; false for one read
// halfway through a write (or not a record at all).
func decodeFlight(b []byte) (flightRecord, bool) {
	var rec flightRecord
	i := strings.LastIndexByte(string(b), '\n')
	if i < 0 || fmt.Sprintf("%08x", crc32.ChecksumIEEE(b[:i])) != string(b[i+1:]) || json.Unmarshal(b[:i], &rec) != nil {
		return rec, false
	}
	return rec, true
}

// maxFlightSize bounds what is read of a flight's file.
const maxFlightSize = 64 << 10

// flightPath is the file of the flight of restarts made with key on snap.
func (m machine) flightPath(snap, key string) string {
	sum := sha256.Sum256([]byte(key)) // the key holds the snap's cookie: never in clear
	return filepath.Join(m.dir, snap+"."+hex.EncodeToString(sum[:8])+flightSuffix)
}

// leadFlight is a flight this operation leads.
type leadFlight struct {
	lock  *flock.Lock
	phase string
	gone  bool // abandoned: its joiners act themselves
}

// joinedFlight is another process's flight this operation joined, or
// waits to join.
type joinedFlight struct {
	h      *flock.Held
	joined bool // its request had not been sent when it was read
}

// enterFlight is enterFlightNow bounded by ctx: the files it creates and
// removes in the lock directory wait for the file system's journal, tens
// of milliseconds on a disk busy with fsyncs, and the call must not wait
// past its bound for them. It runs in the background (bg); should ctx end
// first, the flight entered late is let go of there (a lead flight
// removed, a joined one closed) once the file system is done.
func (m machine) enterFlight(ctx context.Context, bg *background, snap, key string) (*leadFlight, *joinedFlight, error) {
	type entered struct {
		lead *leadFlight
		join *joinedFlight
		err  error
	}
	done := make(chan entered) // unbuffered: handed over, or cleaned up once abandoned
	abandoned := make(chan struct{})
	bg.run(func() {
		lead, join, err := m.enterFlightNow(ctx, snap, key)
		select {
		case done <- entered{lead, join, err}:
		case <-abandoned:
			switch {
			case lead != nil:
				_ = lead.lock.Remove()
			case join != nil:
				join.h.Close()
			}
		}
	})
	select {
	case e := <-done:
		return e.lead, e.join, e.err
	case <-ctx.Done():
		close(abandoned)
		return nil, nil, ctx.Err()
	}
}

// enterFlightNow leads a new flight for key on snap, or finds the one under
// way, for awaitFlight: to join while its request is not being sent, or
// to enter anew once it is over.
func (m machine) enterFlightNow(ctx context.Context, snap, key string) (*leadFlight, *joinedFlight, error) {
	l, err := flock.Acquire(ctx, filepath.Join(m.dir, snap+flightsSuffix))
	if err != nil {
		return nil, nil, err
	}
	defer l.Unlock()
	path := m.flightPath(snap, key)
	h, err := flock.Open(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, nil, err
	default:
		free, err := h.Released()
		if err == nil && !free {
			return nil, &joinedFlight{h: h}, nil
		}
		h.Close()
		if err != nil {
			return nil, nil, err
		}
		// Its leader let go without removing it: killed, say.
		if _, err := flock.RemoveReleased(path); err != nil {
			return nil, nil, err
		}
	}
	fl, err := flock.Create(path, encodeFlight(flightRecord{Leader: os.Getpid(), Phase: flightOpen}))
	if err != nil {
		return nil, nil, err
	}
	return &leadFlight{lock: fl, phase: flightOpen}, nil, nil
}

// testHookFlightRead is called when a restart has read the phase of
// another process's flight it may join, before it acts on it
// (export_test.go).
var testHookFlightRead = func(phase string) {}

// readFlight reads a flight's record, again while it meets a write
// halfway (a rewrite takes microseconds).
func readFlight(h *flock.Held) (flightRecord, bool) {
	for range 100 {
		b, err := h.Read(maxFlightSize)
		if err != nil {
			return flightRecord{}, false
		}
		if rec, ok := decodeFlight(b); ok {
			return rec, true
		}
	}
	return flightRecord{}, false
}

// set writes the flight's phase, if it changes. Should that fail, the
// flight is abandoned (its lock let go of, its file left to whoever comes
// next): a joiner must never believe unsent a request that was sent.
func (f *leadFlight) set(phase string) {
	if f == nil || f.gone || f.phase == phase {
		return
	}
	if err := f.lock.Rewrite(encodeFlight(flightRecord{Leader: os.Getpid(), Phase: phase})); err != nil {
		f.gone = true
		_ = f.lock.Unlock()
		return
	}
	f.phase = phase
}

// finish publishes the leader's outcome, then removes the flight and lets
// go of its lock, waiting for that only until ctx ends (the rest happens in
// the background, bg): the call has its outcome, and a rewrite or an unlink
// may wait for the file system's journal. Its joiners wait for the outcome
// on their own bounds.
func (f *leadFlight) finish(ctx context.Context, bg *background, res *Result, err error) {
	if f.gone {
		return
	}
	out := &flightOutcome{}
	var ce *ChangeError
	switch {
	case err == nil && res != nil:
		out.Shared = true
		out.ChangeID, out.Status, out.Attempts, out.Conflicts, out.WaitedFor = res.ChangeID, res.Status, res.Attempts, res.Conflicts, res.WaitedFor
	case errors.As(err, &ce):
		out = sharedFailure(err, ce)
	}
	record := encodeFlight(flightRecord{Leader: os.Getpid(), Phase: flightDone, Outcome: out})
	work := func(context.Context) {
		_ = f.lock.Rewrite(record)
		_ = f.lock.Remove()
	}
	bg.doAwaited(ctx, interruptGrace, work)
}

// ---- the operation's side ----

// mergeMachine is the merge phase of a restart that leads its process's
// identical restarts (processflight.go), merged with the machine's: it joins
// another process's flight, or leads a flight of its own.
func (op *operation) mergeMachine(key string) (*Result, error) {
	c, k, o := op.c, op.k, op.o
	if !c.machine.shares(o) {
		res, _, err := op.act(true)
		return res, err
	}
	snap := o.t.snaps[0]
	for {
		lead, fl, err := c.machine.enterFlight(k.ctx, c.bg, snap, key)
		switch {
		case err != nil && k.ctx.Err() != nil:
			return nil, c.opError(o, "", 0, ctxErr(k.ctx, "waiting for the machine's identical restarts"))
		case err != nil:
			k.log.Debug("cannot merge with the machine's identical restarts", "error", err)
		case fl != nil:
			res, err, ended := op.awaitFlight(fl)
			if ended {
				return res, err
			}
			continue // enter anew: lead, or join another
		case lead != nil:
			k.log.Debug("leading the machine's identical restarts until the request is sent")
			op.lead = lead
			res, _, err := op.act(true)
			op.lead = nil
			lead.finish(k.ctx, c.bg, res, err)
			return res, err
		}
		res, _, err := op.act(true)
		return res, err
	}
}

// awaitFlight follows another process's flight for the restart, within
// the call's bounds, sending nothing: it joins the flight while its
// request is not being sent, and takes the outcome of a flight it joined
// when that is the change's (Done, or failed). ended is false when the
// restart must enter anew: the flight ended before it could join, its
// leader ended without its change's outcome, or died.
func (op *operation) awaitFlight(fl *joinedFlight) (res *Result, err error, ended bool) {
	c, k, o := op.c, op.k, op.o
	defer fl.h.Close()
	w := c.machine.watch
	for first := true; ; first = false {
		var mark uint64
		watched := w.open()
		if watched {
			mark = w.mark()
		}
		rec, ok := readFlight(fl.h)
		testHookFlightRead(rec.Phase)
		if ok && rec.Phase == flightOpen && !fl.joined {
			// The request may be sent the moment after its phase was
			// read: callers of this process that joined this one since
			// (processflight.go) began after that moment. This process's flight
			// closes first (those that come from now on lead their own),
			// then the phase is read again: open still, the request is
			// sent after every joiner's call began.
			op.closeFlight()
			if rec, ok = readFlight(fl.h); ok && rec.Phase == flightOpen {
				fl.joined = true
				k.log.Debug("joining an identical restart of another process, not sent yet")
			}
		}
		switch {
		case ok && rec.Phase == flightDone && fl.joined:
			return op.flightOutcome(rec.Outcome)
		case first && !fl.joined:
			k.log.Debug("an identical restart of another process is being sent; waiting until it can be joined or is over")
		}
		if free, err := fl.h.Released(); err != nil || free {
			// Let go of: the outcome may have come just before; else its
			// leader died, or it was over before this one could join.
			if rec, ok = readFlight(fl.h); ok && rec.Phase == flightDone && fl.joined {
				return op.flightOutcome(rec.Outcome)
			}
			k.log.Debug("the identical restart of another process is over without an outcome for this one; entering anew")
			return nil, nil, false
		}
		if err := op.awaitLockDir(watched, mark, false); err != nil {
			return nil, c.opError(o, "", 0, ctxErr(k.ctx, "waiting for an identical restart of another process")), true
		}
	}
}

// flightOutcome turns a flight's outcome into the joiner's result, when
// the outcome is the change's (ended); else the joiner must act.
func (op *operation) flightOutcome(out *flightOutcome) (*Result, error, bool) {
	c, k, o := op.c, op.k, op.o
	if out == nil || !out.Shared {
		k.log.Debug("the identical restart of another process ended without its change's outcome; entering anew")
		return nil, nil, false
	}
	k.log.Debug("restart merged into an identical restart of another process", "change", out.ChangeID)
	// The change restarted the services for this process's callers too:
	// its next restart of them keeps its distance (WithMinRestartInterval).
	c.interval.record(o)
	if out.Failed != nil {
		return nil, c.opError(o, out.ChangeID, out.Attempts, out.failure()), true
	}
	return &Result{ChangeID: out.ChangeID, Status: out.Status, Attempts: out.Attempts, Conflicts: out.Conflicts,
		WaitedFor: slices.Clone(out.WaitedFor), Shared: true}, nil, true
}
