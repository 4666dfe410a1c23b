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
// since the first failure (then an *UnreachableError). f must be
// idempotent: the transaction function may itself run it more than once,
// and a commit whose answer was lost is retried.
func (b *Budget) tx(ctx context.Context, bound time.Duration, what string, f func(context.Context, *sql.Tx) error) error {
	start := time.Now()
	pause := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, b.cfg.Attempt)
		b.txs.Add(1)
		err := b.cfg.Tx(actx, func(c context.Context, tx *sql.Tx) error {
			if err := b.ensureSchema(c, tx); err != nil {
				return err
			}
			return f(c, tx)
		})
		cancel()
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
		b.failing.Store(true)
		switch {
		case time.Since(start) >= bound:
			return &UnreachableError{What: what, For: time.Since(start), Attempts: attempt, Last: err}
		}
		b.cfg.Logger.Debug("transaction failed; retrying", "what", what, "attempt", attempt, "error", err)
		d := pause/2 + rand.N(pause/2+1)
		if rem := bound - time.Since(start); d > rem {
			d = max(rem, 0)
		}
		if err := sleep(ctx, d); err != nil {
			return context.Cause(ctx)
		}
		pause = min(2*pause, 500*time.Millisecond)
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
