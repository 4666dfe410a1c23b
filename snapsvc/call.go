package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// The bounds of a call.
//
// Every public call of a Client — Start, Stop, Restart and their Async
// forms, EnsureRunning, EnsureStopped, Services, Changes, Change,
// AbortChange, WaitChange, WaitIdle, WaitActive, Operation.Wait — is one
// call value, made when it begins, and that value holds every bound the
// call has:
//
//   - its deadline: the caller's context's, and for operations and reads
//     also the end of the policy's MaxElapsedTime, counted from the call's
//     start (waits are bounded by their context alone: a change takes as
//     long as it takes);
//   - MaxUnreachable: a run of failures to reach snapd ends the call that
//     long after the run began (or after the call began, for a call that
//     joins a run already under way);
//   - MaxAttempts: the requests to act an operation may send (the reads
//     a read may send);
//   - the look-up reserve: a request to act leaves the last of the call's
//     time to look up its change should its answer still be pending.
//
// Every request the call sends takes its context from it (ctx, or actCtx
// for a request to act), every pause goes through sleep or pause, which
// never run past the call's give-up instant, and note is the one place
// where the call learns whether snapd can be reached. Nothing else
// computes a bound: the mechanisms an operation goes through (waiting out
// a blocker, finding a change whose answer was lost, waiting for its own
// change, reading the services' state) all run on the operation's call,
// and a wait shared with other callers (processwait.go) shares what it
// sees, never a bound.
//
// The policy's time is enforced as a deadline on every request, not
// only between attempts, so a snapd that accepts connections and never
// answers cannot hold a call. Nothing the call does is sent after its
// bound; what must still happen (looking up the change of a request cut
// off before its answer, so the next operation waits for it) runs in the
// background, owned by the Client and ended by Close.

// callKind selects the bounds that apply to a call.
type callKind int

const (
	// callOp: Start, Stop, Restart: every bound.
	callOp callKind = iota
	// callRead: a read: every bound; its reads are its attempts.
	callRead
	// callWait: a wait: the context and MaxUnreachable only.
	callWait
)

// call is one public call: its bounds and identity (see above).
type call struct {
	c    *Client
	kind callKind
	// ctx is the caller's context, ended also at the end of the policy's
	// MaxElapsedTime (on the real clock; on a test clock the policy's time
	// is checked at every pause instead).
	ctx    context.Context
	cancel context.CancelFunc
	parent context.Context // the caller's context (ctx without the policy's time)
	own    *call           // the call the operation's own change is waited on (ownChange), when not this one
	rt     *retrier        // attempts, backoff, the run of unreachability
	ev     Event           // the call's events' template: Op, Names
	log    *slog.Logger
	down   bool  // EventUnreachable sent, EventReachable owed
	last   error // the last failure seen, for a give-up's error
	flog   faultLog
	// A shared wait's watcher (processwait.go) sends no events: it publishes
	// what it sees (onNote), and each caller reports its own view.
	quiet  bool
	onNote func()
}

// newCall begins a call of kind on behalf of the caller's ctx. end must
// be called once the call returns.
func (c *Client) newCall(ctx context.Context, kind callKind, op string, names []string) *call {
	p := c.policy
	if kind == callWait {
		p.MaxElapsedTime = -1
		p.MaxAttempts = 0
	}
	k := &call{c: c, kind: kind, rt: newRetrier(p), ev: Event{Op: op, Names: names}, log: c.log(ctx), parent: ctx}
	k.ctx, k.cancel = boundBy(ctx, c.clock, p.MaxElapsedTime)
	return k
}

// newHoldCall begins the call of a restart budget hold that outlived its
// operation (budget_lifecycle.go): it never gives up on its own (no
// MaxElapsedTime, MaxUnreachable or attempts) and ends only with ctx
// (Close, a lost slot, BudgetOptions.MaxHold). It paces its retries with
// the policy's intervals.
func (c *Client) newHoldCall(ctx context.Context, o request) *call {
	p := c.policy
	p.MaxElapsedTime, p.MaxUnreachable, p.MaxAttempts = -1, -1, 0
	return &call{c: c, kind: callWait, rt: newRetrier(p), ev: Event{Op: o.action, Names: o.t.names}, log: c.log(ctx), ctx: ctx, cancel: func() {}, parent: ctx}
}

