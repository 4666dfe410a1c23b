package sqlbudget

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"

	"github.com/snapsvc/snapsvc/budget"
)

// SchemaVersion is the version of the schema this package writes and
// reads. Its tables (SQLite dialect):
//
//	snapsvc_budget_schema    version INTEGER PRIMARY KEY
//	    one row per migration applied; every transaction of a Budget reads
//	    the highest, and refuses a schema newer than it knows.
//	snapsvc_budget_slots     (version 4) the queue and the holders of every key
//	    id          INTEGER PRIMARY KEY AUTOINCREMENT: the order of
//	                arrival (AUTOINCREMENT never reuses an id)
//	    key         the canonical budget key
//	    token       TEXT UNIQUE: random, one per Acquire, so a retried
//	                transaction finds the row it made
//	    holder      who waits or holds ("node-1 pid 4242")
//	    max_spec    the slot count the participant uses ("1", "25%")
//	    beat        the renewal counter: one more at every write that
//	                renews the row
//	    lease_ms    how long the row lives after a beat unless beaten
//	                again, on an observer's monotonic clock (observe.go)
//	    every_ms    a waiter's promise: it writes again within this
//	                long (0 for holders)
//	    awake       1: a waiter at the front, which polls and writes
//	                every Poll; waiters behind it wait for it while it
//	                keeps that promise
//	    granted     1: it holds a slot
//	    acts        how many of its fences recorded an act
//	    ready_acts  acts at its last MarkReady (or when a readiness probe
//	                saw the vanished holder ready): a holder that vanishes
//	                with acts > ready_acts holds its slot back for its
//	                lock-delay
//	    lock_delay_ms  the holder's lock-delay
//	    since, renewed, granted_at, acted_at, ready_at  milliseconds since
//	                the Unix epoch by the database's clock, for humans
//	                (Status); they decide nothing
//	  index snapsvc_budget_slots_queue (key, granted, id): a waiter reads
//	  the key's holders and the first waiters through it
//	snapsvc_budget_pauses    key TEXT PRIMARY KEY, by, since, reason:
//	    a paused key, until resumed.
//	    token       TEXT (version 2): random, one per Pause, so that a
//	                Resume lifts the very pause it read and no later one
//	                ('' for a pause set before version 2)
//	    halt        TEXT (version 5): a pause the budget set itself (a
//	                halt, Config.HaltAfter), the JSON of its budget.Halt;
//	                '' for an operator's pause. An operator's pause that a
//	                failure halts becomes the halt: by, since and reason
//	                stay, halt is set and the token is a new one (a
//	                Resume that read the pause lifts nothing)
//	snapsvc_budget_history   (version 5) every key's history: budgeted acts,
//	    halts, pauses and resumes (budget.Record), appended only
//	    id          INTEGER PRIMARY KEY AUTOINCREMENT: the order of the
//	                key's records (budget.Record.Seq)
//	    key         the canonical budget key
//	    kind        "act", "halted", "paused", "resumed" (budget.RecordKind)
//	    token       TEXT UNIQUE: one per record written, so a retried
//	                transaction finds the record it made and appends
//	                nothing: an act's is derived from its key and its
//	                budget.Act.ID (random, one per act: see
//	                snapsvc_budget_acts), the others' are random
//	    time        milliseconds since the Unix epoch by the database's
//	                clock, for humans (and HistoryAge's housekeeping): no
//	                decision reads it
//	    holder, machine, action, services (a JSON array), change_id,
//	    spawn, ready (RFC 3339 with nanoseconds, as snapd recorded them;
//	    '' unknown), outcome, reason, waited_ns, held_ns  an act's
//	                budget.Act
//	    by          who paused or resumed (reason: the operator's note)
//	    halt        a "halted" record's budget.Halt (JSON)
//	    failures    the key's failed acts since its last ready act or
//	                resume, as of this record: Record reads it from the
//	                key's newest record, which retention never removes, so
//	                what retention removes never changes whether a key
//	                halts
//	  index snapsvc_budget_history_key (key, id): History reads a key's
//	  newest records, Record the newest one and retention the oldest,
//	  through it
//	snapsvc_budget_acts      (version 5) the tokens of every key's newest
//	    acts (actTokensKept, 1024), apart from the history: a Record of
//	    an ID recorded already finds its token here when retention
//	    (HistoryLimit, HistoryAge) removed its record, and appends and
//	    counts nothing
//	    id          INTEGER PRIMARY KEY AUTOINCREMENT: the order of the
//	                key's acts; Record removes the key's oldest beyond
//	                actTokensKept
//	    key         the canonical budget key
//	    token       TEXT UNIQUE: the act's record's token
//	  index snapsvc_budget_acts_key (key, id)
//
// Version 4 moved the rows from snapsvc_budget_entries (versions 1 to 3,
// whose expiry compared the database's clock) to snapsvc_budget_slots
// and dropped the old table: a member still running an earlier sqlbudget
// finds its table gone at its next transaction and refuses
// (ErrBudgetRefused), rather than keeping a budget of its own beside this
// one. A schema that changes what decides a grant or an expiry is renamed
// so again.
//
// Version 5 adds the history (with its act tokens) and the halt without
// renaming a table: a member still running an earlier sqlbudget (version
// 4) reads the version at its next transaction, finds 5, newer than it
// knows, and refuses (*SchemaError, budget.ErrRefused) at once, Config.SkipMigrate
// or not. During a rolling upgrade the members not yet upgraded refuse
// to restart (they fail closed: none restarts unbudgeted, and none
// restarts without the halt the upgraded ones obey) until they run this
// sqlbudget; their slots' rows expire and hand over as a crashed
// holder's would. Rows queued or held and pauses set before the
// migration are kept as they are (a pause is an operator's: its halt
// is empty).
//
// Migrations are idempotent (each is applied only if its version row is
// missing, in the transaction that inserts that row), so a transaction
// that is retried, or two machines migrating at once, end with the same
// schema.
const SchemaVersion = 5

