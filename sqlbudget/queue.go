package sqlbudget

// The queue: how a waiter waits for a slot at a cost that does not grow
// with the queue.
//
// Every poll of a waiter is one transaction that reads a small fixed set
// of rows through the index (key, granted, id): its own row (by token),
// the key's holders (at most Max, and the vanished holders under their
// lock-delay), and the first few waiters of the queue ahead of it (at most
// queueWindow(Max) of them); never the whole queue. Within that window a
// waiter knows its place exactly; beyond it, it estimates its place from
// the key's arrival numbers (seq) and the first waiter's.
//
// Waiters poll less often the further back they are (Budget.interval):
// the first Max+1 waiters (the ones that take the next slots, and the
// next) every Config.Poll; the others every Poll plus PollSpacing for
// each waiter between them and those. The whole queue then costs about
// (Max+1 + H(n)·Poll/PollSpacing)/Poll transactions a second, H(n) the
// n-th harmonic number (about ln n + 0.58): at most about 22 a second for
// 1,000 waiters with the defaults (17–18 measured: README's benchmark)
// and 27 for 10,000, where polling every waiter each Poll cost 4,000. Only a waiter among the first Max takes a free
// slot, so a release costs one grant, not a stampede.
//
// A waiter promises, in its row, when it will write it next at the latest
// (due) and lives until then plus two thirds of the TTL (expires): a
// waiter near the front writes every TTL/3 (it polls more often, reading
// only), one further back at each of its polls. A waiter far back that
// the queue reached sooner than it polls (waiters ahead of it gave up at
// once) would hold the front until its next poll: rows whose promise is
// further off than dormantAfter are skipped by the waiters behind them
// when they decide to take a slot. Such a waiter is served in turn again
// at its next poll, once it has moved up.

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

// row is one row of snapsvc_budget_entries.
type row struct {
	id                    int64
	token, holder, spec   string
	since, expires        int64
	granted, acted, ready sql.NullInt64
	lockDelay             int64
	seq, due              sql.NullInt64
}

func (r *row) live(now int64) bool { return r.expires > now }

// delayed reports whether r is a vanished holder whose lock-delay holds
// its slot back at now: it expired after a Fence without a MarkReady (or
// a probe's word) since.
func (r *row) delayed(now int64) bool {
	return !r.live(now) && r.granted.Valid && r.acted.Valid && (!r.ready.Valid || r.ready.Int64 < r.acted.Int64) &&
		r.expires+r.lockDelay > now
}

// vanished is r, a holder under its lock-delay (delayed), as a waiter
// reports it.
func (r *row) vanished(key string) Vanished {
	return Vanished{Key: key, Holder: r.holder, Acted: msTime(r.acted.Int64), Expired: msTime(r.expires), Until: msTime(r.expires + r.lockDelay)}
}

const rowColumns = `id, token, holder, max_spec, since, expires, granted, acted, ready, lock_delay, seq, due`

func scanRows(rs *sql.Rows) ([]row, error) {
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.id, &r.token, &r.holder, &r.spec, &r.since, &r.expires, &r.granted, &r.acted, &r.ready, &r.lockDelay, &r.seq, &r.due); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rs.Err()
}

// keyRows reads all of key's rows in arrival order (Status: an operator's
// read, not a waiter's).
func keyRows(ctx context.Context, tx *sql.Tx, key string) ([]row, error) {
	rs, err := tx.QueryContext(ctx, `SELECT `+rowColumns+` FROM snapsvc_budget_entries WHERE key = ? ORDER BY id`, key)
	if err != nil {
		return nil, err
	}
	return scanRows(rs)
}

