package snapsvc

import "time"

// Every timing constant of the package, each with its reason. None of them
// is a bound: bounds are the caller's (the context, the retry.Policy; see
// call.go); these say how often and how soon, inside them.
const (
	// ---- Waiting for a change (changewait.go) ----

	// defaultPollInterval is WithPollInterval's default: how often, at
	// most, a change is read when nothing wakes the wait sooner; the snap
	// command polls at this rate.
	defaultPollInterval = 100 * time.Millisecond
	// pollFast, for a wait's first pollFastFor, then pollMid until
	// pollMidFor: most service changes end within a few tens of
	// milliseconds, so a wait that must poll reads often at first.
	pollFast    = 20 * time.Millisecond
	pollFastFor = 100 * time.Millisecond
	pollMid     = 50 * time.Millisecond
	pollMidFor  = time.Second
	// stateSafety: with snapd's state file watched, the changes are read
	// at its rewrites and at least this often (or at the poll interval,
	// if longer) in case a rewrite was missed: every status change of a
	// change rewrites the file (overlord/state/state.go Unlock ->
	// checkpoint), so a faster safety read would only load snapd.
	stateSafety = 500 * time.Millisecond
	// pollGap: a read woken by the state file comes no sooner than this
	// after the last one (a burst of rewrites is read once).
	pollGap = 25 * time.Millisecond
	// noticeWait is how long one notices long-poll may be held by snapd
	// (the snap command's own long-polls are of this order).
	noticeWait = 30 * time.Second
	// noticeStrikes: how many times, within one wait, the notices API may
	// misbehave (fail, or answer an empty long-poll at once) before the
	// wait stops using it and polls the changes instead.
	noticeStrikes = 3

	// ---- The operation's own change (owntiming.go, snapdview.go) ----

	// ownPollMargin is added to twice the last own change's duration to
	// bound the first long-poll of the next one of its kind; ownPollMax
	// caps that bound (a change that ended before snapd's answer is read
	// when it runs out: found late by at most this, never missed).
	ownPollMargin = 5 * time.Millisecond
	ownPollMax    = 2 * time.Second
	// ownInstant: a first long-poll this short is for a kind of change
	// that has been instant (done within snapd's handler): the change is
	// read at once instead, ready in two requests.
	ownInstant = 2*time.Millisecond + ownPollMargin
	// ownKinds: kinds of own change whose duration is remembered; the
	// oldest is forgotten.
	ownKinds = 64
	// clockSlack: how far a change's spawn time (snapd's clock) may lie
	// outside its request's send and answer (the client's) for the two
	// clocks to count as one (scheduling and stamping jitter).
	clockSlack = 5 * time.Millisecond

	// ---- A request whose answer was lost (lostanswer.go, call.go) ----

	// lookupReserve: the most of a call's time a request to act leaves
	// for looking up its change should its answer still be pending at the
	// end (at most a quarter of the time left when it is sent): one
	// listing of the changes.
	lookupReserve = 100 * time.Millisecond
	// lostAnswerSettle: the least pause between the two empty look-ups
	// that tell a request whose answer was lost made no change: long
	// enough for a handler that waited for snapd's state lock to have made
	// it, short against the cost of acting twice.
	lostAnswerSettle = 100 * time.Millisecond
	// interruptGrace bounds the look-up, in the background, for the
	// change of a request whose call ended while snapd's answer was
	// pending (snapd carries on with a request whose client left): a
	// change it made is then waited for by the next operation.
	interruptGrace = 2 * time.Second

	// ---- Blind waits (cadence.go; docs/blind-waits.md derives them) ----

	// A blind wait retries the refused request 15 ms (± 5) after the
	// refusal, then every 53 ms (± 5) for 2 s, every 102 ms (± 5, about
	// the snap command's polling) until a minute, then 1.25 times the last
	// step up to the policy's MaxConflictInterval. No 1 s window holds
	// more than 20 of its requests, nor 10 once the window starts 2 s or
	// more into the wait.
	cadenceFirst       = 15 * time.Millisecond
	cadenceFirstJitter = 5 * time.Millisecond
	cadenceStep        = 53 * time.Millisecond
	cadenceJitter      = 5 * time.Millisecond
	cadenceSteady      = 2 * time.Second
	cadenceSlowStep    = 102 * time.Millisecond
	cadenceSlowFor     = time.Minute
	cadenceGrowth      = 1.25
	cadenceWindow      = time.Second
	cadenceFastMax     = 20
	cadenceSlowMax     = 10

	// ---- The machine's records (records.go, lockdir.go) ----

	// beatEvery: how often the holder of a record (a snap's lock, its
	// wait, a flight) beats it: rewrites it in place, its beat counted up.
	beatEvery = 100 * time.Millisecond
	// peerSilence: a record whose beat a peer has seen stand still this
	// long, on its own clock, has a stopped holder (SIGSTOP, a debugger,
	// a frozen cgroup), whom the peer deposes. Ten beats: a holder held up
	// by a loaded machine for a second is rare, and deposing a live one
	// costs a request it would not have sent, never a wrong outcome.
	peerSilence = time.Second
	// peerLook: the longest a peer waiting on a record (a snap's lock, its
	// watcher, a flight's leader) goes without looking at it again, what
	// ever the poll interval, so that silence is seen within about
	// peerSilence: the directory's watch wakes it sooner at any change.
	peerLook = 250 * time.Millisecond

	// ---- Budget slots (budget_lifecycle.go, budget_slots.go) ----

	// maxExpiredFences: fences in a row whose confirmation ran out before
	// the request could be written, after which the operation gives up
	// (retryable, nothing sent) instead of fencing again: one is a slow
	// moment, three is a budget whose confirmations are too short to act
	// on.
	maxExpiredFences = 3

	// releaseAttempts: how many times a slot's release is tried before it
	// is left to expire with its lease; releaseBackoff is the first pause
	// between attempts, doubled after each (1+2+4+8 s: a coordination
	// service back within a quarter of a minute gets the slot back).
	releaseAttempts = 5
	releaseBackoff  = time.Second
)
