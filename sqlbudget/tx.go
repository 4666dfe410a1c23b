package sqlbudget

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/snapsvc/snapsvc/budget"
)

// TxFunc runs f in one database transaction, committing when f returns
// nil and rolling back otherwise. It may run f more than once (as
// microcluster's state.Database().Transaction does when the cluster's
// leader changes or the database is busy): every write sqlbudget makes
// inside f is idempotent, keyed by a token chosen before the
// transaction.
type TxFunc func(ctx context.Context, f func(context.Context, *sql.Tx) error) error

// DBTx is the TxFunc of a plain *sql.DB: BeginTx, f, Commit. It does not
// retry itself (the budget retries whole transactions, see
// Config.Unreachable). For SQLite open the database with a busy timeout
// and immediate transactions (mattn/go-sqlite3:
// "file:budget.db?_txlock=immediate&_busy_timeout=5000&_journal_mode=WAL").
func DBTx(db *sql.DB) TxFunc {
	return func(ctx context.Context, f func(context.Context, *sql.Tx) error) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := f(ctx, tx); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
}

// nowSQL is the database's clock in milliseconds since the Unix epoch.
// SQLite evaluates 'now' once per statement; dqlite runs every statement
// on its leader, so it is the leader's clock.
const nowSQL = `SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)`

func dbNow(ctx context.Context, tx *sql.Tx) (int64, error) {
	var now int64
	err := tx.QueryRowContext(ctx, nowSQL).Scan(&now)
	return now, err
}

// final marks an error that retrying the transaction cannot change (a
// refusal wrapping budget.ErrRefused, or a waiter's own expiry);
// the transaction loop returns it at once.
type finalError struct{ err error }

func (e *finalError) Error() string { return e.err.Error() }
func (e *finalError) Unwrap() error { return e.err }

func final(err error) error { return &finalError{err} }

// UnreachableError is returned when the database could not complete a
// transaction of the budget within Config.Unreachable (no leader, no
// quorum, busy, the connection lost). It wraps
// budget.ErrUnavailable (retryable) and the last failure.
type UnreachableError struct {
	// What the transaction was for ("enqueuing for k8s.kube-apiserver").
	What string
	// For is how long it was tried.
	For time.Duration
	// Attempts is how many times.
	Attempts int
	// Last is the last failure.
	Last error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("%v: sqlbudget: %s: the database did not complete the transaction in %s (%d attempts): %v",
		budget.ErrUnavailable, e.What, e.For.Round(time.Millisecond), e.Attempts, e.Last)
}

// Unwrap returns budget.ErrUnavailable and the last failure.
func (e *UnreachableError) Unwrap() []error { return []error{budget.ErrUnavailable, e.Last} }

// Retryable reports true: a later attempt may find the database.
func (e *UnreachableError) Retryable() bool { return true }

// queueLostError is a waiter whose row expired, not renewed within its
// TTL (the database was unreachable, or this process was frozen): its
// place in the queue is lost, though a new Acquire may queue again. It is
// not an UnreachableError (the database answered): FailOpen does not
// apply.
type queueLostError struct {
	key   string
	since time.Duration // since the row's last renewal
}

func (e *queueLostError) Error() string {
	return fmt.Sprintf("%v: sqlbudget: waiting for %s: this waiter's row expired (last renewed %s ago, beyond its TTL): its place in the queue is lost",
		budget.ErrUnavailable, e.key, e.since.Round(time.Millisecond))
}

func (e *queueLostError) Unwrap() error { return budget.ErrUnavailable }

// Retryable reports true: a new Acquire queues again.
func (e *queueLostError) Retryable() bool { return true }

// tx runs f in a transaction, each attempt bounded by Config.Attempt,
// retrying with jittered backoff until it succeeds, f refuses (a
// *finalError or a context error of the caller), the database refuses
// for good (a *RefusedError: see permanent), ctx ends, or bound passed
// since the first failure of an outage (then an *UnreachableError; a
// database that answers "busy" is not out: see contended). f must be
// idempotent: the transaction function may itself run it more than once,
// and a commit whose answer was lost is retried.
func (b *Budget) tx(ctx context.Context, bound time.Duration, what string, f func(context.Context, *sql.Tx) error) error {
	return b.txRetry(ctx, bound, urgent, what, f)
}