// end releases the call's resources.
func (k *call) end() {
	if k.own != nil {
		k.own.end()
	}
	k.cancel()
}

// ownChange returns the call on which an operation waits for the change
// snapd accepted for it (and, under a restart budget, for its services to
// be ready): k itself, or, when the policy's ChangeWait says so, a call
// bounded by the caller's context (ChangeWait < 0) or by ChangeWait from
// now, with the call's MaxUnreachable.
func (k *call) ownChange() *call {
	if k.own != nil {
		return k.own
	}
	cw := k.rt.policy().ChangeWait
	if cw == 0 || k.kind != callOp {
		return k
	}
	p := k.c.policy
	p.MaxElapsedTime, p.MaxAttempts = -1, 0
	if cw > 0 {
		p.MaxElapsedTime = cw
	}
	nk := &call{c: k.c, kind: callWait, rt: newRetrier(p), ev: k.ev, log: k.log, parent: k.parent}
	nk.ctx, nk.cancel = boundBy(k.parent, k.c.clock, p.MaxElapsedTime)
	k.own = nk
	return nk
}

// event is an Event of the call.
func (k *call) event(kind EventKind) Event {
	ev := k.ev
	ev.Kind = kind
	ev.Elapsed = k.rt.elapsed()
	if k.kind == callOp {
		ev.Attempt = k.rt.attempts()
	}
	return ev
}

// actCtx is the context of a request to act: the call's, ended
// lookupReserve (or a quarter of the time left) before its deadline, so
// that should the answer still be pending then, the rest of the call's
// time can go to looking up the change the request may have made.
func (k *call) actCtx() (context.Context, context.CancelFunc) {
	return reserveLookup(k.ctx)
}

// note records what a request to snapd met (err nil: an answer). It is
// the call's one view of whether snapd can be reached: a connection
// failure starts or continues a run of unreachability (EventUnreachable
// at its start), an answer ends it (EventReachable). A request that failed
// because the call's context ended says nothing about snapd.
func (k *call) note(err error) {
	if err != nil && k.ctx.Err() != nil {
		return
	}
	if err != nil {
		k.last = err
	}
	began := k.rt.note(err)
	if k.onNote != nil {
		k.onNote()
	}
	if k.quiet {
		return
	}
	if began {
		k.unreachable(err)
		return
	}
	k.reachable()
}

// noteSince is note for what a shared wait's watcher saw:
// snapd unreachable since since (zero: it answers), err its last failure.
// The run of unreachability counts for this call from since, or from the
// call's start if it began later.
func (k *call) noteSince(err error, since time.Time) {
	if since.IsZero() {
		k.rt.note(nil)
		k.reachable()
		return
	}
	if k.rt.noteSince(err, since) {
		k.last = err
		k.unreachable(err)
	}
}

// awaitNews waits for news (a shared wait's facts changed), within the
// call's bounds: it returns nil on news, or the call's end.
func (k *call) awaitNews(news <-chan struct{}) error {
	var giveUp <-chan time.Time
	if left, ok := k.left(); ok {
		t := k.c.clock.NewTimer(left)
		defer t.Stop()
		giveUp = t.C()
	}
	select {
	case <-news:
		return nil
	case <-giveUp:
		if err := k.exhausted(nil); err != nil {
			return err
		}
		return nil
	case <-k.ctx.Done():
		return interrupted(k.ctx, k.last)
	}
}

