// Package etcdbudget is a snapsvc.RestartBudget on etcd: it keeps a
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
// waiters are served first come, first served. Keys are normalised (Key:
// names sorted and de-duplicated), and every machine must use the same Max
// for a key: a waiter that finds a holder with another Max is refused.
//
// Hand-over costs O(1) per waiter. A waiter reads, in one linearizable
// transaction, the entries ahead of it, the holders and the lock-delay
// guards, then watches only the Max entries just ahead of it (no other
// deletion can bring the count ahead below Max) and its own entry, from
// the revision of that read, so nothing between the read and the watch is
// missed; when one of them is deleted it reads again and re-checks before
// acting, as etcd's Mutex waits on its predecessor. A release wakes only
// the next waiter: one queue read and seven requests per hand-over with
// 1,000 waiters on a key (BenchmarkHandOver). etcd itself still filters
// and sorts the key's entries in memory for each read.
//
// Each acquisition has its own lease, so a waiter that gives up (its
// context ended) removes exactly its own entry, and when even that cannot
// reach etcd at once, its lease, no longer kept alive, expires within TTL.
//
// # Requests, hung members, and what is retried
//
// Every request is sent in attempts bounded by Config.Attempt: a member
// that hangs (a frozen machine, a black-holed network that never answers
// nor resets) costs one attempt, and the next goes to another member, as
// the client balances requests round-robin over its endpoints. Failures
// are retried with jittered backoff while they look like unreachability
// (timeouts, no leader, connection refused, too many requests) until
// Config.Unreachable has passed since the first failure; then the call
// fails with an *UnreachableError, which wraps snapsvc.ErrBudgetUnavailable
// (retryable) and the last cause. Answers that no retry can change (a
// request too large, failed authentication or permission, a database out
// of space, a waiter's entry deleted by an operator, a Max mismatch, a bad
// key) fail at once with an error wrapping snapsvc.ErrBudgetRefused and
// the cause. A TLS handshake failure is recognised when gRPC reports it;
// etcd's client waits for a ready connection, so a server with the wrong
// certificate usually shows as unreachability instead. Build the client
// from ClientConfig, whose gRPC keep-alive drops a connection to a hung
// member within 13 s, moving its watches too.
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
// passed without an answered keep-alive, or its entry is seen deleted,
// the slot's Lost channel closes; snapsvc then reports snapsvc.ErrSlotLost
// for the operation under way (not retryable).
//
// Lost can only tell what the process has seen: a holder paused past its
// lease (SIGSTOP, a frozen VM) runs on, for a moment, as if it still held
// the slot. So a held slot implements snapsvc.BudgetFencer: Fence renews
// the lease, checks with a linearizable transaction that the entry still
// exists with its create revision and lease, and that the lease cannot
// have expired by the local clock. snapsvc fences right before each step
// that disrupts a service; Fence's error wraps snapsvc.ErrSlotLost when
// the slot is not held, snapsvc.ErrBudgetUnavailable when it cannot
// confirm before the lease might expire.
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
// a held slot until it expires. With Config.HolderReady (a probe of the
// vanished holder's service, as Cluster API's control plane checks each
// member before a step) the delay ends as soon as the service is seen
// ready again. Stats counts these delayed takeovers.
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
