package sqlbudget

// The queue: how a waiter waits for a slot at a cost that does not grow
// with the queue, and how a free slot is taken within about one Poll
// whatever waiters died or left.
//
// Every poll of a waiter is one transaction that reads a small fixed set
// of rows through the index (key, granted, id): its own row (by token),
// the key's holders (at most Max, and the vanished holders under their
// lock-delay), the first few waiters of the queue (at most
// queueWindow(Max) of them), and two counts through the index: the
// waiters ahead of it (its place, from the rows actually there, so a
// waiter whose predecessors left knows it at its next poll) and, up to
// sentinels, the waiters behind it.
//
// Waiters poll less often the further back they are (Budget.interval):
// the first Max+1 waiters (the front: the ones that take the next slots,
// and the next) every Config.Poll; the others every Poll plus PollSpacing
// for each waiter between them and the front. The whole queue then costs
// about (Max+1 + H(n)·Poll/PollSpacing)/Poll transactions a second, H(n)
// the n-th harmonic number, and the last few waiters (sentinels, below)
// 2 a second each.
//
// Who takes a free slot. A waiter whose interval is at most awakeSpan
// (8 Polls: the first few of the queue) is awake: it says so in its row,
// writes it at every poll, and so promises to look again within its
// interval. A waiter takes a free slot once fewer than the free slots'
// count of awake waiters are ahead of it that keep their promise, as it
// sees them. A waiter ahead that is not awake (further back when it last
// wrote: the queue reached it sooner than it polls, those ahead having
// left), or awake and silent past its interval plus two Polls on the
// observer's monotonic clock (dead, frozen, cut off), does not hold the
// slot back; it keeps its row, and its place for the next slot, until its
// row expires. So the first few are served in order however fast the
// slots change hands, and when the front died or left, the first waiter
// to poll takes the slot. The last sentinels waiters of the queue poll
// every 2×Poll (they do not say they are awake, and write no more
// often): when every waiter at the front left at once (a common deadline
// ends the first arrivals' waits first), a sentinel takes the free slot
// within 2 Polls, where the next waiters in line would poll only after
// their long intervals. Sentinels say in their row how often they poll,
// and wait for the sentinels ahead of them (they poll as often), so a
// short queue is served in order.
//
// Expiry is the observers' (observe.go): a waiter's row lives lease_ms
// after its last write on the clock of whoever watches it (its promise
// plus two thirds of a TTL), a holder's its TTL; an observer that has
// watched a row keep its beat that long deletes it, in a transaction that
// reads the same beat. The slot count is resolved in the very
// transaction that grants (Percent).

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/snapsvc/snapsvc/budget"
)

// row is one row of snapsvc_budget_slots.
type row struct {
	id                           int64
	token, holder, spec          string
	beat, leaseMS, everyMS       int64
	awake, granted               bool
	acts, readyActs, lockDelayMS int64
	since, renewed               int64
	grantedAt, actedAt, readyAt  sql.NullInt64
}

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// needsDelay reports whether r, a holder that vanished, holds its slot
// back for its lock-delay: it recorded an act (a Fence) and no readiness
// (MarkReady, or a probe's word) after it.
func (r *row) needsDelay() bool { return r.granted && r.acts > r.readyActs && r.lockDelayMS > 0 }

// state is what an observer makes of a row.
type state int

const (
	alive   state = iota // renewed within its lease, as the observer saw it
	delayed              // a vanished holder under its lock-delay
	expired              // gone: its row may be deleted
)

// judge says what the Budget, as an observer, makes of r at now, and how
// long it has seen r keep its beat.
func (b *Budget) judge(r row, now time.Time) (state, time.Duration) {
	silent := b.obs.silent(r.token, r.beat, now)
	switch {
	case silent < ms(r.leaseMS):
		return alive, silent
	case r.needsDelay() && silent < ms(r.leaseMS+r.lockDelayMS):
		return delayed, silent
	}
	return expired, silent
}

// keepsPromise reports whether r, a live waiter, is awake and has
// written within its promise (its poll interval) plus two Polls, as the
// Budget saw it: a waiter that does not keep it (dead, frozen, cut off),
// or is not awake, does not hold a free slot back.
func (b *Budget) keepsPromise(r row, silent time.Duration) bool {
	return r.awake && silent < ms(r.everyMS)+2*b.cfg.Poll
}

