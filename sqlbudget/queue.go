package sqlbudget

import (
	"context"
	"database/sql"
	"fmt"
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

const rowColumns = `id, token, holder, max_spec, since, expires, granted, acted, ready, lock_delay`

func scanRows(rs *sql.Rows) ([]row, error) {
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.id, &r.token, &r.holder, &r.spec, &r.since, &r.expires, &r.granted, &r.acted, &r.ready, &r.lockDelay); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rs.Err()
}

// keyRows reads key's rows in arrival order.
func keyRows(ctx context.Context, tx *sql.Tx, key string) ([]row, error) {
	rs, err := tx.QueryContext(ctx, `SELECT `+rowColumns+` FROM snapsvc_budget_entries WHERE key = ? ORDER BY id`, key)
	if err != nil {
		return nil, err
	}
	return scanRows(rs)
}

// collect deletes key's rows that hold nothing any more (expired
// waiters; expired holders without a lock-delay, or whose delay ended).
func collect(ctx context.Context, tx *sql.Tx, rows []row, now int64) error {
	for _, r := range rows {
		if !r.live(now) && !r.delayed(now) {
			if _, err := tx.ExecContext(ctx, `DELETE FROM snapsvc_budget_entries WHERE token = ? AND expires <= ?`, r.token, now); err != nil {
				return err
			}
		}
	}
	return nil
}

// waiter is one Acquire in progress.
type waiter struct {
	b       *Budget
	key     string
	token   string
	start   time.Time
	queued  bool
	renewed time.Time // local time of the last renewal sent
	delayed bool      // waited behind a vanished holder's lock-delay
	max     int

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
	vanished []Vanished // blocking this waiter alone (it is first in line)
	renewed  bool       // the row was inserted or renewed
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
		err := b.tx(ctx, b.cfg.Unreachable, "waiting for a slot of "+w.key, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			p, err = w.step(ctx, tx, sent)
			return err
		})
		if err != nil {
			return nil, err
		}
		w.queued = true // committed: a later transaction finds the row
		if p.renewed {
			w.renewed = sent
		}
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
		t := time.NewTimer(b.cfg.Poll)
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

// step is one waiter transaction: it queues the row (first time), checks
// it is still there and live, and takes a slot when the queue allows, or
// renews the row when due.
func (w *waiter) step(ctx context.Context, tx *sql.Tx, sent time.Time) (poll, error) {
	b := w.b
	now, err := dbNow(ctx, tx)
	if err != nil {
		return poll{}, err
	}
	ttl := b.cfg.TTL.Milliseconds()
	if !w.queued {
		if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO snapsvc_budget_entries (key, token, holder, max_spec, since, expires, lock_delay)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, w.key, w.token, b.cfg.Holder, b.spec, now, now+ttl, b.cfg.LockDelay.Milliseconds()); err != nil {
			return poll{}, err
		}
	}
	rows, err := keyRows(ctx, tx, w.key)
	if err != nil {
		return poll{}, err
	}
	i := slices.IndexFunc(rows, func(r row) bool { return r.token == w.token })
	switch {
	case i < 0 && !w.queued:
		return poll{}, fmt.Errorf("sqlbudget: the row queued for %s is not there", w.key)
	case i < 0 && time.Since(w.renewed) >= b.cfg.TTL-b.cfg.ClockSkew:
		// Not renewed within its TTL (the database was unreachable, or
		// this process was frozen): it expired and was collected.
		return poll{}, final(&queueLostError{key: w.key, since: time.Since(w.renewed)})
	case i < 0:
		return poll{}, final(fmt.Errorf("%w: sqlbudget: waiting for %s: this waiter's row was deleted by someone else (an operator?)", budget.ErrRefused, w.key))
	case !rows[i].live(now):
		return poll{}, final(&queueLostError{key: w.key, since: time.Since(w.renewed)})
	}
	// The queue is written: from here a retried transaction finds the row.
	mine := rows[i]
	for _, r := range rows {
		if r.token != w.token && r.live(now) && r.spec != b.spec {
			return poll{}, final(fmt.Errorf("%w: sqlbudget: waiting for %s: %s takes part with max %s, this machine with %s: every machine must use the same",
				budget.ErrRefused, w.key, r.holder, r.spec, b.spec))
		}
	}
	n, err := b.slots(ctx, tx)
	if err != nil {
		return poll{}, err
	}
	w.max = n
	ahead, held := 0, 0
	var holders []string
	var vanished []Vanished
	for _, r := range rows[:i] {
		switch {
		case r.live(now):
			ahead++
			if r.granted.Valid {
				holders = append(holders, r.holder)
			}
		case r.delayed(now):
			held++
			holders = append(holders, r.holder+" (vanished; lock-delay)")
			vanished = append(vanished, r.vanished(w.key))
		}
	}
	for _, r := range rows[i+1:] {
		if r.delayed(now) { // a vanished holder queued after this waiter (it was skipped while this one waited)
			held++
			holders = append(holders, r.holder+" (vanished; lock-delay)")
			vanished = append(vanished, r.vanished(w.key))
		}
	}
	if err := collect(ctx, tx, rows, now); err != nil {
		return poll{}, err
	}
	if mine.granted.Valid || ahead+held < n {
		// Take the slot (or find it taken by an earlier run of this
		// transaction whose commit was not seen).
		if _, err := tx.ExecContext(ctx, `UPDATE snapsvc_budget_entries SET granted = COALESCE(granted, ?), expires = ? WHERE token = ?`, now, now+ttl, w.token); err != nil {
			return poll{}, err
		}
		return poll{granted: true, deadline: sent.Add(b.cfg.TTL)}, nil
	}
	if held > 0 && ahead < n {
		w.delayed = true
	} else {
		vanished = nil // only the first in line probes
	}
	renewed := !w.queued
	if time.Since(w.renewed) >= b.cfg.TTL/3 {
		if _, err := tx.ExecContext(ctx, `UPDATE snapsvc_budget_entries SET expires = ? WHERE token = ? AND expires > ?`, now+ttl, w.token, now); err != nil {
			return poll{}, err
		}
		renewed = true
	}
	return poll{renewed: renewed, wait: budget.Wait{Key: w.key, Holders: holders, Ahead: max(ahead+held-n, 0), Max: n}, vanished: vanished}, nil
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