// The queries of a poll, each through an index (INDEXED BY: the plan
// must not depend on the statistics a database happens to have).
const (
	// qMine reads the waiter's own row.
	qMine = `SELECT ` + rowColumns + ` FROM snapsvc_budget_entries WHERE token = ?`
	// qHolders reads the key's granted rows: its holders, and its vanished
	// holders until they are collected.
	qHolders = `SELECT ` + rowColumns + ` FROM snapsvc_budget_entries INDEXED BY snapsvc_budget_entries_queue
		WHERE key = ? AND granted > 0`
	// qAhead reads the first live waiters of the key ahead of id (not
	// dormant: promised to write by the horizon), in order, at most limit.
	qAhead = `SELECT ` + rowColumns + ` FROM snapsvc_budget_entries INDEXED BY snapsvc_budget_entries_queue
		WHERE key = ? AND granted IS NULL AND id < ? AND expires > ? AND (due IS NULL OR due <= ?) ORDER BY id LIMIT ?`
	// qLastSeq reads the arrival number of the key's last row.
	qLastSeq = `SELECT seq FROM snapsvc_budget_entries INDEXED BY snapsvc_budget_entries_key WHERE key = ? ORDER BY id DESC LIMIT 1`
	// qExpired tells whether an expired waiter is ahead of id.
	qExpired = `SELECT EXISTS (SELECT 1 FROM snapsvc_budget_entries INDEXED BY snapsvc_budget_entries_queue
		WHERE key = ? AND granted IS NULL AND id < ? AND expires <= ?)`
	// qCollect deletes expired waiters ahead of id (the first few).
	qCollect = `DELETE FROM snapsvc_budget_entries WHERE id IN (SELECT id FROM snapsvc_budget_entries INDEXED BY snapsvc_budget_entries_queue
		WHERE key = ? AND granted IS NULL AND id < ? AND expires <= ? ORDER BY id LIMIT 32)`
)

// queueWindow is how many waiters ahead a poll reads at most: enough to
// know its place exactly among the first Max waiters and a few more.
func queueWindow(max int) int { return max + 8 }

// maxInterval caps the time between two polls of a waiter however far
// back it is (the queue then costs n/maxInterval a second beyond about
// 1,200 waiters with the defaults).
const maxInterval = 10 * time.Minute

// interval is how long a waiter with ahead waiters ahead of it waits
// before its next poll, for a key of max slots: Config.Poll among the
// first max+1 (those that take the next slots, and the next one, which
// then polls as often already when the slot after comes free), then
// PollSpacing more for each waiter further back, at most maxInterval.
func (b *Budget) interval(ahead, max int) time.Duration {
	if ahead <= max {
		return b.cfg.Poll
	}
	return min(b.cfg.Poll+time.Duration(ahead-max)*b.cfg.PollSpacing, maxInterval)
}

// dormantAfter is how far off a waiter's promised write may be before the
// waiters behind it stop waiting for it to take its turn (see above).
func (b *Budget) dormantAfter() time.Duration { return 2 * b.cfg.TTL }