// isSentinel reports whether r, a live waiter that is not awake, is a
// sentinel: it polls every 2×Poll at most (every_ms, its interval), so a
// sentinel behind it waits for it, and a short queue is served in order.
func (b *Budget) isSentinel(r row) bool {
	return !r.awake && r.everyMS > 0 && ms(r.everyMS) <= 2*b.cfg.Poll
}

// vanished is r, a holder under its lock-delay, as a waiter reports it.
func (r *row) vanished(key string, now time.Time, silent time.Duration) Vanished {
	gone := now.Add(ms(r.leaseMS) - silent)
	return Vanished{Key: key, Holder: r.holder, Acted: msTime(r.actedAt.Int64), Expired: gone, Until: gone.Add(ms(r.lockDelayMS)),
		token: r.token, acts: r.acts}
}

const rowColumns = `id, token, holder, max_spec, beat, lease_ms, every_ms, awake, granted, acts, ready_acts, lock_delay_ms, since, renewed, granted_at, acted_at, ready_at`

// scanRows reads rs and adds each row's beat to read.
func scanRows(rs *sql.Rows, read *beats) ([]row, error) {
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.id, &r.token, &r.holder, &r.spec, &r.beat, &r.leaseMS, &r.everyMS, &r.awake, &r.granted, &r.acts, &r.readyActs,
			&r.lockDelayMS, &r.since, &r.renewed, &r.grantedAt, &r.actedAt, &r.readyAt); err != nil {
			return nil, err
		}
		read.add(r.token, r.beat)
		out = append(out, r)
	}
	return out, rs.Err()
}

// keyRows reads all of key's rows in arrival order (Status: an operator's
// read, not a waiter's).
func keyRows(ctx context.Context, tx *sql.Tx, key string, read *beats) ([]row, error) {
	rs, err := tx.QueryContext(ctx, `SELECT `+rowColumns+` FROM snapsvc_budget_slots WHERE key = ? ORDER BY id`, key)
	if err != nil {
		return nil, err
	}
	return scanRows(rs, read)
}

// The queries of a poll, each through an index (INDEXED BY: the plan
// must not depend on the statistics a database happens to have).
const (
	// qMine reads the waiter's own row.
	qMine = `SELECT ` + rowColumns + ` FROM snapsvc_budget_slots WHERE token = ?`
	// qHolders reads the key's granted rows: its holders, and its vanished
	// holders until they are collected.
	qHolders = `SELECT ` + rowColumns + ` FROM snapsvc_budget_slots INDEXED BY snapsvc_budget_slots_queue
		WHERE key = ? AND granted = 1`
	// qFront reads the first waiters of the key ahead of id, in order, at
	// most limit.
	qFront = `SELECT ` + rowColumns + ` FROM snapsvc_budget_slots INDEXED BY snapsvc_budget_slots_queue
		WHERE key = ? AND granted = 0 AND id < ? ORDER BY id LIMIT ?`
	// qPlace counts the key's waiters ahead of id (its place) and, up to
	// a limit, behind it.
	qPlace = `SELECT
		(SELECT count(*) FROM snapsvc_budget_slots INDEXED BY snapsvc_budget_slots_queue WHERE key = ? AND granted = 0 AND id < ?),
		(SELECT count(*) FROM (SELECT 1 FROM snapsvc_budget_slots INDEXED BY snapsvc_budget_slots_queue WHERE key = ? AND granted = 0 AND id > ? LIMIT ?))`
	// qDelete deletes a row an observer judged expired, only if its beat
	// is still the one judged (a renewal that raced the judgement wins).
	qDelete = `DELETE FROM snapsvc_budget_slots WHERE token = ? AND beat = ?`
)

// queueWindow is how many waiters ahead a poll reads at most: the front
// (the first Max+1 waiters, the only ones that say they are awake) and a
// few more.
func queueWindow(max int) int { return max + 8 }

// sentinels is how many waiters at the back of the queue poll every
// 2×Poll, so that a slot whose front left at once is taken within 2 Polls.
const sentinels = 16

