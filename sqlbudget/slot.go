package sqlbudget

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/budget"
)

// slot is a held slot: a granted row, renewed every TTL/3 until
// released or lost.
type slot struct {
	b     *Budget
	key   string
	token string
	since time.Time
	max   int

	lost chan struct{}
	stop chan struct{} // closed: the renewer ends
	done chan struct{} // closed by the renewer

	mu        sync.Mutex
	err       error     // why it was lost
	deadline  time.Time // local: the row cannot have expired before (last renewal's send time + TTL)
	released  bool      // a Release succeeded
	relFailed time.Time // the first failed Release (zero: none)
	stopOnce  sync.Once
	relMu     sync.Mutex // one Release at a time
}

var (
	_ budget.Abandoner = (*slot)(nil)
	_ budget.Fencer    = (*slot)(nil)
	_ budget.Readier   = (*slot)(nil)
)

func newSlot(b *Budget, w *waiter, deadline time.Time) *slot {
	s := &slot{b: b, key: w.key, token: w.token, since: time.Now(), max: w.max, deadline: deadline,
		lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go s.renew()
	return s
}

// Key is the slot's key.
func (s *slot) Key() string { return s.key }

// Holder is this participant's identity.
func (s *slot) Holder() string { return s.b.cfg.Holder }

// Lost is closed once the slot is known lost: its row expired or was
// deleted, or it could not be renewed within its TTL.
func (s *slot) Lost() <-chan struct{} { return s.lost }

// Err says why the slot was lost, or nil.
func (s *slot) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *slot) setLost(err error) {
	s.mu.Lock()
	if s.err != nil || s.released {
		s.mu.Unlock()
		return
	}
	s.err = err
	s.mu.Unlock()
	close(s.lost)
	held := time.Since(s.since)
	s.b.count(func(m *Metrics) { m.Holding--; m.Lost++; m.HoldSeconds += held.Seconds() })
	s.b.cfg.Logger.Warn("slot lost", "key", s.key, "error", err)
	s.b.emit(Event{Kind: EventLost, Key: s.key, Held: held, Max: s.max, Err: err})
	s.stopRenewing()
}

func (s *slot) localDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

func (s *slot) renewedAt(sent time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d := sent.Add(s.b.cfg.TTL); d.After(s.deadline) {
		s.deadline = d
	}
}

func (s *slot) stopRenewing() { s.stopOnce.Do(func() { close(s.stop) }) }

// lostAt is when the slot must be taken for lost unless a renewal is
// answered before: its local deadline (the send time of the last answered
// renewal plus TTL; the database set the row's expiry after receiving it)
// less Config.ClockSkew (a new leader's clock may run that far ahead).
// No other machine can take the slot before then.
func (s *slot) lostAt() time.Time { return s.localDeadline().Add(-s.b.cfg.ClockSkew) }

// renew extends the row TTL/3 after its last answered renewal (a Fence
// renews it too) while the slot is held. The slot is lost when its row is
// found expired or gone, and, when no renewal is answered, at lostAt:
// the holder learns it before anyone else can be granted the slot. A
// renewal not answered within TTL/3 of its start counts as missed
// (Metrics.RenewalsMissed: the holder's margin fell below two thirds of
// its TTL). After a failed Release it goes on for Config.ReleaseRetry, so
// that a retried Release hands over at once.
func (s *slot) renew() {
	defer close(s.done)
	b := s.b
	every := b.cfg.TTL / 3
	for {
		lostAt := s.lostAt()
		due := s.localDeadline().Add(every - b.cfg.TTL)
		t := time.NewTimer(time.Until(due))
		if lostAt.Before(due) {
			t.Reset(time.Until(lostAt))
		}
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-t.C:
		}
		if !time.Now().Before(s.lostAt()) {
			s.setLost(fmt.Errorf("%w: sqlbudget: %s: no renewal of the slot's row answered within its %s TTL (less the %s clock skew); another machine may take it now", budget.ErrSlotLost, s.key, b.cfg.TTL, b.cfg.ClockSkew))
			return
		}
		if time.Now().Before(s.localDeadline().Add(every - b.cfg.TTL)) {
			continue // a Fence renewed the row meanwhile
		}
		s.mu.Lock()
		relFailed := s.relFailed
		s.mu.Unlock()
		if !relFailed.IsZero() && time.Since(relFailed) > b.cfg.ReleaseRetry {
			b.cfg.Logger.Warn("release not retried in time: the slot's row is left to expire", "key", s.key)
			return
		}
		lostAt = s.lostAt()
		ctx, cancel := context.WithDeadline(context.Background(), lostAt)
		sent := time.Now()
		var ok bool
		err := b.tx(ctx, time.Until(lostAt), "renewing the slot of "+s.key, func(ctx context.Context, tx *sql.Tx) error {
			now, err := dbNow(ctx, tx) // for humans only
			if err != nil {
				return err
			}
			res, err := tx.ExecContext(ctx, `UPDATE snapsvc_budget_slots SET beat = beat + 1, renewed = ?, lease_ms = ? WHERE token = ? AND granted = 1`, now, b.cfg.TTL.Milliseconds(), s.token)
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			ok = n == 1
			return err
		})
		cancel()
		took := time.Since(sent)
		b.count(func(m *Metrics) {
			m.Renewals++
			if err != nil || took > every {
				m.RenewalsMissed++
			}
		})
		switch {
		case err == nil && ok:
			s.renewedAt(sent)
		case err == nil:
			s.setLost(fmt.Errorf("%w: sqlbudget: %s: the slot's row was deleted (judged expired by another participant, or by an operator); another machine may hold it now", budget.ErrSlotLost, s.key))
			return
		case errors.Is(err, budget.ErrRefused):
			// No renewal can succeed: the row will expire. Say so now.
			s.setLost(fmt.Errorf("%w: sqlbudget: %s: the slot's row cannot be renewed: %w", budget.ErrSlotLost, s.key, err))
			return
		default:
			b.cfg.Logger.Warn("renewal not answered", "key", s.key, "error", err)
		}
	}
}

