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
// # Drivers
//
// Any database/sql driver of SQLite's dialect will do. Two are tested:
// mattn/go-sqlite3 (v1.14.53, cgo; the module's own tests, SQLite in
// process: open it with "?_txlock=immediate&_busy_timeout=5000&_journal_mode=WAL")
// and canonical/go-dqlite (Debian's v1.11.5 on libdqlite 1.11.1, three
// nodes: the test-only module internal/dqlitetest, the contract and the
// fault runs). modernc.org/sqlite's result codes are read too (a Code
// method), from a stand-in error only: no test runs that driver.
//
// # Design
//
// One row per Acquire in snapsvc_budget_slots (schema: SchemaVersion),
// ordered by an AUTOINCREMENT id, so waiters are served first come, first
// served: a waiter takes a slot once fewer than Max live holders and
// awake waiters that arrived before it remain, and no slot is held back
// by a lock-delay. Every write that renews a row bumps its renewal
// counter; a holder renews every TTL/3. A row that others have watched go
// unrenewed for its lease (a holder's TTL) no longer counts, so a crashed
// or cut-off machine's slot, or place, frees itself. Every decision is
// one transaction: the check and the grant, the fence and the record of
// the act, the release.
//
// # Waiting at fleet scale
//
// A waiter's poll is one transaction that reads a small fixed set of rows
// through an index, never the whole queue: its own row, the key's holders
// (Max, and vanished holders under a lock-delay), the first few waiters
// (Max+8), and, through the index, how many waiters are ahead of it (its
// place, from the rows actually there) and whether it is among the last
// 16. Waiters poll less often the further back they are: the first Max+1
// every Config.Poll (default TTL/8, at most 250 ms), each one behind them
// Config.PollSpacing (default 2×Poll) later than the one ahead, so the
// whole queue costs O(log n) transactions a second, plus the last 16
// (sentinels), which poll every 2×Poll (sqlbudget/README.md has the
// figures). A waiter whose interval is at most 8 Polls is awake: it writes
// its row at every poll, and the waiters behind it wait for it; one
// further back writes when the write it promised comes due. A slot
// released by another machine is taken within about one Poll; a Release
// wakes the first waiters of the same process at once.
//
// Waiters that die or leave never stall the queue for long. A waiter that
// leaves (its context ended) deletes its row; one that dies leaves it. An
// awake waiter that others have seen silent for its interval plus two
// Polls, and a waiter that is not awake (the queue reached it sooner than
// it polls), do not hold a free slot back: the first waiter behind them to
// poll takes it, and they keep their rows, and their places for the next
// slot, until their leases pass. So when the whole front of the queue
// leaves at once, a sentinel takes the free slot within 2 Polls.
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
// closes) ClockSkew before anyone can judge its row expired: before anyone
// else can be granted the slot, as etcdbudget's holders do.
//
// # Whose clock decides expiry
//
// The observer's monotonic clock; never a wall clock, and never the
// database's. Each row carries a renewal counter (beat) and its lease. A
// participant (a waiter, a Status reader) remembers, on its own monotonic
// clock, when it first saw each row's current counter, from the end of
// the transaction that read it; only once it has watched a row keep one
// counter for the row's lease does it treat the row as expired, and it
// removes the row in a transaction that reads the same counter (a renewal
// that raced it wins). A step of the database's clock (an NTP step after
// a VM pause, a node booted with a wrong RTC) or a dqlite leader change
// between nodes whose clocks disagree frees no slot and holds none back;
// etcd's lessor, timing leases on its leader's monotonic clock, is immune
// for the same reason. Consequences:
//
//   - A holder knows, on its own monotonic clock, the send time of its
//     last answered renewal; no observer can have seen that renewal before
//     it was sent, so none can judge the row expired before that plus TTL.
//     A holder that cannot renew reports Lost itself ClockSkew before then
//     (ClockSkew covers what separates two machines' monotonic clocks:
//     their rates, and scheduling).
//   - Fence returns how long its confirmation stands: TTL less
//     ClockSkew, from the start of the transaction that confirmed (the
//     row was renewed in it), counted from the call. A caller that has not
//     acted within that fences again.
//   - An observer that has seen nothing (a new process, one restarted)
//     watches a row for its lease before it may expire it: a vanished
//     holder's slot comes free up to one TTL later for a process that
//     starts after the holder vanished than for one that watched it go.
//   - The database's clock is still recorded (Status: Since, Renewed,
//     Expires, Acted, ...), for humans; Event times and durations are the
//     machine's.
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
// those records (counts of fences and of readiness, not times): one that
// never fenced, or marked ready after its last fence, never acted on a
// service that is down: its slot is free at once. One that fenced and did
// not mark ready may have sent a restart that snapd carries on without
// it: its slot stays unusable for its Config.LockDelay (DefaultLockDelay,
// 1 minute) after the expiry, counted by each waiter on its own monotonic
// clock from when it judged the holder expired. A waiter
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
// Release deletes the row (a holder past its own deadline only if it
// holds nothing back); the next waiter takes the slot at its next
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
// # Halt and history
//
// A slot is a budget.Recorder: snapsvc records each hold's act (what it
// restarted, snapd's change id and times, the readiness outcome, how long
// it waited and held) with Record, in one transaction that appends it to
// the key's history (snapsvc_budget_history), trims that history
// (Config.HistoryLimit, HistoryAge) and, when the act failed and the
// key's failed acts since its last ready act or resume reach
// Config.HaltAfter (default budget.DefaultHaltAfter: the first failure),
// halts the key: a pause row carrying the budget.Halt (the machine, the
// services, the change, the reason), and a "halted" record; a key an
// operator paused is halted all the same (its pause becomes the halt,
// under a new token, so a Resume that read the pause lifts nothing). An
// act is recorded once per budget.Act.ID, however alike two acts' fields
// (an empty ID is one act per Record call): the tokens of the key's
// newest 1024 acts are kept apart from the history, so retention never
// makes a retried Record count again. A halted key is a paused key:
// every Fence waits, holding its slot, and every Acquire that takes a
// slot keeps it without returning, until an operator resumes the key
// (Resume); when their context ends first their errors
// (*HaltedError) wrap budget.ErrPaused and budget.ErrHalted, name the
// halt and say how to lift it. The halt is in the database: it survives
// the process that wrote it, and two failures recorded at once by two
// holders halt the key once (the count and the halt are read and written
// in one transaction). Each record carries the key's count of failures,
// read from the newest one, which retention never removes: the bounds
// keep the history small and decide nothing. Pause and Resume are
// recorded too; a Resume lifts a halt as it lifts a pause (the very one
// it read), and the failures are counted afresh from it. The Budget is a
// budget.Historian (History: a key's records, oldest first), Status shows
// the halt (KeyStatus.Halt), Keys lists every key with rows, a pause, a
// halt or a history; EventRecorded and EventHalted, and Metrics.Records
// and Metrics.Halts, count what this Budget's slots recorded.
//
// # Keys
//
// Keys take the canonical form etcdbudget uses: "+"-joined parts sorted
// and de-duplicated ("b+a" is "a+b").
//
// # Schema
//
// The tables are created on first use (Migrate, idempotent). Every
// transaction reads the schema's version (one read of a primary key) and
// refuses a schema newer than this package knows (*SchemaError, wrapping
// budget.ErrRefused), so a member left behind by an upgrade stops at its
// next transaction, with Config.SkipMigrate too. An application that
// manages its schema itself (microcluster's schema extensions) appends
// SchemaUpdates and sets Config.SkipMigrate. Version 4 (expiry by the
// observers' clocks) moved the rows to a table of a new name and dropped
// the old one: members on an earlier sqlbudget, which read the version
// only until their first transaction, find their table gone and refuse
// (ErrBudgetRefused) rather than keep a budget of their own beside it.
// Upgrade a fleet by upgrading every member: those not yet upgraded
// refuse to restart (retrying cannot help until they are), none restarts
// beside the others unbudgeted. Version 5 (the history and the halt) is
// refused the same way by members on version 4: they read the version at
// every transaction, find it newer than they know and refuse
// (*SchemaError): during a rolling upgrade they fail closed, and none
// restarts ignoring a halt.
package sqlbudget