// awakeSpan is the longest poll interval of an awake waiter (8 Polls):
// one that writes at every poll, and that the waiters behind it wait for
// when it is first in line, so that the first few waiters are served in
// order however fast the slots change hands. A waiter further back (a
// longer interval) is passed over when it is first in line before it
// polled: the queue reached it sooner than it looks (those ahead left).
func (b *Budget) awakeSpan() time.Duration { return 8 * b.cfg.Poll }

// maxInterval caps the time between two polls of a waiter however far
// back it is (the queue then costs n/maxInterval a second beyond about
// 1,200 waiters with the defaults).
const maxInterval = 10 * time.Minute

// interval is how long a waiter with ahead waiters ahead of it waits
// before its next poll, for a key of max slots: Config.Poll among the
// first max+1 (those that take the next slots, and the next one, which
// then polls as often already when the slot after comes free), then
// PollSpacing more for each waiter further back, at most maxInterval; a
// sentinel at most 2×Poll.
func (b *Budget) interval(ahead, max int, sentinel bool) time.Duration {
	if ahead <= max {
		return b.cfg.Poll
	}
	d := min(b.cfg.Poll+time.Duration(ahead-max)*b.cfg.PollSpacing, maxInterval)
	if sentinel {
		d = min(d, 2*b.cfg.Poll)
	}
	return d
}

// waiter is one Acquire in progress.
type waiter struct {
	b      *Budget
	key    string
	token  string
	start  time.Time
	queued bool

	written time.Time     // local send time of the last transaction that wrote the row
	promise time.Duration // it promised then to write again within this long
	lease   time.Duration // how long the row lives after that write, unless written again
	delayed bool          // waited behind a vanished holder's lock-delay
	max     int
	front   bool // among the first Max+1 waiters at the last poll

	// HolderReady probes run beside the wait (probeVanished): at most
	// one at a time, started no more often than every probeEvery.
	probed  time.Time          // when the last probe started
	probing chan []Vanished    // the probe in flight (nil: none); it sends those it saw ready
	stop    context.CancelFunc // ends the probes' context when Acquire returns
	pctx    context.Context    // the probes' context
}

// probeEvery is how often the first waiter behind a vanished holder asks
// Config.HolderReady, and probeTimeout how long each call's context
// lives.
const (
	probeEvery   = 500 * time.Millisecond
	probeTimeout = 5 * time.Second
)

// poll is what one waiter transaction found.
type poll struct {
	granted  bool
	deadline time.Time // granted: until when the row cannot have expired (local clock)
	wait     budget.Wait
	ahead    int        // waiters ahead (counted)
	sentinel bool       // among the last sentinels waiters
	vanished []Vanished // blocking this waiter alone (it is first in line)
	written  bool       // the row was inserted or renewed
	promise  time.Duration
	lease    time.Duration
}

func (w *waiter) wait(ctx context.Context, progress func(budget.Wait)) (*slot, error) {
	b := w.b
	var last budget.Wait
	reported := false
	w.pctx, w.stop = context.WithCancel(context.WithoutCancel(ctx))
	defer w.stop()
	for {
		wake := b.wakeCh(w.key)
		sent := time.Now()
		var p poll
		var read beats
		// A waiter yields to the holders when the database is busy: one
		// not queued yet has nothing at stake but its place; one further
		// back retries soon only once half of its row's lease has passed.
		// The first Max+1 (a few) retry soon: a hand-over waits on them.
		var bo backoff
		switch {
		case !w.queued:
			bo = b.entering()
		case w.front:
			bo = urgent
		default:
			bo = b.yielding(b.cfg.TTL / 3)
			bo.urgentAt = w.written.Add(w.lease / 2)
		}
		err := b.txRetry(ctx, b.cfg.Unreachable, bo, "waiting for a slot of "+w.key, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			p, err = w.step(ctx, tx, sent, &read)
			return err
		})
		if err != nil {
			return nil, err
		}
		b.obs.record(read, time.Now())
		w.queued = true // committed: a later transaction finds the row
		if p.written {
			w.written, w.promise, w.lease = sent, p.promise, p.lease
		}
		w.front = p.ahead <= w.max
		if p.granted {
			return newSlot(b, w, p.deadline), nil
		}
		if progress != nil && (!reported || p.wait.Ahead != last.Ahead || !slices.Equal(p.wait.Holders, last.Holders)) {
			progress(p.wait)
			last, reported = p.wait, true
			b.emit(Event{Kind: EventWaiting, Key: w.key, Wait: p.wait, Waited: time.Since(w.start)})
		}
		if len(p.vanished) > 0 && b.cfg.HolderReady != nil && w.probing == nil && time.Since(w.probed) >= probeEvery {
			w.probeVanished(p.vanished)
		}
		next := b.interval(p.ahead, w.max, p.sentinel)
		if next > b.cfg.Poll {
			// Further back: jittered (up to 20% sooner: never later than
			// the row's promise), so that waiters that queued together do
			// not poll together, and deaf to this process's releases (a
			// release serves the front).
			next -= rand.N(next/5 + 1)
			wake = nil
		}
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		case <-wake:
			t.Stop()
		case <-t.C:
		case ready := <-w.probing: // nil while no probe runs: never ready
			t.Stop()
			w.probing = nil
			if err := w.endDelays(ctx, ready); err != nil {
				return nil, err
			}
		}
	}
}