// migratedLease is the lease of a row carried over from a schema before
// version 4: its holder, on an earlier sqlbudget, can no longer renew it
// (its table is gone), and learns so at its next transaction.
const migratedLease = 20 * time.Second

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
	// 4: expiry by the observers' monotonic clocks (renewal counters and
	// leases), in a table of a new name so that members on an earlier
	// sqlbudget refuse. Rows keep their ids (their order); a holder that
	// fenced and did not mark ready after keeps its act.
	`CREATE TABLE IF NOT EXISTS snapsvc_budget_slots (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		key TEXT NOT NULL,
		token TEXT NOT NULL UNIQUE,
		holder TEXT NOT NULL,
		max_spec TEXT NOT NULL,
		beat INTEGER NOT NULL DEFAULT 0,
		lease_ms INTEGER NOT NULL,
		every_ms INTEGER NOT NULL DEFAULT 0,
		awake INTEGER NOT NULL DEFAULT 0,
		granted INTEGER NOT NULL DEFAULT 0,
		acts INTEGER NOT NULL DEFAULT 0,
		ready_acts INTEGER NOT NULL DEFAULT 0,
		lock_delay_ms INTEGER NOT NULL DEFAULT 0,
		since INTEGER NOT NULL,
		renewed INTEGER NOT NULL,
		granted_at INTEGER,
		acted_at INTEGER,
		ready_at INTEGER
	);
	CREATE INDEX IF NOT EXISTS snapsvc_budget_slots_queue ON snapsvc_budget_slots (key, granted, id);
	INSERT OR IGNORE INTO snapsvc_budget_slots (id, key, token, holder, max_spec, lease_ms, granted, acts, ready_acts, lock_delay_ms, since, renewed, granted_at, acted_at, ready_at)
		SELECT id, key, token, holder, max_spec, ` + strconv.FormatInt(migratedLease.Milliseconds(), 10) + `, granted IS NOT NULL, acted IS NOT NULL,
			CASE WHEN acted IS NOT NULL AND ready >= acted THEN 1 ELSE 0 END, lock_delay, since, expires, granted, acted, ready
		FROM snapsvc_budget_entries;
	DROP TABLE snapsvc_budget_entries;`,
	// 5: the history of every key, and the halt a pause may carry.
	`CREATE TABLE IF NOT EXISTS snapsvc_budget_history (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		key TEXT NOT NULL,
		kind TEXT NOT NULL,
		token TEXT NOT NULL UNIQUE,
		time INTEGER NOT NULL,
		holder TEXT NOT NULL DEFAULT '',
		machine TEXT NOT NULL DEFAULT '',
		action TEXT NOT NULL DEFAULT '',
		services TEXT NOT NULL DEFAULT '',
		change_id TEXT NOT NULL DEFAULT '',
		spawn TEXT NOT NULL DEFAULT '',
		ready TEXT NOT NULL DEFAULT '',
		outcome TEXT NOT NULL DEFAULT '',
		reason TEXT NOT NULL DEFAULT '',
		waited_ns INTEGER NOT NULL DEFAULT 0,
		held_ns INTEGER NOT NULL DEFAULT 0,
		by TEXT NOT NULL DEFAULT '',
		halt TEXT NOT NULL DEFAULT '',
		failures INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX IF NOT EXISTS snapsvc_budget_history_key ON snapsvc_budget_history (key, id);
	CREATE TABLE IF NOT EXISTS snapsvc_budget_acts (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		key TEXT NOT NULL,
		token TEXT NOT NULL UNIQUE
	);
	CREATE INDEX IF NOT EXISTS snapsvc_budget_acts_key ON snapsvc_budget_acts (key, id);
	ALTER TABLE snapsvc_budget_pauses ADD COLUMN halt TEXT NOT NULL DEFAULT '';`,
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
	current, err := schemaVersion(ctx, tx, true)
	if err != nil {
		return err
	}
	for i := current; i < len(migrations); i++ {
		if err := applyMigration(ctx, tx, i); err != nil {
			return err
		}
	}
	return nil
}