// fenceState is what one fence transaction found.
type fenceState struct {
	gone   bool
	paused *PauseRecord
}

// Fence confirms, in one transaction, that the slot's row is live and
// granted and that the key is not paused, and records that the holder is
// about to act (and renews the row, so the confirmation stands a whole
// TTL by the database's clock). It returns how long the confirmation
// stands, counted from the call: TTL less Config.ClockSkew from the start
// of the transaction that confirmed. While the key is paused it waits,
// holding the slot, until it is resumed (then it confirms again), the
// slot is lost (budget.ErrSlotLost) or ctx ends (an error wrapping
// budget.ErrPaused). When it cannot confirm before the row might
// expire, its error wraps budget.ErrUnavailable: do not act.
func (s *slot) Fence(ctx context.Context) (budget.Validity, error) {
	call := time.Now()
	b := s.b
	reported := false
	var last *PauseRecord // the pause (or halt) seen at the last look
	for {
		if err := s.Err(); err != nil {
			return budget.Validity{}, err
		}
		if s.isReleased() {
			return budget.Validity{}, fmt.Errorf("%w: sqlbudget: the slot of %s was released", budget.ErrSlotLost, s.key)
		}
		deadline := s.lostAt()
		if !time.Now().Before(deadline) {
			s.setLost(fmt.Errorf("%w: sqlbudget: %s: the slot's row may have expired (no renewal answered within its %s TTL, less the %s clock skew)", budget.ErrSlotLost, s.key, b.cfg.TTL, b.cfg.ClockSkew))
			return budget.Validity{}, s.Err()
		}
		fctx, cancel := context.WithDeadline(ctx, deadline)
		sent := time.Now()
		var st fenceState
		err := b.tx(fctx, time.Until(deadline), "fencing the slot of "+s.key, func(ctx context.Context, tx *sql.Tx) error {
			st = fenceState{}
			now, err := dbNow(ctx, tx)
			if err != nil {
				return err
			}
			p, err := pauseHolding(ctx, tx, s.key)
			if err != nil {
				return err
			}
			var res sql.Result
			if p != nil {
				// Paused: renew the row (the slot is held meanwhile: the
				// local deadline moves only with the row's), act on
				// nothing.
				st.paused = p
				res, err = tx.ExecContext(ctx, `UPDATE snapsvc_budget_slots SET beat = beat + 1, renewed = ?, lease_ms = ? WHERE token = ? AND granted = 1`,
					now, b.cfg.TTL.Milliseconds(), s.token)
			} else {
				res, err = tx.ExecContext(ctx, `UPDATE snapsvc_budget_slots SET acts = acts + 1, acted_at = ?, beat = beat + 1, renewed = ?, lease_ms = ? WHERE token = ? AND granted = 1`,
					now, now, b.cfg.TTL.Milliseconds(), s.token)
			}
			if err != nil {
				return err
			}
			n, err := res.RowsAffected()
			st.gone = n == 0
			return err
		})
		cancel()
		switch {
		case err == nil && st.gone:
			s.setLost(fmt.Errorf("%w: sqlbudget: fencing %s: the slot's row was deleted (judged expired by another participant, or by an operator); another machine may hold it now", budget.ErrSlotLost, s.key))
			b.emit(Event{Kind: EventFenceFailed, Key: s.key, Err: s.Err()})
			return budget.Validity{}, s.Err()
		case err == nil && st.paused != nil:
			s.renewedAt(sent)
			last = st.paused
			if !reported {
				reported = true
				b.count(func(m *Metrics) { m.PauseWaits++ })
				b.emit(Event{Kind: EventPaused, Key: s.key, Err: pauseNote(st.paused), Halt: st.paused.Halt})
			}
			if err := s.waitPoll(ctx, st.paused); err != nil {
				return budget.Validity{}, err
			}
			continue
		case err == nil:
			s.renewedAt(sent)
			valid := sent.Add(b.cfg.TTL - b.cfg.ClockSkew).Sub(call)
			b.count(func(m *Metrics) { m.Fences++ })
			b.emit(Event{Kind: EventFenced, Key: s.key, Held: time.Since(s.since)})
			return budget.ValidFor(valid), nil
		case errors.Is(err, budget.ErrRefused):
			return budget.Validity{}, err
		case ctx.Err() != nil && reported:
			// The key was paused at the last look and ctx ended while
			// looking again: nothing was sent, the pause (or halt) is why.
			return budget.Validity{}, pausedError(s.key, last, context.Cause(ctx))
		case ctx.Err() != nil:
			return budget.Validity{}, fmt.Errorf("%w: sqlbudget: fencing %s: %w", budget.ErrUnavailable, s.key, context.Cause(ctx))
		default:
			err = fmt.Errorf("%w: sqlbudget: fencing %s: could not confirm the slot before its row might expire: %w", budget.ErrUnavailable, s.key, err)
			b.emit(Event{Kind: EventFenceFailed, Key: s.key, Err: err})
			return budget.Validity{}, err
		}
	}
}

