package etcdbudget

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// keeper keeps a lease alive with one keep-alive request at a time, each
// bounded by Config.Attempt and sent twice at once (hedge: one through the
// detour around a hung member when there is one) until the lease's TTL
// has passed unanswered.
// clientv3's own KeepAlive shares one stream per client, which stays on a
// member that hangs until gRPC's keep-alive drops the connection, longer
// than a short TTL: every lease on it would expire although a quorum
// answers. keeper also knows, by the local monotonic clock, until when
// etcd cannot have expired the lease: the send time of the last answered
// keep-alive plus the TTL (the leader renews the lease after receiving
// the request, and a new leader only extends leases).
type keeper struct {
	b   *Budget
	id  clientv3.LeaseID
	ttl time.Duration

	mu       sync.Mutex
	deadline time.Time        // the lease is alive at least until then
	failing  bool             // the last keep-alive went unanswered
	extra    clientv3.LeaseID // the lock-delay guard's lease, renewed along
	err      error            // why the lease is gone

	gone   chan struct{} // closed once the lease is gone or presumed expired
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// grant grants a lease of the budget's TTL for a waiter of key and
// starts keeping it alive.
func (b *Budget) grant(ctx context.Context, out *outage, key string) (*keeper, error) {
	var id clientv3.LeaseID
	var sent time.Time
	err := b.call(ctx, out, "granting a lease to wait for "+key, func(actx context.Context) error {
		sent = time.Now()
		r, err := b.leases(actx).Grant(actx, int64(b.cfg.TTL/time.Second))
		if err == nil {
			id = r.ID
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	k := &keeper{b: b, id: id, ttl: b.cfg.TTL, deadline: sent.Add(b.cfg.TTL), gone: make(chan struct{}), done: make(chan struct{})}
	k.ctx, k.cancel = context.WithCancel(context.Background())
	go k.run()
	return k, nil
}

// run renews the lease every TTL/3 until stopped or the lease is gone.
func (k *keeper) run() {
	defer close(k.done)
	every := k.ttl / 3
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-k.ctx.Done():
			return
		case <-t.C:
		}
		if err := k.renew(k.ctx); err != nil {
			if k.ctx.Err() == nil {
				k.fail(err)
			}
			return
		}
		t.Reset(every)
	}
}

// renew sends keep-alives until one is answered, the lease is gone, or
// its deadline passed.
func (k *keeper) renew(ctx context.Context) error {
	backoff := 20 * time.Millisecond
	for {
		k.mu.Lock()
		deadline, extra := k.deadline, k.extra
		k.mu.Unlock()
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("lease %x: no keep-alive answered for its %s TTL (etcd unreachable, or this process was paused)", int64(k.id), k.ttl)
		}
		sent := time.Now()
		actx, cancel := context.WithTimeout(ctx, min(k.b.cfg.Attempt, left))
		err := k.b.keepAliveOnce(actx, k.id)
		if err == nil && extra != 0 {
			// The guard's lease lives TTL+LockDelay: a missed renewal
			// is retried next round, and its loss only shortens the
			// lock-delay the guard would impose.
			_ = k.b.keepAliveOnce(actx, extra)
		}
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err == nil {
			k.renewed(sent)
			return nil
		}
		if isLeaseGone(err) {
			return fmt.Errorf("lease %x expired or was revoked: %w", int64(k.id), errLeaseGone)
		}
		k.mu.Lock()
		k.failing = true
		k.mu.Unlock()
		if sleep(ctx, min(backoff, time.Until(deadline))) != nil {
			return ctx.Err()
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func (k *keeper) renewed(sent time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if d := sent.Add(k.ttl); d.After(k.deadline) {
		k.deadline = d
	}
	k.failing = false
}

func (k *keeper) fail(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.err == nil {
		k.err = err
		close(k.gone)
	}
}

// Err says why the lease is gone, or nil.
func (k *keeper) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// alive reports whether the lease is alive by the local clock, and until
// when.
func (k *keeper) alive() (time.Time, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.deadline, k.err == nil && time.Now().Before(k.deadline)
}

func (k *keeper) healthy() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err == nil && !k.failing && time.Now().Before(k.deadline)
}

func (k *keeper) setExtra(id clientv3.LeaseID) {
	k.mu.Lock()
	k.extra = id
	k.mu.Unlock()
}

// keepAliveOnce renews lease id with two requests at once (hedge): one
// member that hangs can no longer eat the whole attempt (a keep-alive
// that misses its few attempts within the TTL loses the slot).
func (b *Budget) keepAliveOnce(ctx context.Context, id clientv3.LeaseID) error {
	b.requests.Add(1)
	b.keepalive.Add(2)
	return b.hedge(ctx, func(hctx context.Context) error {
		_, err := b.leases(hctx).KeepAliveOnce(hctx, id)
		return err
	})
}

// stop ends the keep-alives and waits for the keeper (its requests end
// with its context at once).
func (k *keeper) stop() {
	k.cancel()
	<-k.done
}

// revoke revokes ids (the lock-delay guard's lease, then the slot's),
// all at once, each bounded by ctx and sent as two requests at once (as
// keep-alives are: a hung member cannot eat the bound). A lease etcd no
// longer knows is revoked already. Revoking the guard and the slot
// together lets the next waiter see the guard deleted at once or a few
// milliseconds after the slot.
func (b *Budget) revoke(ctx context.Context, what string, ids ...clientv3.LeaseID) error {
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		if id == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := &outage{bound: b.cfg.Unreachable}
			err := b.call(ctx, out, fmt.Sprintf("revoking lease %x of %s", int64(id), what), func(actx context.Context) error {
				return b.hedge(actx, b.revokeRequest(id))
			})
			if err != nil && !errors.Is(err, errLeaseGone) {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// revokeOnce revokes lease id in one attempt bounded by ctx, sent twice at
// once (hedge), for a lease that would expire within its TTL anyway.
func (b *Budget) revokeOnce(ctx context.Context, id clientv3.LeaseID) error {
	b.requests.Add(1)
	return b.hedge(ctx, b.revokeRequest(id))
}

// revokeRequest is the request revoking lease id, for hedge.
func (b *Budget) revokeRequest(id clientv3.LeaseID) func(context.Context) error {
	return func(hctx context.Context) error {
		_, err := b.leases(hctx).Revoke(hctx, id)
		return err
	}
}

// hedge runs the idempotent request f twice at once and returns the
// first success, or an error once both failed; the other request ends
// with ctx at once. One goes through the client's balancer, the other
// through the detour around a member that hung when there is one
// (detour.go), else through the balancer too, which usually sends the
// two to two members. f sends its request through b.leases (or b.kv) of
// the context it is given.
func (b *Budget) hedge(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	direct := ctx
	if c, _ := ctx.Value(viaKey{}).(*endpointConn); c == nil {
		direct, _ = b.routed(ctx)
	}
	balanced := context.WithValue(ctx, viaKey{}, (*endpointConn)(nil))
	errs := make(chan error, 2)
	b.requests.Add(1) // call counts one
	for _, hctx := range []context.Context{direct, balanced} {
		go func() { errs <- f(hctx) }()
	}
	var err error
	for i := range 2 {
		if err = <-errs; err == nil || isLeaseGone(err) {
			cancel()
			if i == 0 {
				<-errs
			}
			return err
		}
	}
	return err
}