// schemaVersion reads the database's schema version (one read of the
// version table's primary key) and refuses one newer than SchemaVersion.
// create makes the version table when it is missing (Migrate); without
// it, a database with no budget schema reads as version 0.
func schemaVersion(ctx context.Context, tx *sql.Tx, create bool) (int, error) {
	if create {
		if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS snapsvc_budget_schema (version INTEGER PRIMARY KEY)`); err != nil {
			return 0, err
		}
	}
	var current int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM snapsvc_budget_schema`).Scan(&current); err != nil {
		return 0, err
	}
	if current > SchemaVersion {
		return 0, final(&SchemaError{Found: current})
	}
	return current, nil
}

// SchemaError is a database whose budget schema is newer than this
// sqlbudget knows: members of the cluster were upgraded, and this one
// must be too before it takes part again (their budget and this one's
// would not count each other's holders). Every transaction of a Budget
// checks it, Config.SkipMigrate or not. It wraps budget.ErrRefused: no
// retry helps until this machine runs the newer sqlbudget.
type SchemaError struct {
	// Found is the database's schema version.
	Found int
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("%v: sqlbudget: the database's budget schema is version %d, this sqlbudget knows up to %d: upgrade this machine's sqlbudget before it takes part in the budget again",
		budget.ErrRefused, e.Found, SchemaVersion)
}

// Unwrap returns budget.ErrRefused.
func (e *SchemaError) Unwrap() error { return budget.ErrRefused }

// Retryable reports false: only an upgrade helps.
func (e *SchemaError) Retryable() bool { return false }