// unreachable reports the start of a run of unreachability.
func (k *call) unreachable(err error) {
	k.down = true
	ev := k.event(EventUnreachable)
	ev.Err = err
	if ce, ok := asConnectionError(err); ok {
		ev.Socket = ce.Socket
	}
	ev.GiveUpAt = k.giveUpAt()
	if k.redials() {
		k.log.Info("snapd unreachable; retrying", "socket", ev.Socket, "until", ev.GiveUpAt, "error", err)
	} else {
		k.log.Info("snapd unreachable; the call's bound leaves no time to try again", "socket", ev.Socket, "error", err)
	}
	k.c.events.emit(ev)
}

// redials reports whether the call, having failed to reach snapd, will
// try again: whether a RedialInterval fits before its give-up instant
// (a shorter pause would end in the give-up, see sleep).
func (k *call) redials() bool {
	if k.rt.exhausted(nil) != "" {
		return false
	}
	left, bounded := k.left()
	return !bounded || left > k.rt.policy().RedialInterval
}

// reachable reports the end of a run of unreachability, if one was
// reported.
func (k *call) reachable() {
	if !k.down {
		return
	}
	if _, still := k.rt.unreachable(); still {
		return
	}
	k.down = false
	k.c.events.emit(k.event(EventReachable))
}

// giveUpAt is when the call gives up trying to reach snapd: the earlier
// of the end of MaxUnreachable (while snapd is unreachable) and the call's
// deadline; zero when neither applies.
func (k *call) giveUpAt() time.Time {
	at, _ := k.rt.unreachableDeadline()
	if dl, ok := k.ctx.Deadline(); ok && (at.IsZero() || dl.Before(at)) {
		at = dl
	}
	return at
}

// exhausted returns a *gaveUpError wrapping last when the call may send
// nothing more: its attempts, its policy's time or its MaxUnreachable ran
// out.
func (k *call) exhausted(last error) error {
	if last == nil {
		last = k.last
	}
	reason := k.rt.exhausted(last)
	if reason == "" {
		return nil
	}
	if last == nil {
		last = ErrGaveUp
	}
	return &gaveUpError{reason: reason, last: last}
}

// left returns how long until the call's give-up instant on the client's
// clock (the end of the policy's time, or of MaxUnreachable while snapd is
// unreachable), and false when nothing but the context bounds it.
func (k *call) left() (time.Duration, bool) {
	d, ok := k.rt.remaining()
	if at, down := k.rt.unreachableDeadline(); down {
		u := at.Sub(k.c.clock.Now())
		if !ok || u < d {
			d, ok = u, true
		}
	}
	return max(d, 0), ok
}

// sleep pauses for d on the client's clock, cut short at the call's
// give-up instant. It returns nil once d has passed, a *gaveUpError when
// the call's time ran out first, and the context's end (interrupted, with
// the last failure) when it ended first.
func (k *call) sleep(d time.Duration) error {
	cut := false
	if left, ok := k.left(); ok && left <= d {
		d, cut = left, true
	}
	if err := retry.Sleep(k.ctx, k.c.clock, d); err != nil {
		return interrupted(k.ctx, k.last)
	}
	if cut {
		if err := k.exhausted(nil); err != nil {
			return err
		}
	}
	return nil
}

// pause waits before trying again after last failed: RedialInterval while
// snapd is unreachable, the policy's backoff otherwise (capped at
// MaxConflictInterval for a conflict that cannot be watched), never past
// the call's give-up instant. Its error is the call's end (see sleep).
func (k *call) pause(last error) error {
	if last != nil {
		k.last = last
	}
	if err := k.exhausted(last); err != nil {
		return err
	}
	var d time.Duration
	switch {
	case k.unreachableNow():
		d = k.rt.redialPause()
	case nextStep(acting, last) == waitOut:
		d = k.rt.conflictPause()
	default:
		d = k.rt.nextPause()
	}
	return k.sleep(d)
}

// unreachableNow reports whether the call's last request found snapd
// unreachable.
func (k *call) unreachableNow() bool {
	_, down := k.rt.unreachable()
	return down
}