// step is one waiter transaction: it queues the row (first time), checks
// it is still there, and takes a slot when the queue allows, or writes the
// row when it is at the front or its promise is due. It reads the
// waiter's row, the key's holders and at most queueWindow waiters ahead,
// and counts through the index: O(Max) rows, whatever the queue's length.
// Every read comes before its writes, so that the database's write lock
// (dqlite: one writer at a time, the others told "busy" at once) is held
// for them and the commit only. What it read is added to read, for the
// observer once the transaction returned.
func (w *waiter) step(ctx context.Context, tx *sql.Tx, sent time.Time, read *beats) (poll, error) {
	*read = nil
	b := w.b
	now, err := dbNow(ctx, tx) // for humans only
	if err != nil {
		return poll{}, err
	}
	ttl := b.cfg.TTL.Milliseconds()
	rs, err := tx.QueryContext(ctx, qMine, w.token)
	if err != nil {
		return poll{}, err
	}
	mine, err := scanRows(rs, nil)
	if err != nil {
		return poll{}, err
	}
	// queued: the row exists (also when the transaction that queued it
	// committed but its answer was lost, and this is its retry).
	queued := len(mine) == 1
	switch {
	case !queued && !w.queued:
	case !queued && time.Since(w.written) >= w.lease-b.cfg.ClockSkew:
		// Not written within its lease (the database was unreachable, or
		// this process was frozen): an observer judged it expired.
		return poll{}, final(&queueLostError{key: w.key, since: time.Since(w.written)})
	case !queued:
		return poll{}, final(fmt.Errorf("%w: sqlbudget: waiting for %s: this waiter's row was deleted by someone else (an operator?)", budget.ErrRefused, w.key))
	}
	grant := func() (poll, error) {
		// Take the slot (or find it taken by an earlier run of this
		// transaction whose commit was not seen), renewing the row.
		if _, err := tx.ExecContext(ctx, `UPDATE snapsvc_budget_slots SET granted = 1, granted_at = COALESCE(granted_at, ?), beat = beat + 1, renewed = ?,
			lease_ms = ?, every_ms = 0, awake = 0 WHERE token = ?`, now, now, ttl, w.token); err != nil {
			return poll{}, err
		}
		return poll{granted: true, deadline: sent.Add(b.cfg.TTL)}, nil
	}
	me := row{id: math.MaxInt64}
	if queued {
		me = mine[0]
		if me.granted {
			return grant()
		}
	}

	// The holders, live or vanished, as this Budget has watched them.
	rs, err = tx.QueryContext(ctx, qHolders, w.key)
	if err != nil {
		return poll{}, err
	}
	granted, err := scanRows(rs, read)
	if err != nil {
		return poll{}, err
	}
	at := time.Now()
	held, spent := 0, 0 // live holders; slots held back by a lock-delay
	var holders []string
	var vanished []Vanished
	var gone []row // expired rows this transaction deletes
	for _, r := range granted {
		switch st, silent := b.judge(r, at); st {
		case alive:
			if err := w.sameMax(r); err != nil {
				return poll{}, err
			}
			held++
			holders = append(holders, r.holder)
		case delayed:
			spent++
			holders = append(holders, r.holder+" (vanished; lock-delay)")
			vanished = append(vanished, r.vanished(w.key, at, silent))
		default:
			gone = append(gone, r) // expired, holds nothing back
		}
	}

	// The front of the queue.
	window := queueWindow(max(w.max, b.cfg.Max))
	rs, err = tx.QueryContext(ctx, qFront, w.key, me.id, window)
	if err != nil {
		return poll{}, err
	}
	front, err := scanRows(rs, read)
	if err != nil {
		return poll{}, err
	}
	var ahead, behind int
	if err := tx.QueryRowContext(ctx, qPlace, w.key, me.id, w.key, me.id, sentinels).Scan(&ahead, &behind); err != nil {
		return poll{}, err
	}
	awake, dead := 0, 0 // waiters ahead that hold a free slot back; expired ones
	for _, r := range front {
		st, silent := b.judge(r, at)
		if st != alive {
			gone = append(gone, r) // dead: collected
			dead++
			continue
		}
		if err := w.sameMax(r); err != nil {
			return poll{}, err
		}
		if b.keepsPromise(r, silent) || b.isSentinel(r) {
			awake++
		}
	}
	ahead = max(ahead-dead, 0)
	n, err := b.slots(ctx, tx)
	if err != nil {
		return poll{}, err
	}
	w.max = n

	// The writes.
	for _, r := range gone {
		if _, err := tx.ExecContext(ctx, qDelete, r.token, r.beat); err != nil {
			return poll{}, err
		}
	}
	if awake < n-held-spent {
		if !queued {
			if _, err := tx.ExecContext(ctx, `INSERT INTO snapsvc_budget_slots (key, token, holder, max_spec, lease_ms, granted, lock_delay_ms, since, renewed, granted_at)
				VALUES (?, ?, ?, ?, ?, 1, ?, ?, ?, ?)`, w.key, w.token, b.cfg.Holder, b.spec, ttl, b.cfg.LockDelay.Milliseconds(), now, now, now); err != nil {
				return poll{}, err
			}
			return poll{granted: true, deadline: sent.Add(b.cfg.TTL)}, nil
		}
		return grant()
	}
	if spent > 0 && awake+held < n {
		w.delayed = true // only a lock-delay keeps it waiting: it probes
	} else {
		vanished = nil
	}
	// Awake: it polls within awakeSpan, so it writes at every poll and
	// the waiters behind it wait for it; further back it writes when the
	// write it promised would come due before its next poll, promising
	// then its next write within max(interval, TTL/3). It lives two
	// thirds of a TTL past its promise.
	base := b.interval(ahead, n, false)
	p := poll{ahead: ahead, sentinel: base > 2*b.cfg.Poll && behind < sentinels, vanished: vanished,
		wait: budget.Wait{Key: w.key, Holders: holders, Ahead: max(ahead+held+spent-n, 0), Max: n}}
	next := b.interval(ahead, n, p.sentinel)
	awakeNow := base <= b.awakeSpan()
	p.promise = max(next, b.cfg.TTL/3)
	if awakeNow {
		p.promise = next
	}
	p.lease = p.promise + 2*b.cfg.TTL/3
	switch {
	case !queued:
		if _, err := tx.ExecContext(ctx, `INSERT INTO snapsvc_budget_slots (key, token, holder, max_spec, lease_ms, every_ms, awake, lock_delay_ms, since, renewed)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, w.key, w.token, b.cfg.Holder, b.spec, p.lease.Milliseconds(), next.Milliseconds(), awakeNow, b.cfg.LockDelay.Milliseconds(), now, now); err != nil {
			return poll{}, err
		}
		p.written = true
	case awakeNow || me.awake != awakeNow || b.isSentinel(me) != (next <= 2*b.cfg.Poll) || time.Since(w.written)+next > w.promise:
		if _, err := tx.ExecContext(ctx, `UPDATE snapsvc_budget_slots SET beat = beat + 1, renewed = ?, lease_ms = ?, every_ms = ?, awake = ? WHERE token = ? AND granted = 0`,
			now, p.lease.Milliseconds(), next.Milliseconds(), awakeNow, w.token); err != nil {
			return poll{}, err
		}
		p.written = true
	}
	return p, nil
}

// sameMax refuses a participant of the key that uses another slot count.
func (w *waiter) sameMax(r row) error {
	if r.token == w.token || r.spec == w.b.spec {
		return nil
	}
	return final(fmt.Errorf("%w: sqlbudget: waiting for %s: %s takes part with max %s, this machine with %s: every machine must use the same",
		budget.ErrRefused, w.key, r.holder, r.spec, w.b.spec))
}

// probeVanished asks Config.HolderReady about the vanished holders that
// block this waiter (it is first in line), beside the wait: the waiter
// goes on polling and renewing its row meanwhile, each call's context
// ends after probeTimeout (or when Acquire returns), and a probe that
// does not return is not called again until it does. Those seen ready
// come back on w.probing.
func (w *waiter) probeVanished(vs []Vanished) {
	w.probed = time.Now()
	done := make(chan []Vanished, 1) // never blocks: the probe may end after Acquire
	w.probing = done
	ready := w.b.cfg.HolderReady
	pctx := w.pctx
	go func() {
		var seen []Vanished
		for _, v := range vs {
			ctx, cancel := context.WithTimeout(pctx, probeTimeout)
			ok := ready(ctx, v)
			cancel()
			if ok {
				seen = append(seen, v)
			}
		}
		done <- seen
	}()
}

// endDelays ends the lock-delay of the vanished holders HolderReady saw
// ready: their rows are marked ready, if they have not acted again since.
func (w *waiter) endDelays(ctx context.Context, vs []Vanished) error {
	b := w.b
	for _, v := range vs {
		err := b.tx(ctx, b.cfg.Unreachable, "ending the lock-delay of "+v.Holder+" on "+w.key, func(ctx context.Context, tx *sql.Tx) error {
			now, err := dbNow(ctx, tx)
			if err != nil {
				return err
			}
			// Only if it has not acted again since (a holder thought
			// vanished that renewed and fenced anew acted after the
			// readiness the probe saw).
			_, err = tx.ExecContext(ctx, `UPDATE snapsvc_budget_slots SET ready_acts = acts, ready_at = ? WHERE token = ? AND acts = ?`,
				now, v.token, v.acts)
			return err
		})
		if err != nil {
			return err
		}
		b.cfg.Logger.Info("vanished holder seen ready after it acted: lock-delay ended", "key", w.key, "holder", v.Holder)
		b.emit(Event{Kind: EventLockDelayEnded, Key: w.key, Holder: v.Holder})
	}
	return nil
}

// abandon deletes the waiter's row, within one Attempt (a database that
// answers busy, as dqlite's leader does at once to a second writer when
// many waiters leave together, is tried again within it, with full
// jitter, and a process's leavers go one at a time: see remove), so a
// cancelled
// Acquire returns promptly (else the row expires within its lease), and
// not at all while the database is failing (see Budget.failing). A row
// granted by a transaction whose answer was lost goes too: it never acted
// (acts are only ever recorded on a granted row, by Fence).
func (w *waiter) abandon() {
	b := w.b
	defer b.wakeUp(w.key)
	if b.failing.Load() {
		return
	}
	b.remove(w.token)
}

// remove deletes token's row if it never acted, within one Attempt. It
// yields to the holders: a process's leavers go one at a time, each
// followed by a pause as long as it took (entryGate, as arrivals), with
// full jitter when the database is busy, so that a crowd leaving at once
// (900 waiters of a process cancelled together starved a holder's
// renewals past its TTL) takes at most half of the database's time; a
// leaver that gets no turn within the Attempt leaves its row to expire.
func (b *Budget) remove(token string) {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Attempt)
	defer cancel()
	bo := b.yielding(b.cfg.Attempt)
	bo.gate = entryGate
	_ = b.txRetry(ctx, b.cfg.Attempt, bo, "leaving the queue", func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM snapsvc_budget_slots WHERE token = ? AND acts = 0`, token)
		return err
	})
}