// backoff is how a transaction waits after a failed attempt: from first,
// doubling up to max, drawn within the upper half of that (urgent) or
// anywhere below it (full jitter). With a gate, each attempt waits first
// for a place in it, which it keeps, after the attempt, as long again as
// the attempt took. From urgentAt on (when set), it is urgent's.
type backoff struct {
	first, max time.Duration
	full       bool
	gate       chan struct{}
	urgentAt   time.Time
}

// urgent is the backoff of a holder's transactions (renewal, fence,
// release, ...), which must get through within its TTL, and of the
// operator's: they try again within 100ms, so that a renewal finds the
// database's write lock free between the others' transactions even while
// a crowd of waiters arrives (dqlite answers a second writer "busy" at
// once).
var urgent = backoff{first: 5 * time.Millisecond, max: 100 * time.Millisecond}

// yielding is the backoff of a waiter's polls: full jitter from Poll up
// to max, so that a crowd of waiters that found the database busy (a
// thousand machines queueing at once) spreads out and leaves it to the
// holders' renewals, which retry within tens of milliseconds.
func (b *Budget) yielding(max time.Duration) backoff {
	return backoff{first: b.cfg.Poll, max: max, full: true}
}

// entering is the backoff of a waiter's first transaction, the one that
// queues it: yielding, one of a process's at a time, each followed by a
// pause as long as it took (entryGate): a process's arrivals take at most
// half of the database's time. Once queued, a waiter's polls are spaced
// by its place (their load is bounded whatever the queue's length); the
// arrival of a crowd is not, and a process that queues many waiters at
// once must not put them all before the holders' renewals and the polls
// of those already queued.
func (b *Budget) entering() backoff {
	bo := b.yielding(b.cfg.TTL)
	bo.gate = entryGate
	return bo
}

var entryGate = make(chan struct{}, 1)

// txRetry is tx with the backoff bo.
func (b *Budget) txRetry(ctx context.Context, bound time.Duration, bo backoff, what string, f func(context.Context, *sql.Tx) error) error {
	start := time.Now()
	pause := bo.first
	for attempt := 1; ; attempt++ {
		if bo.gate != nil {
			select {
			case bo.gate <- struct{}{}:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
		began := time.Now()
		actx, cancel := context.WithTimeout(ctx, b.cfg.Attempt)
		b.txs.Add(1)
		err := b.cfg.Tx(actx, func(c context.Context, tx *sql.Tx) error {
			if err := b.ensureSchema(c, tx); err != nil {
				return err
			}
			return f(c, tx)
		})
		cancel()
		if bo.gate != nil {
			// Paced: the gate opens again as long after as the attempt took.
			gate := bo.gate
			time.AfterFunc(time.Since(began), func() { <-gate })
		}
		if err == nil {
			b.failing.Store(false)
			b.markSchema()
			return nil
		}
		b.txFailures.Add(1)
		var r *finalError
		switch {
		case errors.As(err, &r):
			b.failing.Store(false) // the database answered
			return r.err
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case permanent(err):
			b.failing.Store(false)
			return &RefusedError{What: what, Err: err}
		}
		if contended(err) {
			start = time.Now() // the database answered: not an outage
		} else {
			b.failing.Store(true)
		}
		switch {
		case time.Since(start) >= bound:
			return &UnreachableError{What: what, For: time.Since(start), Attempts: attempt, Last: err}
		}
		b.cfg.Logger.Debug("transaction failed; retrying", "what", what, "attempt", attempt, "error", err)
		if !bo.urgentAt.IsZero() && !time.Now().Before(bo.urgentAt) {
			bo, pause = urgent, min(pause, urgent.first)
		}
		d := pause/2 + rand.N(pause/2+1)
		if bo.full {
			d = rand.N(pause + 1)
		}
		if rem := bound - time.Since(start); d > rem {
			d = max(rem, 0)
		}
		if err := sleep(ctx, d); err != nil {
			return context.Cause(ctx)
		}
		pause = min(2*pause, bo.max)
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
