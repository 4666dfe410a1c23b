// Package etcdbudget is a budget.Budget on etcd: it keeps a
// cluster's machines from restarting the same service on more than Max of
// them at once, and from starting the next restart before the previous
// machine's service is ready again (snapsvc.WithRestartBudget holds the
// slot until the caller's readiness probe passes).
//
//	cli, _ := clientv3.New(etcdbudget.ClientConfig(endpoints))
//	b, _ := etcdbudget.New(etcdbudget.Config{Client: cli, Max: 1, TTL: 10 * time.Second})
//	c, _ := snapsvc.New(snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
//		Ready: func(string) probe.Probe { return &probe.HTTP{URL: "https://127.0.0.1:6443/readyz", CAFile: ca} },
//		Settle: 5 * time.Second,
//	}))
//	_, err := c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
//
// It is its own Go module so that users of snapsvc never pull in etcd.
//
// # Design
//
// A semaphore of Max slots per key over ordered entries, as
// go.etcd.io/etcd/client/v3/concurrency's Mutex orders its waiters:
// Acquire grants a lease of TTL and puts an entry PREFIX/KEY/LEASE-SEQ
// bound to it, whose value names the holder ("HOSTNAME pid PID" or
// Config.Holder), its Max and when it started waiting. Entries are
// ordered by their create revision, which etcd assigns from one totally
// ordered log: an entry holds a slot once fewer than Max entries created
// before it remain (and no slot is held back by a lock-delay, below), so
// waiters are served first come, first served. Every machine must use the
// same Max for a key: a waiter that finds a holder with another Max is
// refused.
//
// # Keys
//
// A key is one semaphore, in one canonical form computed by
// budget.CanonicalKey, which the core applies before it sorts the keys an
// operation takes and this package applies to every key it is given: the
// "+"-joined parts sorted and de-duplicated ("b+a" is "a+b"), so two
// spellings are one slot and two machines take the same keys in the same
// order. snapsvc budgets each service of an operation under its own key
// ("k8s.kube-apiserver", through BudgetOptions.Key) and a whole-snap name
// ("k8s") as every one of its services' keys (read from snapd's apps
// listing), so a whole-snap restart on one machine and an apiserver
// restart on another exclude each other, while restarts of two different
// services do not. A combined key ("a+b", from BudgetOptions.Key or
// snapsvc-rollout --key) is a semaphore of its own: it does not exclude
// "a". A pause of a key holds back that key, the combined keys it is a
// part of, and, for a snap's name, every key of its services.
//
// # Mixed versions
//
// A fleet upgraded one machine at a time runs two releases at once, and
// v0.1.1 spelled keys otherwise: a whole-snap restart ("k8s") took the
// key "k8s", where this release takes each service's key, and
// snapsvc-rollout joined several names with "+" in the order given (or
// took its --key). Machines on either release must still count each
// other. An earlier etcdbudget counts every key under its key's directory;
// so each entry of this release also puts a marker, in the same
// transaction and on the same lease, under each of its key's legacy keys
// (Config.LegacyKeys; by default LegacySnapKeys: the snap of each service
// the key names), named after a '~' that sorts after every entry's name.
// The earlier release counts the marker ahead of its own entry, as any
// holder; this release counts, ahead of its entry, the entries of earlier
// releases under those keys (an entry of this release says its version),
// never markers nor its own entries there. Entry and markers share one
// create revision, so every pair of machines is ordered the same way in
// every queue, and the younger of any two that disrupt a service counts
// the older: with Max N, N+1 machines restarting a service at once need
// two v0.1.1 machines that never counted each other (its whole-snap and
// per-service restarts did not), as before the upgrade. Two restarts of
// different services of one snap on this release do not count each
// other's markers. v0.1.1 waits out no lock-delay, as before. snapsvc-rollout's --legacy-key names a
// v0.1.1 machine's own key (verbatim, never sorted). Once no machine runs
// an earlier release, NoLegacyKeys (snapsvc-rollout
// --legacy-snap-keys=false) spares the markers and the reads.
//
// # Waiting
//
// Hand-over costs O(1) per waiter. A waiter reads, in one linearizable
// transaction, the entries ahead of it, the holders and the lock-delay
// guards, then watches only the Max entries just ahead of it (no other
// deletion can bring the count ahead below Max) and its own entry, from
// the revision of that read, so nothing between the read and the watch is
// missed; when one of them is deleted it reads again and re-checks before
// acting, as etcd's Mutex waits on its predecessor. A release wakes only
// the next waiter. So a waiter keeps at most Max+1 watches; the first in
// line also watches each vanished holder's guard (one more per vanished
// holder) and is the only one to probe HolderReady. An idle waiter reads
// its queue again once per Config.Recheck (a minute, ±20%): 1,000 idle
// waiters cost about 17 reads a second, and their leases' keep-alives,
// two requests per waiter per TTL/3, about 600 requests a second with the
// 10s TTL (BenchmarkWaiters). etcd itself still filters and sorts the
// key's entries in memory for each read.
//
// Each acquisition has its own lease, so a waiter that gives up (its
// context ended) removes exactly its own entry, and when even that cannot
// reach etcd at once, its lease, no longer kept alive, expires within TTL.
//
// # Requests, hung members, and what is retried
//
// Every request is sent in attempts bounded by Config.Attempt: a member
// that hangs (a frozen machine, a black-holed network that never answers
// nor resets) costs one attempt. The client's round-robin balancer would
// keep giving the hung member its share of requests, retries included,
// until gRPC's keep-alive drops its connection; so after an attempt that
// got no answer every endpoint is asked for its status directly, and the
// budgets of the client send their requests for a few seconds through a
// connection to the first member that says it has a leader
// (Stats.Detours counts these). Failures
// are retried with jittered backoff while they look like unreachability
// (timeouts, no leader, connection refused, too many requests) until
// Config.Unreachable has passed since the first failure; then the call
// fails with an *UnreachableError, which wraps budget.ErrUnavailable
// (retryable) and the last cause. Answers that no retry can change (a
// request too large, failed authentication or permission, a database out
// of space or corrupt, a waiter's entry deleted by an operator, a Max
// mismatch, a bad key, a client the application closed) fail at once with
// an error wrapping budget.ErrRefused and the cause: FailOpen never
// grants on them. Build the client with NewClient from ClientConfig, whose
// gRPC keep-alive drops a connection to a hung member within 13 s, moving
// its watches too.
//
// # TLS failures are refusals
//
// etcd's client sends every request with gRPC's WaitForReady(true)
// (go.etcd.io/etcd/client/v3 options.go): a request on a connection whose
// TLS handshake fails waits until its context ends and returns a bare
// "context deadline exceeded" (client.go, ContextError). So when an
// attempt has run 250ms with no connection ready, or when a request has
// failed for Config.Unreachable, the budget asks every endpoint directly:
// a connection of its own made with the client's credentials
// (clientv3.Client.Dial) and a status request sent with
// WaitForReady(false), which gRPC fails at once with the connection's
// last error (google.golang.org/grpc picker_wrapper.go: a fail-fast pick
// on a failing connection ends with codes.Unavailable). A server whose
// certificate this client does not trust, or that rejects the client's
// certificate (missing, expired, not yet valid, of another CA), is then a
// refusal naming each endpoint and the cause, at once when every endpoint
// fails its handshake; it is never unreachability, so FailOpen never
// grants a slot on it. In TLS 1.3 the server judges the client's
// certificate after the client's handshake completed, and its alert can
// be lost when the connection is reset; for clients built by NewClient
// the budget knows the TLS configuration and makes a handshake of its own
// to read the alert, otherwise a server that closes the connection right
// after the handshake is judged to have rejected the certificate. Errors
// of an unreachable etcd (UnreachableError, or a context that ended while
// etcd failed) name each endpoint and what it gave.
//
// The budget keeps its leases alive itself: every TTL/3 it sends two
// keep-alive requests at once (the balancer sends them to two members),
// retrying until one is answered or the TTL has passed unanswered.
// clientv3's KeepAlive shares one stream per client, which stays on a
// hung member until gRPC drops the connection, longer than a short TTL: a
// quorum would answer, yet every lease on that stream would expire. The
// budget also knows, by the local monotonic clock, until when etcd cannot
// have expired a lease: the send time of the last answered keep-alive plus
// TTL (the leader renews after receiving the request; a new leader only
// extends leases).
//
// # Fencing, crashes and lost slots
//
// A machine that crashes (kill -9) or is cut off stops sending
// keep-alives. The leader expires the lease TTL after the last keep-alive
// it granted (checking every 500 ms) and deletes the entry through raft;
// only that deletion lets the next waiter count fewer than Max entries
// ahead. A holder that is cut off learns it on its side too: once TTL
// passed without an answered keep-alive (also while the slot's watch is
// reading its entry again, and after its etcd client was closed), or its
// entry is seen deleted, the slot's Lost channel closes; snapsvc then
// reports budget.ErrSlotLost for the operation under way (not
// retryable).
//
// Lost can only tell what the process has seen: a holder paused past its
// lease (SIGSTOP, a frozen VM) runs on, for a moment, as if it still held
// the slot. So a held slot implements budget.Fencer, and snapsvc
// fences right before each request that disrupts a service. Fence renews
// the slot's lease and its guard's, then, in one linearizable
// transaction, checks that the entry still exists with its create
// revision and lease and that no pause record holds the key, and records
// the act in the slot's lock-delay guard (how many acts, and when); it
// checks the lease cannot have expired by the local clock, and returns
// how long the confirmation stands, counted from the call: until the
// lease's local deadline less a tenth of the TTL. A Controlled budget's
// Fence also checks its maintenance window by its clock right before and
// after that transaction, and ends the confirmation when the window
// closes. While the key is paused or the window closed, Fence waits
// holding the slot, reporting the wait through Acquire's progress, until
// acting is allowed (budget.ErrPaused once its context ends).
// Fence's error wraps budget.ErrSlotLost when the slot is not held,
// budget.ErrUnavailable when it cannot confirm before the lease
// might expire. Once the operation's services are ready again, MarkReady
// (budget.Readier) records in the guard that they are ready after
// the last act.
//
// # The fence-to-act bound
//
// A fence is a check, not a lock on snapd: a holder frozen (SIGSTOP, a VM
// paused) after the core's last check of the fence's validity and before
// its request reaches snapd still sends it when it runs again. What
// protects the next holder then is the act record: the frozen holder's
// guard says it may have acted, so when its lease expires its successor
// waits out the lock-delay, and a HolderReady probe can end that wait
// only on evidence of a restart after the act, which the frozen holder
// has not made. The successor cannot enter before the fence's lease
// renewal plus TTL plus LockDelay. So a holder frozen there for more than
// LockDelay plus a tenth of the TTL (61s with the defaults; up to TTL +
// LockDelay, 70s, when it was checked right after its fence), less the
// time its service needs to restart and be ready, can restart while
// another machine holds the slot. Nothing shorter can. A longer LockDelay
// widens the bound.
//
// # Lock-delay
//
// The slot belongs to the rollout process's lease, not to the restart: a
// holder killed after sending its restart leaves snapd carrying it on, and
// the service is down, then not ready, for a while after the lease
// expired. So, as Chubby's lock-delay, a slot whose holder vanished
// (lease expired, not released) stays unusable for Config.LockDelay
// (DefaultLockDelay, 1 minute: seconds to stop and start a kube-apiserver
// or a datastore member, tens of seconds to be ready, and a margin) after
// the expiry. Each holder puts a guard PREFIX/KEY#lock-delay/ENTRY on a
// second lease of TTL+LockDelay, kept alive with the entry's; Release
// revokes both leases together, so an orderly release hands over at once
// (the next waiter sees the guard gone with the entry, or watches it for
// the milliseconds until it is), while
// a vanished holder's guard outlives its entry by LockDelay and counts as
// a held slot until it expires, judged by what the holder recorded in it:
// a holder that never recorded an act (it never passed a fence, so it
// sent nothing) or that recorded its services ready after its last act
// needs no lock-delay, and the first waiter in line deletes its guard at
// once; a holder that recorded an act and no readiness after it is waited
// out. With Config.HolderReady (a probe of the vanished holder's service,
// as Cluster API's control plane checks each member before a step) the
// first waiter in line asks, every 500ms, with the holder's act record
// (beside its wait: each call's context ends after 5s, a probe that hangs
// is not called again until it returns, and neither the wait, the lease's
// keep-alives nor the caller's cancellation wait for it),
// and the delay ends as soon as the probe proves a restart after the act
// and readiness; a guard the vanished holder still updates (its
// MarkReady, under way) is read again at once. Stats counts these delayed
// takeovers and the probes.
//
// Release deletes the entry and the guard in one transaction. A release
// that fails (etcd unreachable for a moment) stops the keep-alives (the
// entry expires within TTL) and leaves the guard to the next Release,
// which really sends again: snapsvc retries a failed release in the
// background, so the next machine does not wait out the lock-delay.
//
// # Compaction
//
// Watches survive compaction (kube-apiserver compacts every 5 minutes): a
// holder's watch on its entry starts after the read that found the slot
// held, and a watch that fails (compacted, no leader, closed) or stays
// silent for Config.Recheck is followed by a read of the entry, never
// taken for a deletion nor for "closing". A waiter does the same with the
// queue.
//
// # History and halts
//
// A held slot implements budget.Recorder: snapsvc records each budgeted
// act (its holder, machine, services, snapd's change id with its spawn and
// ready times, the outcome, the time waited and held) when its outcome is
// final, and the Budget implements budget.Historian (History, and
// snapsvc-rollout history KEY). Records live under PREFIX KEY#history/,
// one key each with no lease, next to a head PREFIX KEY#history-head
// holding the last sequence number, the failed acts counted since the
// key's last ready act or resume, and the IDs of the key's last acts. Each
// write of the history (Record, Pause, Resume) is one transaction
// conditional on the head's revision: concurrent writers of one key are
// serialised, and a Record of an act already recorded (its budget.Act.ID,
// found in the head or in the records written since the call began: a
// retry after a lost answer) appends nothing and counts nothing again,
// whatever retention removed meanwhile. Retention (Config.HistoryLimit
// records per key, Config.HistoryAge) is applied by each append, in the
// same transaction; the age is judged by the records' own times, the
// writers' clocks, and decides nothing else.
//
// When a failed act brings the key's failures to Config.HaltAfter (the
// first failure by default), the same transaction halts the key: it writes
// the key's pause record, which carries the budget.Halt (machine,
// services, change, reason) and has no lease, so it survives the process
// that wrote it, and a budget.RecordHalted record. A key an operator
// paused is halted all the same: its pause record, its By and Reason kept,
// gains the Halt and a new revision, so a resume that read the pause lifts
// nothing. A halted key is a paused key: the next holder keeps its slot
// and its place, its Fence waits until an operator resumes the key
// (snapsvc-rollout resume KEY), and once its context ends it fails with a
// *HaltedError, which wraps both budget.ErrPaused and budget.ErrHalted and
// names the halt and the command that lifts it. Resume lifts a halt as it
// lifts a pause (only the one it read: a resume retried after a lost
// answer never lifts a later halt) and records who resumed; failures are
// counted again from there.
//
// # When etcd is unreachable
//
// By default the budget fails closed: Acquire keeps trying for
// Config.Unreachable (default 15s) while etcd cannot be reached or has no
// quorum, then returns an *UnreachableError, which snapsvc reports as
// retryable, and nothing is restarted. A waiter already queued is told
// within max(TTL, Unreachable) of the outage plus an attempt. Its entry
// then expires with its lease (no revoke is attempted against an etcd
// that cannot answer), and a cancelled Acquire returns at once.
// Config.FailOpen opts into granting an unbudgeted slot instead, on
// genuine unreachability only (never on a refusal), logged as a warning
// and counted in Stats: availability of the restart over the budget.
//
// # First bootstrap
//
// Without snapsvc.WithRestartBudget no budget is consulted at all, which
// is what a bootstrap that creates the cluster uses. A daemon that builds
// its client once, before knowing whether a cluster exists, sets
// Config.ClusterExists: Acquire asks it first, and when it reports false
// (for example, no cluster configuration on disk yet) grants an
// unbudgeted slot at once, without contacting etcd. The snapsvc-rollout command
// has --bootstrap for the same.
//
// # Kubernetes Leases
//
// The same interface maps onto coordination.k8s.io/v1 Leases for
// controllers that already hold a Kubernetes client: one Lease per slot
// (KEY-0 .. KEY-(Max-1)), taken by a create or an update conditioned on
// resourceVersion when spec.holderIdentity is empty or
// renewTime + leaseDurationSeconds has passed; the holder renews
// renewTime every leaseDuration/3 and gives the slot back by clearing
// holderIdentity; Lost fires when a renewal fails past the lease duration
// or finds another holder. What the API server does not give is what
// etcd does: a Lease never expires by itself (expiry is the readers'
// judgement of renewTime against their own clocks, so skewed clocks can
// overlap holders), and there is no ordered queue, so waiters poll and
// race rather than being served in order. Those are why etcd came first:
// server-side TTLs make "the next holder cannot start before the lease
// expired" a property of one clock, and create revisions give FIFO for
// free. And the services this budget protects most, kube-apiserver
// itself, are the ones that take the Kubernetes API down while they
// restart, so a budget that needs the API server to coordinate their
// restarts would fail exactly when it is needed; etcd (or the datastore
// the distribution already runs) is one layer below.
package etcdbudget