// read runs f, a request that only reads, until it answers, fails for
// another reason than an unreachable or restarting snapd (retry.Transient:
// no socket, nobody listening, kind daemon-restart or system-restart, a
// garbled answer), or the call's bounds end. A read whose answer was lost
// (retry.Indeterminate, as a snapctl listing sent by POST can be) is asked
// again too: asking twice changes nothing. It is how every read rides out
// a snapd restart, in every mode. In a read call each try is an attempt
// (MaxAttempts).
func (k *call) read(what string, f func(ctx context.Context) error) error {
	return k.request(what, reading, f)
}

// act runs f, a request to act outside an operation (AbortChange), as
// read does, except that a request whose answer was lost is never sent
// again (it may have been carried out): that fails with an error matching
// ErrOutcomeUnknown, and the call's bound when that is what cut it.
func (k *call) act(what string, f func(ctx context.Context) error) error {
	return k.request(what, acting, f)
}

// request sends f until it answers, or the retry rule (retryrule.go) or
// the call's bounds end it. A request to act outside an operation has no
// look-up: a lost answer leaves its outcome unknown.
func (k *call) request(what string, kind requestKind, f func(ctx context.Context) error) error {
	for {
		if k.kind == callRead {
			k.rt.attempt()
		}
		err := f(k.ctx)
		k.note(err)
		if err == nil {
			return nil
		}
		switch nextStep(kind, err) {
		case askAgain:
		case lookUp:
			return &outcomeUnknownError{reason: what + ": snapd's answer was lost (it may have been carried out; not sent again)", last: err}
		default:
			return err
		}
		if k.ctx.Err() != nil {
			return interrupted(k.ctx, err)
		}
		k.log.Debug("request failed; asking again", "what", what, "error", err)
		if perr := k.pause(err); perr != nil {
			return perr
		}
	}
}

// asConnectionError returns err's *snapd.ConnectionError, if any.
func asConnectionError(err error) (*snapd.ConnectionError, bool) {
	var ce *snapd.ConnectionError
	ok := errors.As(err, &ce)
	return ce, ok
}

// callOf runs f as one call of kind: the public methods that are not
// operations use it.
func (c *Client) callOf(ctx context.Context, kind callKind, op string, names []string, f func(k *call) error) error {
	k := c.newCall(ctx, kind, op, names)
	defer k.end()
	return f(k)
}

// policyTimeError is the cause of a context ended by the policy's
// MaxElapsedTime. It matches ErrGaveUp.
type policyTimeError struct{ d time.Duration }

func (e *policyTimeError) Error() string {
	return fmt.Sprintf("gave up after %v (the policy's MaxElapsedTime)", e.d)
}

func (e *policyTimeError) Is(target error) bool { return target == ErrGaveUp }

// reserveLookup returns ctx ended lookupReserve (or a quarter of the time
// left) before its deadline, for a request to act.
func reserveLookup(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	reserve := min(lookupReserve, time.Until(dl)/4)
	return context.WithDeadline(ctx, dl.Add(-reserve))
}

// deadlineCauseKey carries the cause of a call's deadline (bound).
type deadlineCauseKey struct{}

// deadlineCause returns why ctx ended, or will end at its deadline: the
// policy's time when bound set the earlier deadline, else the context's.
func deadlineCause(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if err, ok := ctx.Value(deadlineCauseKey{}).(error); ok {
		return err
	}
	return context.DeadlineExceeded
}

// boundBy returns ctx ended also after d (d <= 0: no bound) on the real
// clock.
func boundBy(ctx context.Context, clock retry.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	if clock != nil && clock != retry.RealClock() {
		// A test's clock (WithClock) drives the pauses, and its timers
		// may fire at once: the policy's time is then checked between
		// attempts only.
		return ctx, func() {}
	}
	at := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && !at.Before(dl) {
		return ctx, func() {} // the caller's deadline comes first
	}
	cause := &policyTimeError{d: d}
	ctx = context.WithValue(ctx, deadlineCauseKey{}, error(cause))
	return context.WithDeadlineCause(ctx, at, cause)
}
