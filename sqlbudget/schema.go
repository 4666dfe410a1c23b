package sqlbudget

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/snapsvc/snapsvc/budget"
)

// SchemaVersion is the version of the schema this package writes and
// reads. Its tables (SQLite dialect; every timestamp is milliseconds since
// the Unix epoch by the database's clock):
//
//	snapsvc_budget_schema    version INTEGER PRIMARY KEY
//	    one row per migration applied.
//	snapsvc_budget_entries   the queue and the holders of every key
//	    id          INTEGER PRIMARY KEY AUTOINCREMENT: the order of
//	                arrival (AUTOINCREMENT never reuses an id)
//	    key         the canonical budget key
//	    token       TEXT UNIQUE: random, one per Acquire, so a retried
//	                transaction finds the row it made
//	    holder      who waits or holds ("node-1 pid 4242")
//	    max_spec    the slot count the participant uses ("1", "25%")
//	    since       when it queued
//	    expires     when it expires unless renewed (TTL after the last
//	                renewal)
//	    granted     when it took its slot (NULL while waiting)
//	    acted       the last Fence: the holder was about to act (NULL:
//	                never)
//	    ready       the last MarkReady, or the moment a readiness probe
//	                saw the vanished holder's service ready (NULL: never)
//	    lock_delay  the holder's lock-delay in ms
//	    seq         (version 3) the key's arrival number: one more than
//	                the key's last row's when queued (a waiter far back
//	                estimates its place from it)
//	    due         (version 3) a waiter's promise: it writes its row
//	                again by then (NULL for holders); waiters behind one
//	                whose promise is far off do not wait for it at the
//	                front
//	  indexes (key, id) and, version 3, snapsvc_budget_entries_queue
//	  (key, granted, id): a waiter reads the key's holders and the first
//	  waiters ahead of it through it, never the whole queue
//	snapsvc_budget_pauses    key TEXT PRIMARY KEY, by, since, reason:
//	    a paused key, until resumed.
//	    token       TEXT (version 2): random, one per Pause, so that a
//	                Resume lifts the very pause it read and no later one
//	                ('' for a pause set before version 2)
//
// Migrations are idempotent (each is applied only if its version row is
// missing, in the transaction that inserts that row), so a transaction
// that is retried, or two machines migrating at once, end with the same
// schema.
const SchemaVersion = 3

// migrations[i] brings the schema from version i to i+1.
var migrations = []string{
	`CREATE TABLE IF NOT EXISTS snapsvc_budget_entries (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		key TEXT NOT NULL,
		token TEXT NOT NULL UNIQUE,
		holder TEXT NOT NULL,
		max_spec TEXT NOT NULL,
		since INTEGER NOT NULL,
		expires INTEGER NOT NULL,
		granted INTEGER,
		acted INTEGER,
		ready INTEGER,
		lock_delay INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX IF NOT EXISTS snapsvc_budget_entries_key ON snapsvc_budget_entries (key, id);
	CREATE TABLE IF NOT EXISTS snapsvc_budget_pauses (
		key TEXT PRIMARY KEY,
		by TEXT NOT NULL,
		since INTEGER NOT NULL,
		reason TEXT NOT NULL DEFAULT ''
	);`,
	// 2: the pause's identity, for a Resume conditional on the pause it
	// lifts.
	`ALTER TABLE snapsvc_budget_pauses ADD COLUMN token TEXT NOT NULL DEFAULT ''`,
	// 3: the queue read in O(1) rows a poll: arrival numbers, promises,
	// the index of holders and waiters. A row queued before has its id
	// as arrival number (ids grow, so the order holds) and no promise.
	`ALTER TABLE snapsvc_budget_entries ADD COLUMN seq INTEGER;
	ALTER TABLE snapsvc_budget_entries ADD COLUMN due INTEGER;
	UPDATE snapsvc_budget_entries SET seq = id;
	CREATE INDEX IF NOT EXISTS snapsvc_budget_entries_queue ON snapsvc_budget_entries (key, granted, id);`,
}

// SchemaUpdates returns the schema's migrations as functions of the shape
// of a microcluster (LXD) schema update, func(ctx, tx) error, in order: an
// app that manages its schema itself appends them to its list of schema
// extensions (and sets Config.SkipMigrate). Each is idempotent.
func SchemaUpdates() []func(context.Context, *sql.Tx) error {
	out := make([]func(context.Context, *sql.Tx) error, len(migrations))
	for i := range migrations {
		out[i] = func(ctx context.Context, tx *sql.Tx) error { return applyMigration(ctx, tx, i) }
	}
	return out
}

// applyMigration brings the schema to version i+1, unless that version's
// row says it is there already (a retried transaction, another machine
// that migrated first, the application's schema machinery).
func applyMigration(ctx context.Context, tx *sql.Tx, i int) error {
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS snapsvc_budget_schema (version INTEGER PRIMARY KEY)`); err != nil {
		return err
	}
	var done bool
	if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM snapsvc_budget_schema WHERE version = ?)`, i+1).Scan(&done); err != nil {
		return err
	}
	if done {
		return nil
	}
	if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
		return fmt.Errorf("sqlbudget: schema version %d: %w", i+1, err)
	}
	_, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO snapsvc_budget_schema (version) VALUES (?)`, i+1)
	return err
}

// Migrate brings the budget's tables to SchemaVersion inside tx. It is
// idempotent. A database whose schema is newer than this package knows
// is refused (an error wrapping budget.ErrRefused): a machine
// running an older sqlbudget must not share a newer schema.
func Migrate(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS snapsvc_budget_schema (version INTEGER PRIMARY KEY)`); err != nil {
		return err
	}
	var current int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM snapsvc_budget_schema`).Scan(&current); err != nil {
		return err
	}
	if current > SchemaVersion {
		return final(fmt.Errorf("%w: sqlbudget: the database's budget schema is version %d, this sqlbudget knows up to %d: upgrade it", budget.ErrRefused, current, SchemaVersion))
	}
	for i := current; i < len(migrations); i++ {
		if err := applyMigration(ctx, tx, i); err != nil {
			return err
		}
	}
	return nil
}