// waitPoll waits one poll interval while paused by p, or returns why it
// must stop: the slot was lost or released, or ctx ended (ErrBudgetPaused;
// for a halt, a *HaltedError, ErrBudgetHalted too).
func (s *slot) waitPoll(ctx context.Context, p *PauseRecord) error {
	t := time.NewTimer(s.b.cfg.Poll)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-s.lost:
		return s.Err()
	case <-ctx.Done():
		return pausedError(s.key, p, context.Cause(ctx))
	}
}

// pauseNote is a "paused" event's Err: who paused the key and why, or
// the halt.
func pauseNote(p *PauseRecord) error {
	if p.Halt != nil {
		return &HaltedError{Halt: *p.Halt}
	}
	return fmt.Errorf("paused by %s: %s", p.By, p.Reason)
}

// awaitAllowed waits, holding the slot, while its key is paused (Acquire's
// last step). It reports the pause through progress once.
func (s *slot) awaitAllowed(ctx context.Context, progress func(budget.Wait)) error {
	b := s.b
	reported := false
	var last *PauseRecord // the pause (or halt) seen at the last look
	for {
		var p *PauseRecord
		err := b.tx(ctx, b.cfg.Unreachable, "reading the pause of "+s.key, func(ctx context.Context, tx *sql.Tx) (err error) {
			p, err = pauseHolding(ctx, tx, s.key)
			return err
		})
		switch {
		case err != nil && last != nil && ctx.Err() != nil:
			return pausedError(s.key, last, context.Cause(ctx))
		case err != nil:
			return err
		}
		last = p
		if p == nil {
			return nil
		}
		if !reported {
			reported = true
			b.count(func(m *Metrics) { m.PauseWaits++ })
			b.emit(Event{Kind: EventPaused, Key: s.key, Err: pauseNote(p), Halt: p.Halt})
			if progress != nil {
				msg := fmt.Sprintf("paused by %s since %s", p.By, p.Since.Format(time.RFC3339))
				if p.Halt != nil {
					msg = fmt.Sprintf("halted since %s (resume it to go on)", p.Since.Format(time.RFC3339))
				}
				if p.Reason != "" {
					msg += ": " + p.Reason
				}
				progress(budget.Wait{Key: s.key, Holders: []string{msg}, Max: s.max})
			}
		}
		if err := s.waitPoll(ctx, p); err != nil {
			if errors.Is(err, budget.ErrSlotLost) {
				// Nothing acted on it: a later Acquire may succeed.
				return fmt.Errorf("%w: the slot was lost while the key was paused: %w", budget.ErrUnavailable, err)
			}
			return err
		}
	}
}

