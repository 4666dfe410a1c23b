package snapsvc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Flights in machine scope (share.go says the rule). A restart joins a
// flight read open only after this process's identical restarts stopped
// joining it (flight.close): the other process's request may be sent the
// moment after, and a restart of this process whose call begins then must
// not take that request's change for its own.

// Phases of a machine flight.
const (
	flightOpen = "open" // the leader's request is not being sent: joinable
	flightSent = "sent" // the request is being sent, or may have acted
	flightDone = "done" // the outcome is in
)

// flightRecord is the body of a flight's record.
type flightRecord struct {
	Phase string `json:"phase"`
	// Budgeted says the leader holds restart budget slots for its
	// restart, fenced before its request: only then may a budgeted
	// restart join it (share.go).
	Budgeted bool           `json:"budgeted,omitempty"`
	Outcome  *flightOutcome `json:"outcome,omitempty"`
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
	Refused   int          `json:"refused,omitempty"`
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

// flightPath is the record of the flight of restarts made with key on
// snap.
func (m machine) flightPath(snap, key string) string {
	sum := sha256.Sum256([]byte(key)) // the key holds the snap's cookie: never in clear
	return m.dirs.path(snap, "."+hex.EncodeToString(sum[:8])+flightSuffix)
}

// leadFlight is a flight this operation leads. Its record is made only
// once the leader is about to wait (for the snap's lock, or out a blocker):
// until then its request goes out at once, and nobody could join it in
// time, so an uncontended restart makes no file.
type leadFlight struct {
	budgeted   bool // the leader holds restart budget slots (flightRecord.Budgeted)
	m          machine
	bg         *background
	snap, path string
	rec        *heldRecord // nil until opened
	phase      string
	gone       bool // abandoned, or another process's found: its joiners (none) act themselves
}

// joinedFlight is another process's flight this operation joined, or
// waits to join.
type joinedFlight struct {
	p      *peerRecord
	joined bool // its request had not been sent when it was read
}

// findFlight returns the flight of another process for key on snap this
// restart may join: one whose record a live leader holds. With none, the
// restart leads its own.
func (m machine) findFlight(snap, key string) *joinedFlight {
	p, err := openPeer(m.flightPath(snap, key))
	if err != nil {
		return nil
	}
	if _, _, st := p.look(); st == peerGone {
		p.close()
		return nil
	}
	return &joinedFlight{p: p}
}

// open makes the flight's record, its phase open, as its leader is about
// to wait, within ctx: identical restarts of the machine's other processes
// may join it meanwhile. Where another process's flight is found there (it
// began leading while this one did), it returns it: this leader's request
// is not sent, and it joins that flight instead (a *joinInstead, from the
// phase that was about to wait). Where the record cannot be made, the
// leader goes on alone.
func (f *leadFlight) open(ctx context.Context) error {
	if f == nil || f.rec != nil || f.gone {
		return nil
	}
	own, peer, err := f.m.enterRecord(ctx, f.bg, f.snap, f.path, func(recordFrame, bool) any {
		return flightRecord{Phase: flightOpen, Budgeted: f.budgeted}
	})
	switch {
	case peer != nil:
		f.gone = true
		return &joinInstead{fl: &joinedFlight{p: peer}}
	case err != nil:
		f.gone = true
		return nil
	}
	f.rec, f.phase = own, flightOpen
	return nil
}

// joinInstead ends the acting of a restart that leads its flight but found
// another process's identical flight as it was about to wait, its own
// request not sent: it joins that flight (mergeMachine).
type joinInstead struct{ fl *joinedFlight }

func (*joinInstead) Error() string {
	return "an identical restart of another process is under way: joining it"
}

// testHookFlightRead is called when a restart has read the phase of
// another process's flight it may join, before it acts on it
// (export_test.go).
var testHookFlightRead = func(phase string) {}

// read reads a flight's record: its body (ok false: none readable,
// or of another boot) and what the reader makes of its leader.
func (fl *joinedFlight) read() (rec flightRecord, ok bool, st peerState) {
	fr, fok, st := fl.p.look()
	ok = fok && fr.body(&rec)
	return rec, ok, st
}

// set writes the flight's phase, if it changes. Should that fail (or its
// leader have been deposed), the flight is abandoned (its record let go
// of, and left to whoever comes next): a joiner must never believe unsent
// a request that was sent.
func (f *leadFlight) set(phase string) {
	if f == nil || f.gone || f.phase == phase {
		return
	}
	f.phase = phase
	if f.rec == nil {
		return // not opened: nobody joined
	}
	if err := f.rec.publish(flightRecord{Phase: phase, Budgeted: f.budgeted}); err != nil {
		f.gone = true
		f.rec.end(f.bg, f.m.dirs.path(f.snap, peersSuffix), nil, false)
	}
}

// finish publishes the leader's outcome and lets go of the flight's
// record (removed in the background, bg): its joiners read the outcome on
// their own bounds.
func (f *leadFlight) finish(res *Result, err error) {
	if f.gone || f.rec == nil {
		return
	}
	out := &flightOutcome{}
	var ce *ChangeError
	switch {
	case err == nil && res != nil:
		out.Shared = true
		out.ChangeID, out.Status, out.Attempts, out.Conflicts, out.Refused, out.WaitedFor = res.ChangeID, res.Status, res.Attempts, res.Conflicts, res.Refused, res.WaitedFor
	case errors.As(err, &ce):
		out = sharedFailure(err, ce)
	}
	f.rec.end(f.bg, f.m.dirs.path(f.snap, peersSuffix), flightRecord{Phase: flightDone, Budgeted: f.budgeted, Outcome: out}, true)
}

// ---- the operation's side ----

// mergeMachine is the merge phase of a restart that leads its process's
// identical restarts (processflight.go), merged with the machine's: it joins
// another process's flight, or leads a flight of its own.
func (op *operation) mergeMachine(key string) (*Result, error) {
	c, o := op.c, op.o
	if !c.machine.shares(o) {
		res, _, err := op.act(true)
		return res, err
	}
	snap := o.t.snaps[0]
	fl := c.machine.findFlight(snap, key)
	for {
		if fl != nil {
			res, err, ended := op.awaitFlight(fl)
			switch {
			case ended:
				return res, err
			case op.alone:
				res, _, err := op.act(true) // a budgeted restart that may not join it
				return res, err
			}
			fl = c.machine.findFlight(snap, key) // look anew: lead, or join another
			continue
		}
		lead := &leadFlight{budgeted: op.hold != nil, m: c.machine, bg: c.bg, snap: snap, path: c.machine.flightPath(snap, key), phase: flightOpen}
		op.lead = lead
		res, _, err := op.act(true)
		op.lead = nil
		var ji *joinInstead
		if errors.As(err, &ji) {
			fl = ji.fl
			continue
		}
		lead.finish(res, err)
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
	defer fl.p.close()
	snap := o.t.snaps[0]
	w := c.machine.dirs.watch(snap)
	for first := true; ; first = false {
		var mark uint64
		watched := w.open()
		if watched {
			mark = w.mark()
		}
		rec, ok, st := fl.read()
		testHookFlightRead(rec.Phase)
		if ok && rec.Phase == flightOpen && !fl.joined && st == peerLive && !op.mayJoin(rec.Budgeted) {
			k.log.Debug("an identical restart of another process runs unbudgeted: this budgeted one acts on its own slot")
			op.alone = true
			return nil, nil, false
		}
		if ok && rec.Phase == flightOpen && !fl.joined && st == peerLive {
			// The request may be sent the moment after its phase was
			// read: callers of this process that joined this one since
			// (processflight.go) began after that moment. This process's
			// flight closes first (those that come from now on lead their
			// own), then the phase is read again: open still, the request
			// is sent after every joiner's call began.
			op.flight.close()
			if rec, ok, st = fl.read(); ok && rec.Phase == flightOpen && st == peerLive {
				fl.joined = true
				k.log.Debug("joining an identical restart of another process, not sent yet")
				c.events.emit(k.event(EventJoined))
			}
		}
		switch {
		case ok && rec.Phase == flightDone && fl.joined:
			return op.flightOutcome(rec.Outcome)
		case st == peerGone:
			// Its leader let go without an outcome for this one (it gave
			// up, or died), or it was over before this one could join.
			k.log.Debug("the identical restart of another process is over without an outcome for this one; entering anew")
			return nil, nil, false
		case st == peerSilent:
			k.log.Info("the process that leads an identical restart has stopped (no beat for " + peerSilence.String() + "); entering anew")
			if _, err := fl.p.depose(k.ctx, c.machine.dirs.path(snap, peersSuffix)); err != nil && k.ctx.Err() == nil {
				k.log.Debug("cannot take the place of a stopped leader", "error", err)
			}
			return nil, nil, false
		case first && !fl.joined:
			k.log.Debug("an identical restart of another process is being sent; waiting until it can be joined or is over")
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
	if op.hold != nil {
		op.hold.joinedAct() // its change restarted the services under this slot too (fenced before joining)
	}
	// The change restarted the services for this process's callers too:
	// its next restart of them keeps its distance (WithMinRestartInterval).
	c.interval.record(o)
	if out.Failed != nil {
		return nil, c.opError(o, out.ChangeID, out.Attempts, out.failure()), true
	}
	return &Result{ChangeID: out.ChangeID, Status: out.Status, Attempts: out.Attempts, Conflicts: out.Conflicts, Refused: out.Refused,
		WaitedFor: slices.Clone(out.WaitedFor), Shared: true}, nil, true
}