// waiter is one Acquire in progress.
type waiter struct {
	b      *Budget
	key    string
	token  string
	start  time.Time
	queued bool

	written time.Time     // local send time of the last transaction that wrote the row
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
	ahead    int        // waiters ahead (exact within the window, else an estimate)
	vanished []Vanished // blocking this waiter alone (it is first in line)
	written  bool       // the row was inserted or renewed
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
			p, err = w.step(ctx, tx, sent)
			return err
		})
		if err != nil {
			return nil, err
		}
		w.queued = true // committed: a later transaction finds the row
		if p.written {
			w.written, w.lease = sent, p.lease
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
		next := b.interval(p.ahead, w.max)
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
// it is still there and live, and takes a slot when the queue allows, or
// renews the row when its promise is due. It reads the waiter's row, the
// key's holders and at most queueWindow waiters ahead: O(Max) rows,
// whatever the queue's length. Every read comes before the one write it
// makes, if any, so that the database's write lock (dqlite: one writer at
// a time, the others told "busy" at once) is held for that statement and
// the commit only.
func (w *waiter) step(ctx context.Context, tx *sql.Tx, sent time.Time) (poll, error) {
	b := w.b
	now, err := dbNow(ctx, tx)
	if err != nil {
		return poll{}, err
	}
	ttl := b.cfg.TTL.Milliseconds()
	rs, err := tx.QueryContext(ctx, qMine, w.token)
	if err != nil {
		return poll{}, err
	}
	mine, err := scanRows(rs)
	if err != nil {
		return poll{}, err
	}
	// queued: the row exists (also when the transaction that queued it
	// committed but its answer was lost, and this is its retry).
	queued := len(mine) == 1
	switch {
	case !queued && !w.queued:
	case !queued && time.Since(w.written) >= w.lease-b.cfg.ClockSkew:
		// Not renewed within its lease (the database was unreachable, or
		// this process was frozen): it expired and was collected.
		return poll{}, final(&queueLostError{key: w.key, since: time.Since(w.written)})
	case !queued:
		return poll{}, final(fmt.Errorf("%w: sqlbudget: waiting for %s: this waiter's row was deleted by someone else (an operator?)", budget.ErrRefused, w.key))
	case !mine[0].live(now):
		return poll{}, final(&queueLostError{key: w.key, since: time.Since(w.written)})
	}
	grant := func() (poll, error) {
		// Take the slot (or find it taken by an earlier run of this
		// transaction whose commit was not seen), renewing the row.
		if _, err := tx.ExecContext(ctx, `UPDATE snapsvc_budget_entries SET granted = COALESCE(granted, ?), expires = ?, due = NULL WHERE token = ?`, now, now+ttl, w.token); err != nil {
			return poll{}, err
		}
		return poll{granted: true, deadline: sent.Add(b.cfg.TTL)}, nil
	}
	var me row
	if queued {
		me = mine[0]
		if me.granted.Valid {
			return grant()
		}
	} else {
		// It queues last: its arrival number follows the key's last row's.
		var last sql.NullInt64
		if err := tx.QueryRowContext(ctx, qLastSeq, w.key).Scan(&last); err != nil && err != sql.ErrNoRows {
			return poll{}, err
		}
		me = row{id: math.MaxInt64, seq: sql.NullInt64{Int64: last.Int64 + 1, Valid: true}}
	}

	// The holders, live or vanished.
	rs, err = tx.QueryContext(ctx, qHolders, w.key)
	if err != nil {
		return poll{}, err
	}
	granted, err := scanRows(rs)
	if err != nil {
		return poll{}, err
	}
	held, spent := 0, 0 // live holders; slots held back by a lock-delay
	var holders, gone []string
	var vanished []Vanished
	for _, r := range granted {
		switch {
		case r.live(now):
			if err := w.sameMax(r); err != nil {
				return poll{}, err
			}
			held++
			holders = append(holders, r.holder)
		case r.delayed(now):
			spent++
			holders = append(holders, r.holder+" (vanished; lock-delay)")
			vanished = append(vanished, r.vanished(w.key))
		default:
			gone = append(gone, r.token) // expired, holds nothing back
		}
	}

	// The first waiters ahead.
	window := queueWindow(max(w.max, b.cfg.Max))
	rs, err = tx.QueryContext(ctx, qAhead, w.key, me.id, now, now+b.dormantAfter().Milliseconds(), window)
	if err != nil {
		return poll{}, err
	}
	front, err := scanRows(rs)
	if err != nil {
		return poll{}, err
	}
	for _, r := range front {
		if err := w.sameMax(r); err != nil {
			return poll{}, err
		}
	}
	ahead, near := len(front), len(front) < window
	if !near && me.seq.Valid && front[0].seq.Valid {
		ahead = max(int(me.seq.Int64-front[0].seq.Int64), window)
	}
	// Expired waiters ahead (crashed, cut off) are collected by those
	// behind them near the front, a few at a time (the scan is of the few
	// rows ahead: this waiter is near the front).
	expired := false
	if near {
		if err := tx.QueryRowContext(ctx, qExpired, w.key, me.id, now).Scan(&expired); err != nil {
			return poll{}, err
		}
	}
	n := w.max
	if near || n == 0 {
		// Near the front the slot count decides: resolve it (Percent:
		// in this very transaction). Further back the last one does.
		if n, err = b.slots(ctx, tx); err != nil {
			return poll{}, err
		}
		w.max = n
	}

	// The writes.
	for _, token := range gone {
		if _, err := tx.ExecContext(ctx, `DELETE FROM snapsvc_budget_entries WHERE token = ? AND expires <= ?`, token, now); err != nil {
			return poll{}, err
		}
	}
	if expired {
		if _, err := tx.ExecContext(ctx, qCollect, w.key, me.id, now); err != nil {
			return poll{}, err
		}
	}
	if near && ahead < n-held-spent {
		if !queued {
			if _, err := tx.ExecContext(ctx, `INSERT INTO snapsvc_budget_entries (key, token, holder, max_spec, since, expires, granted, seq, lock_delay)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, w.key, w.token, b.cfg.Holder, b.spec, now, now+ttl, now, me.seq.Int64, b.cfg.LockDelay.Milliseconds()); err != nil {
				return poll{}, err
			}
			return poll{granted: true, deadline: sent.Add(b.cfg.TTL)}, nil
		}
		return grant()
	}
	if near && spent > 0 && ahead+held < n {
		w.delayed = true // only a lock-delay keeps it waiting: it probes
	} else {
		vanished = nil
	}
	p := poll{ahead: ahead, vanished: vanished, wait: budget.Wait{Key: w.key, Holders: holders, Ahead: max(ahead+held+spent-n, 0), Max: n}}
	// Write the row when its promise comes before the next poll, or is
	// further off than its new one (it moved up faster than it polled,
	// and would look dormant): it promises its next write within
	// max(interval, TTL/3), and lives two thirds of a TTL longer.
	next := b.interval(ahead, n)
	promise := max(next, b.cfg.TTL/3).Milliseconds()
	p.lease = time.Duration(promise+2*ttl/3) * time.Millisecond
	switch {
	case !queued:
		if _, err := tx.ExecContext(ctx, `INSERT INTO snapsvc_budget_entries (key, token, holder, max_spec, since, expires, due, seq, lock_delay)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, w.key, w.token, b.cfg.Holder, b.spec, now, now+promise+2*ttl/3, now+promise, me.seq.Int64, b.cfg.LockDelay.Milliseconds()); err != nil {
			return poll{}, err
		}
		p.written = true
	case !me.due.Valid || me.due.Int64 <= now+next.Milliseconds() || me.due.Int64 > now+promise:
		if _, err := tx.ExecContext(ctx, `UPDATE snapsvc_budget_entries SET due = ?, expires = ? WHERE token = ? AND expires > ?`,
			now+promise, now+promise+2*ttl/3, w.token, now); err != nil {
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
		acted := v.Acted.UnixMilli()
		err := b.tx(ctx, b.cfg.Unreachable, "ending the lock-delay of "+v.Holder+" on "+w.key, func(ctx context.Context, tx *sql.Tx) error {
			now, err := dbNow(ctx, tx)
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, `UPDATE snapsvc_budget_entries SET ready = ? WHERE key = ? AND holder = ? AND acted = ? AND expires <= ?`,
				now, w.key, v.Holder, acted, now)
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

// abandon deletes the waiter's row: one attempt, so a cancelled Acquire
// returns promptly (else the row expires within TTL), and none while the
// database is failing (see Budget.failing). A row granted by a
// transaction whose answer was lost goes too: it never acted (acted is
// only ever set on a granted row, by Fence).
func (w *waiter) abandon() {
	b := w.b
	defer b.wakeUp(w.key)
	if b.failing.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.Attempt)
	defer cancel()
	_ = b.cfg.Tx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if err := b.ensureSchema(ctx, tx); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM snapsvc_budget_entries WHERE token = ? AND acted IS NULL`, w.token)
		return err
	})
}