// MarkReady records that the services the holder disrupted are ready
// again: if the holder vanishes from now on (until its next Fence), its
// slot is free at its row's expiry, without a lock-delay.
func (s *slot) MarkReady(ctx context.Context) error {
	b := s.b
	err := b.tx(ctx, b.cfg.Unreachable, "marking "+s.key+" ready", func(ctx context.Context, tx *sql.Tx) error {
		now, err := dbNow(ctx, tx)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE snapsvc_budget_slots SET ready_acts = acts, ready_at = ? WHERE token = ?`, now, s.token)
		return err
	})
	if err != nil {
		return fmt.Errorf("sqlbudget: marking %s ready: %w", s.key, err)
	}
	b.emit(Event{Kind: EventReady, Key: s.key, Held: time.Since(s.since)})
	return nil
}

func (s *slot) isReleased() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.released
}

// Release gives the slot back: it deletes the slot's row, and the next
// waiter takes it at its next poll (at once in this process). It may be
// called more than once: once it succeeded it does nothing; after a
// failure a new call really tries again, and meanwhile the row is still
// renewed (for Config.ReleaseRetry) so that the retry hands over without
// a lock-delay. A lost slot whose holder acted and did not mark ready
// keeps its row (the lock-delay protects the service it may have
// restarted).
func (s *slot) Release(ctx context.Context) error {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if s.isReleased() {
		return nil
	}
	b := s.b
	bound := b.cfg.Unreachable
	if dl, ok := ctx.Deadline(); ok {
		bound = min(bound, time.Until(dl))
	}
	// A holder past its own deadline (or lost) may have been judged
	// expired: its row then goes only if it holds nothing back (no act
	// without a readiness after it), so the lock-delay protects a
	// restart it may have sent. Within its deadline no one can have.
	held := s.Err() == nil && time.Now().Before(s.lostAt())
	err := b.tx(ctx, bound, "releasing the slot of "+s.key, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM snapsvc_budget_slots WHERE token = ? AND (? OR acts <= ready_acts)`, s.token, held)
		return err
	})
	heldFor := time.Since(s.since)
	if err != nil {
		s.mu.Lock()
		if s.relFailed.IsZero() {
			s.relFailed = time.Now()
		}
		s.mu.Unlock()
		b.count(func(m *Metrics) { m.ReleaseFailed++ })
		err = fmt.Errorf("sqlbudget: releasing the slot of %s (retry: it is kept alive for %s meanwhile): %w", s.key, b.cfg.ReleaseRetry, err)
		b.emit(Event{Kind: EventReleaseFailed, Key: s.key, Held: heldFor, Err: err})
		return err
	}
	s.mu.Lock()
	wasLost := s.err != nil
	s.released = true
	s.mu.Unlock()
	s.stopRenewing()
	<-s.done
	if !wasLost {
		b.count(func(m *Metrics) { m.Holding--; m.Released++; m.HoldSeconds += heldFor.Seconds() })
	}
	b.emit(Event{Kind: EventReleased, Key: s.key, Held: heldFor, Max: s.max})
	b.wakeUp(s.key)
	return nil
}

// Abandon lets go of the slot as a holder that crashed would
// (budget.Abandoner): its renewals stop, and its row stays. The other
// participants judge it expired once they have seen its counter stand
// still for its lease, and, since it acted without a readiness after, hold
// the slot back for the lock-delay after that. A later Release does
// nothing.
func (s *slot) Abandon() {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if s.isReleased() {
		return
	}
	s.mu.Lock()
	wasLost := s.err != nil
	s.released = true
	s.mu.Unlock()
	s.stopRenewing()
	<-s.done
	held := time.Since(s.since)
	if !wasLost {
		s.b.count(func(m *Metrics) { m.Holding--; m.HoldSeconds += held.Seconds() })
	}
	s.b.cfg.Logger.Warn("slot abandoned: it is freed as a crashed holder's would be", "key", s.key)
}

// abandon gives back a slot that Acquire took but does not return (its
// context ended while the key was paused): the holder never acted, so
// its row holds nothing back once it expires. It stops the renewals and
// deletes the row within one Attempt, not at all while the database is
// failing (Budget.failing), so that Acquire returns promptly: unlike
// Release it never waits for an unreachable database.
func (s *slot) abandon() {
	b := s.b
	s.mu.Lock()
	wasLost := s.err != nil
	s.released = true
	s.mu.Unlock()
	s.stopRenewing()
	<-s.done
	held := time.Since(s.since)
	if !wasLost {
		b.count(func(m *Metrics) { m.Holding--; m.HoldSeconds += held.Seconds() })
	}
	defer b.wakeUp(s.key)
	if b.failing.Load() {
		return
	}
	b.remove(s.token)
}

// unbudgeted is a slot granted without the database (no cluster yet, or
// fail open). It is never lost.
type unbudgeted struct {
	key, holder string
	never       chan struct{}
}

func (u *unbudgeted) Key() string                     { return u.key }
func (u *unbudgeted) Holder() string                  { return u.holder }
func (u *unbudgeted) Lost() <-chan struct{}           { return u.never }
func (u *unbudgeted) Err() error                      { return nil }
func (u *unbudgeted) Release(context.Context) error   { return nil }
func (u *unbudgeted) MarkReady(context.Context) error { return nil }

// Fence confirms for ever: nothing can take an unbudgeted slot away.
func (u *unbudgeted) Fence(context.Context) (budget.Validity, error) {
	return budget.Unbounded(), nil
}
