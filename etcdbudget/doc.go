// Package etcdbudget is a snapsvc.RestartBudget on etcd: it keeps a
// cluster's machines from restarting the same service on more than Max of
// them at once, and from starting the next restart before the previous
// machine's service is ready again (snapsvc.WithRestartBudget holds the
// slot until the caller's readiness probe passes).
//
//	cli, _ := clientv3.New(clientv3.Config{Endpoints: endpoints})
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
// go.etcd.io/etcd/client/v3/concurrency's Mutex and Election order theirs:
// Acquire grants a lease of TTL, kept alive by a concurrency.Session, and
// puts an entry PREFIX/KEY/LEASE-SEQ bound to it, whose value names the
// holder ("HOSTNAME pid PID" or Config.Holder), its Max and when it
// started waiting. Entries are ordered by their create revision, which
// etcd assigns from one totally ordered log: an entry holds a slot once
// fewer than Max entries created before it remain, so waiters are served
// first come, first served, and an entry never loses its place to a later
// one. A waiter reads the queue (a linearizable range: it needs a quorum)
// and then watches the key's entries for deletions from the revision of
// that read, so no deletion between the read and the watch is missed.
// Release revokes the lease, which deletes the entry in the same raft
// entry, and the next waiter's watch fires.
//
// Each acquisition has its own lease, so a waiter that gives up (its
// context ended) removes exactly its own entry, and when even that cannot
// reach etcd, its lease, no longer kept alive, expires within TTL.
//
// # Crashes, partitions and lost sessions
//
// A machine that crashes (kill -9) or is cut off stops sending
// keep-alives. The leader expires the lease TTL after the last keep-alive
// it granted (checking every 500 ms) and deletes the entry through raft;
// only that deletion lets the next waiter count fewer than Max entries
// ahead. So the next holder cannot start before the lease expired: there
// is no other path by which an entry disappears (nothing deletes another
// machine's entry), and a new leader extends, never shortens, leases it
// takes over. A holder that is cut off learns it on its side too: its
// session's keep-alive loop gives up once TTL passed without an answer,
// and the slot's Lost channel closes; snapsvc then reports
// snapsvc.ErrSlotLost for the operation under way (the restart itself may
// have completed, but another machine may have restarted at the same
// time), and it is not retryable. Entries deleted by anyone else (etcdctl
// del) are reported the same way.
//
// # When etcd is unreachable
//
// By default the budget fails closed: Acquire keeps trying for
// Config.Unreachable (default 15s) while etcd cannot be reached or has no
// quorum, then returns an error wrapping snapsvc.ErrBudgetUnavailable,
// which snapsvc reports as retryable, and nothing is restarted. A waiter
// already queued is told within max(TTL, Unreachable) of the outage, plus
// the time the etcd client takes to notice (its keep-alive deadline is
// checked every 500 ms, then gRPC calls time out): about 2 s more, longer
// on a heavily loaded machine. Its lease's keep-alive
// gives up once TTL passed unanswered, or its watch is
// cancelled for lack of a leader and its reads fail for Unreachable,
// whichever comes first. Its entry then expires with its lease (no revoke
// is attempted against an etcd that cannot answer). Config.FailOpen opts
// into granting an unbudgeted slot instead, logged as a warning:
// availability of the restart over the budget.
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
