// Package sqlbudget is a budget.Budget on a SQL database, for
// clusters that coordinate over a replicated SQLite (dqlite, as every
// microcluster app does: microceph, microovn) rather than etcd: it keeps
// the cluster's machines from restarting the same service on more than
// Max of them at once, and from starting the next restart before the
// previous machine's service is ready again (snapsvc.WithRestartBudget
// holds the slot until the caller's readiness probe passes).
//
//	// In a microcluster daemon, once the database is up (OnStart hook):
//	b, _ := sqlbudget.New(sqlbudget.Config{Tx: s.Database().Transaction, Max: 1, Holder: s.Name()})
//	c, _ := snapsvc.New(snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
//		Ready: func(string) probe.Probe { return northdReady },
//	}))
//	_, err := c.Restart(ctx, []string{"microovn.ovn-northd"}, snapsvc.RestartOptions{})
//
// It works on a transaction function, func(ctx, func(ctx, *sql.Tx) error)
// error (microcluster's state.Database().Transaction), or on a plain
// *sql.DB (DBTx); it speaks SQLite's dialect and imports no database
// driver: it is its own Go module, and dqlite stays the application's
// dependency. docs/microcluster.md in the repository is the recipe.
//
// # Design
//
// One row per Acquire in snapsvc_budget_entries (schema: SchemaVersion),
// ordered by an AUTOINCREMENT id, so waiters are served first come, first
// served: a waiter takes a slot once fewer than Max live holders and
// waiters arrived before it and no slot is held back by a lock-delay.
// A holder's row lives TTL after its last renewal (every TTL/3); a
// waiter's until two thirds of a TTL after the write it promised next
// (below); a row not renewed in time no longer counts, so a crashed or
// cut-off machine's slot, or place, frees itself. Every decision is one
// transaction: the check and the grant, the fence and the record of the
// act, the release.
//
// # Waiting at fleet scale
//
// A waiter's poll is one transaction that reads a small fixed set of rows
// through an index, never the whole queue: its own row, the key's
// holders (Max, and vanished holders under a lock-delay) and the first
// few waiters ahead of it (Max+8). Within those it knows its place
// exactly; further back it estimates it from the rows' arrival numbers
// (budget.Wait.Ahead, as it reports it, is then that estimate: it counts
// waiters that left the queue since, until the waiter moves up).
// Waiters poll less often the further back they are: the first Max+1
// every Config.Poll (default TTL/8, at most 250 ms), each one behind them
// Config.PollSpacing (default 2×Poll) later than the one ahead, so the
// whole queue costs O(log n) transactions a second (17–18 measured for
// 1,000 waiters with the defaults, on SQLite and on dqlite alike; polling
// every waiter each Poll cost O(n), and saturated either database), and
// only a waiter among the first Max takes a free slot. A slot released by
// another machine is taken within about one Poll; a Release wakes the
// first waiters of the same process at once. A waiter writes its row only
// when the write it promised comes due: every TTL/3 near the front, at
// each of its polls further back. Waiters that the queue reached sooner
// than they poll (those ahead gave up at once), whose promised write is
// more than 2×TTL off, are not waited for at the front; they are served
// again at their next poll.
//
// The holders' renewals and fences are never starved by waiters: the
// waiters' load is bounded as above; when the database answers busy, a
// waiter backs off with full jitter (up to TTL/3; a waiter entering the
// queue up to TTL, and a process's arrivals enter one at a time, paced to
// half of the database's time), while holders (and the waiters at the
// front, and a waiter whose row is half through its lease) retry within
// 100 ms. A database that answers "busy"
// (SQLITE_BUSY, SQLITE_LOCKED: dqlite's leader says so at once to a second
// writer) is reachable: contention never counts toward Config.Unreachable,
// so a crowd of waiters arriving at once never makes anyone fail open.
// When a holder still cannot renew, it learns that its slot is lost (Lost
// closes) ClockSkew before its row can expire: before anyone else can be
// granted the slot, as etcdbudget's holders do.
//
// # Whose clock decides expiry
//
// The database's. Every transaction reads SQLite's julianday('now') once
// and judges every row against it; dqlite runs every statement on its
// leader, so expiry is judged by the clock of the node that leads when the
// transaction runs (with plain SQLite, by the one machine's clock). The
// machines' own clocks never decide whether a slot is free. Consequences:
//
//   - A leader change moves the clock: if two nodes' clocks are d apart,
//     a row may expire up to d early or late after a change of leader.
//     Keep the nodes' clocks synchronised (NTP) and Config.ClockSkew (the
//     bound you promise, default 500 ms) above their skew.
//   - A holder knows, on its own monotonic clock, the send time of its last
//     answered renewal; from that plus TTL it cannot have expired (the
//     database set the row's expiry after receiving the renewal). A holder
//     that cannot renew reports Lost itself ClockSkew before then.
//   - Fence returns how long its confirmation stands: TTL less
//     ClockSkew, from the start of the transaction that confirmed (the
//     row was renewed in it), counted from the call. A caller that has not
//     acted within that fences again.
//   - Timestamps in KeyStatus (Since, Acted, Expires ...) are the
//     database's; Event times and durations are the machine's.
//
// # Fence, act, ready: the lock-delay
//
// A holder's Fence (snapsvc calls it right before every request that
// disrupts) checks in one transaction that its row is live and granted and
// that the key is not paused, then records acted = now and renews the row.
// A key is paused by its own pause or by one of its parts' or their
// snaps' (budget.PauseScopes): pausing "k8s" holds back "k8s.kubelet", as
// in etcdbudget. While the key is paused it waits, holding the slot (its
// row renewed at each check), and checks again;
// when its context ends first it fails with an error wrapping
// budget.ErrPaused. MarkReady (snapsvc calls it once the readiness
// checks passed) records ready = now.
//
// A holder that vanishes (its row expires without a release) is judged by
// those records: one that never fenced, or marked ready after its last
// fence, never acted on a service that is down: its slot is free at once.
// One that fenced and did not mark ready may have sent a restart that
// snapd carries on without it: its slot stays unusable for its
// Config.LockDelay after the expiry (DefaultLockDelay, 1 minute). A waiter
// first in line may end that delay early with Config.HolderReady, which is
// given the time of the vanished holder's act and must answer true only on
// readiness that postdates it. The probe runs beside the wait, each call
// bounded (5 s): the waiter goes on polling and renewing its row while it
// runs, returns at once when its context ends, and a probe that hangs is
// not called again until it returns.
//
// The bound a holder frozen after its Fence can overlap another is its
// confirmation (what Fence returned) plus the time its request takes:
// with every default the successor starts no earlier than the row's
// expiry plus the lock-delay, TTL + 1 minute after the fence.
//
// # Retried transactions
//
// The transaction function may run f more than once, and a commit whose
// answer was lost is retried: every write is idempotent. An Acquire picks
// a random token before its first transaction; its row is inserted with
// INSERT OR IGNORE on that token; the grant is COALESCE(granted, now);
// renewals, fences and MarkReady update the token's row; Release and a
// cancelled Acquire delete it. A failed transaction is retried with
// backoff, each attempt bounded by Config.Attempt, until
// Config.Unreachable has passed: then *UnreachableError, which wraps
// budget.ErrUnavailable (retryable); only then may FailOpen grant a slot.
// Answers no retry changes wrap budget.ErrRefused, at once, and never fail
// open: a bad key, a row deleted by an operator, participants using
// different Max, a newer schema, and a database that refuses for good, a
// *RefusedError: its tables missing, a read-only or closed handle, a full
// or corrupt database, a user without permission. The database's errors
// are told apart by SQLite's result code where the driver's error carries
// it (go-dqlite, mattn/go-sqlite3, modernc.org/sqlite), else by SQLite's
// message; busy, locked, I/O, lost connections, a dqlite node that is not
// the leader, and whatever is not recognised, are retried.
//
// # Release
//
// Release deletes the row; the next waiter takes the slot at its next
// poll. It may be called more than once: once it succeeded it does
// nothing, and after a failure a new call really tries again; meanwhile
// the row is still renewed (for Config.ReleaseRetry), so a release that
// failed because the database was unreachable for a moment, retried, hands
// over without a lock-delay. A lost slot whose holder acted and never
// marked ready keeps its row (its lock-delay protects the restart).
//
// # Operator controls, events, metrics
//
// Status reads a key's holders, waiters (telling those held back only by
// a lock-delay), vanished holders under lock-delay and pause in one
// transaction; Pause and Resume set and lift a cluster-wide pause, read at
// every Fence. Resume lifts the pause it read and no other (each pause has
// a token of its own): retried after a lost answer, it never lifts a
// pause set meanwhile. An Acquire that took its slot but waits on a pause
// gives it back in one attempt when its context ends (none while the
// database is failing: the row expires within TTL), so it returns at
// once. Config.OnEvent receives every step (waiting, acquired, paused,
// fenced, ready, lost, released, ...) and Metrics returns the counters,
// as etcdbudget.Controlled does. Max may be a share of the
// cluster's members (Config.Percent with Config.Members), resolved in the
// very transaction that grants a slot, so it follows members joining and
// leaving and never admits more than the share of the members of that
// moment.
//
// # Keys
//
// Keys take the canonical form etcdbudget uses: "+"-joined parts sorted
// and de-duplicated ("b+a" is "a+b").
//
// # Schema
//
// The tables are created on first use (Migrate, idempotent; a schema newer
// than this package knows is refused). An application that manages its
// schema itself (microcluster's schema extensions) appends SchemaUpdates
// and sets Config.SkipMigrate.
package sqlbudget
