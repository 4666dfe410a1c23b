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

// Flights in machine scope (share.go says the rule; records.go, what a
// record is). The leader of a process's identical restarts
// (processflight.go) enters the machine's flight for its request before it
// waits for the snap's lock: the record SNAP.HASH.flight (HASH: of the
// mode, cookie, hook and request).
//
//   - With none under way, it makes the record and leads the flight: the
//     record says "open" until the request is about to be sent, "sent"
//     from right before each attempt, "open" again after an attempt that
//     provably did nothing (refused by a conflict, or never written), and
//     at last the outcome, before the leader lets go of it.
//   - With one under way and open, it joins: it sends nothing, and waits
//     for the outcome within its own bounds. A change Done, or a
//     *ChangeError, is every joiner's outcome, with the same change id;
//     any other end of the leader's (its own bound, an unknown outcome, a
//     leader killed or stopped) says nothing of the joiner's, which enters
//     anew and acts itself.
//   - With one under way and sent, it waits until it is open again (its
//     request refused by a conflict), then joins, or until it is over,
//     then enters anew.
//
// A restart joins only on a phase read open after this process's
// identical restarts stopped joining it (closeFlight): the other
// process's request may be sent the moment after its phase was read, and
// a restart of this process whose call begins then must not take that
// request's change for its own.

// Phases of a machine flight.
const (
	flightOpen = "open" // the leader's request is not being sent: joinable
	flightSent = "sent" // the request is being sent, or may have acted
	flightDone = "done" // the outcome is in
)

// flightRecord is the body of a flight's record.
type flightRecord struct {
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

// flightPath is the record of the flight of restarts made with key on
// snap.
func (m machine) flightPath(snap, key string) string {
	sum := sha256.Sum256([]byte(key)) // the key holds the snap's cookie: never in clear
	return m.dirs.path(snap, "."+hex.EncodeToString(sum[:8])+flightSuffix)
}

// leadFlight is a flight this operation leads.
type leadFlight struct {
	rec   *heldRecord
	peers string // the snap's peers lock
	phase string
	gone  bool // abandoned (or its leader deposed): its joiners act themselves
}

// joinedFlight is another process's flight this operation joined, or
// waits to join.
type joinedFlight struct {
	p      *peerRecord
	joined bool // its request had not been sent when it was read
}

// enterFlight leads a new flight for key on snap, or finds the one under
// way, for awaitFlight: to join while its request is not being sent, or
// to enter anew once it is over (enterRecord: in the background, bounded
// by ctx).
func (m machine) enterFlight(ctx context.Context, bg *background, snap, key string) (*leadFlight, *joinedFlight, error) {
	own, peer, err := m.enterRecord(ctx, bg, snap, m.flightPath(snap, key), func(recordFrame, bool) any {
		return flightRecord{Phase: flightOpen}
	})
	switch {
	case err != nil:
		return nil, nil, err
	case peer != nil:
		return nil, &joinedFlight{p: peer}, nil
	}
	return &leadFlight{rec: own, peers: m.dirs.path(snap, peersSuffix), phase: flightOpen}, nil, nil
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
func (f *leadFlight) set(bg *background, phase string) {
	if f == nil || f.gone || f.phase == phase {
		return
	}
	if err := f.rec.publish(flightRecord{Phase: phase}); err != nil {
		f.gone = true
		f.rec.end(bg, f.peers, nil, false)
		return
	}
	f.phase = phase
}

// finish publishes the leader's outcome and lets go of the flight's
// record (removed in the background, bg): its joiners read the outcome on
// their own bounds.
func (f *leadFlight) finish(bg *background, res *Result, err error) {
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
	f.rec.end(bg, f.peers, flightRecord{Phase: flightDone, Outcome: out}, true)
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
			lead.finish(c.bg, res, err)
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
		if ok && rec.Phase == flightOpen && !fl.joined && st == peerLive {
			// The request may be sent the moment after its phase was
			// read: callers of this process that joined this one since
			// (processflight.go) began after that moment. This process's
			// flight closes first (those that come from now on lead their
			// own), then the phase is read again: open still, the request
			// is sent after every joiner's call began.
			op.closeFlight()
			if rec, ok, st = fl.read(); ok && rec.Phase == flightOpen && st == peerLive {
				fl.joined = true
				k.log.Debug("joining an identical restart of another process, not sent yet")
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
	// The change restarted the services for this process's callers too:
	// its next restart of them keeps its distance (WithMinRestartInterval).
	c.interval.record(o)
	if out.Failed != nil {
		return nil, c.opError(o, out.ChangeID, out.Attempts, out.failure()), true
	}
	return &Result{ChangeID: out.ChangeID, Status: out.Status, Attempts: out.Attempts, Conflicts: out.Conflicts,
		WaitedFor: slices.Clone(out.WaitedFor), Shared: true}, nil, true
}
