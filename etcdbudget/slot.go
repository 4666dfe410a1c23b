package etcdbudget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/budget"
)

// slot is a held slot: an entry among the first Max of its key, bound to
// its own lease, and its lock-delay guard.
type slot struct {
	b     *Budget
	k     *keeper
	key   string
	entry string
	rev   int64            // the entry's create revision
	guard clientv3.LeaseID // the lock-delay guard's lease (0: none)

	gkey    string   // the guard's key
	markers []string // its markers under legacy keys (on the entry's lease)
	// progress is Acquire's: Fence reports its waits (pause, window)
	// through it.
	progress func(budget.Wait)

	wmu  sync.Mutex // serialises the guard's writes
	rec  guard      // the guard's value as last written
	grev int64      // the revision of that write

	lost      chan struct{}
	once      sync.Once
	releasing atomic.Bool
	mu        sync.Mutex
	err       error
	relMu     sync.Mutex
	released  bool
	stopOnce  sync.Once
	ctx       context.Context // ends when the slot is released
	cancel    context.CancelFunc
	watching  sync.WaitGroup
}

var (
	_ budget.Abandoner = (*slot)(nil)
	_ budget.Fencer    = (*slot)(nil)
	_ budget.Readier   = (*slot)(nil)
)

func newSlot(w *waiter, gid clientv3.LeaseID, rev int64, rec guard, grev int64, progress func(budget.Wait)) *slot {
	s := &slot{b: w.b, k: w.k, key: w.key, entry: w.entry, rev: w.rev, guard: gid, gkey: w.b.guards(w.key) + w.name,
		markers: w.markers, rec: rec, grev: grev, progress: progress, lost: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.watching.Add(1)
	go s.watch(rev)
	return s
}

// watch reports the slot lost when its lease is gone or its entry is
// deleted. The entry's watch starts after the read that found the slot
// held; when the watch fails (compaction, a member without leader, a
// closed channel) or stays silent for Recheck, the entry is read again:
// a failed watch is never taken for a deletion, nor a deletion missed.
//
// Every request it makes ends with the slot's release and with its lease:
// a holder cut off while the entry is read again (its client closed, a
// partition during a recheck) learns that the slot is lost when the
// keeper gives the lease up (TTL), not when the read gives up
// (Config.Unreachable).
func (s *slot) watch(rev int64) {
	defer s.watching.Done()
	b := s.b
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	go func() {
		select {
		case <-s.k.gone:
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := b.cfg.Client.Watch(wctx, s.entry, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
		deleted, ended := s.watchOnce(wch)
		cancel()
		if ended {
			return
		}
		if deleted {
			s.setLost(fmt.Errorf("%w: entry %s of %s was deleted (by someone else, or its lease expired)", budget.ErrSlotLost, s.entry, s.key))
			return
		}
		// Read the entry again.
		for {
			var exists bool
			err := b.call(ctx, &outage{bound: b.cfg.Unreachable}, "checking the slot "+s.entry, func(actx context.Context) error {
				resp, err := b.kv(actx).Get(actx, s.entry, clientv3.WithKeysOnly())
				if err == nil {
					exists = len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == s.rev
					rev = resp.Header.Revision
				}
				return err
			})
			if ctx.Err() != nil || s.k.Err() != nil {
				s.lostLease() // released: nothing
				return
			}
			if err == nil && !exists {
				s.setLost(fmt.Errorf("%w: entry %s of %s is gone (deleted by someone else, or its lease expired)", budget.ErrSlotLost, s.entry, s.key))
				return
			}
			if err == nil {
				break
			}
			// Unreachable for long: the keeper tells when the lease is
			// presumed expired; keep trying meanwhile.
			if sleep(ctx, time.Second) != nil {
				s.lostLease()
				return
			}
		}
	}
}

// watchOnce follows wch until the entry is deleted (deleted), the slot
// is released or its lease gone (ended), or the watch fails or is silent
// for Recheck (neither: read again).
func (s *slot) watchOnce(wch clientv3.WatchChan) (deleted, ended bool) {
	t := time.NewTimer(s.b.cfg.Recheck)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return false, true
		case <-s.k.gone:
			s.lostLease()
			return false, true
		case <-t.C:
			return false, false
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || wr.Canceled {
				return false, false
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return true, false
				}
			}
		}
	}
}

func (s *slot) lostLease() {
	if err := s.k.Err(); err != nil {
		s.setLost(fmt.Errorf("%w: %s of %s: %w; another machine may hold the slot now", budget.ErrSlotLost, s.entry, s.key, err))
	}
}

func (s *slot) setLost(err error) {
	if s.releasing.Load() {
		return
	}
	s.once.Do(func() {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		s.b.lost.Add(1)
		s.b.cfg.Logger.Warn("slot lost", "key", s.key, "error", err)
		close(s.lost)
	})
}

// Key is the slot's key.
func (s *slot) Key() string { return s.key }

// Holder is this participant's identity.
func (s *slot) Holder() string { return s.b.cfg.Holder }

// Lost is closed when the slot's lease expired or its entry was deleted.
func (s *slot) Lost() <-chan struct{} { return s.lost }

// Err says why the slot was lost, or nil.
func (s *slot) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// fenceMargin is what Fence keeps back of the time the slot's lease is
// known to live, for the clocks' rates (etcd's leader counts the TTL on its
// own clock): a tenth of the TTL.
func (b *Budget) fenceMargin() time.Duration { return b.cfg.TTL / 10 }

// gate is a control of the holder's own (a maintenance window), checked
// by Fence right before and right after its confirmation.
type gate interface {
	// open reports whether acting is allowed now and, when it is, for how
	// long (0: no end).
	open() (bool, time.Duration)
	// wait waits until acting may be allowed, ctx ends (its cause) or
	// lost is closed; it reports the wait through progress.
	wait(ctx context.Context, lost <-chan struct{}, progress func(budget.Wait)) error
}

// Fence confirms, right before a request that disrupts a service, that
// the slot is still held and that the holder may act now, and records in
// etcd that it is about to act (see budget.Fencer):
//
//   - it renews the slot's lease and its lock-delay guard's (etcd's
//     leader answers; a lease it no longer knows means the slot is lost);
//   - in one linearizable transaction it checks that the slot's entry
//     still exists with its create revision and lease and that no pause
//     record of the key (nor of its parts, nor of their snaps: see Pause)
//     exists, and, in the same transaction, records the act in the slot's
//     lock-delay guard (how many acts, and when), which a successor reads
//     if this holder vanishes;
//   - it checks that the lease cannot have expired yet by the local clock
//     (the send time of the last answered keep-alive plus TTL).
//
// It returns how long the confirmation stands, counted from the call:
// until the lease's local deadline less a tenth of the TTL (and, for a
// Controlled budget with a window, no later than the window closes).
// While the key is paused (or, for a Controlled budget, outside its
// window) Fence waits, holding the slot and reporting the wait through the
// progress function given to Acquire, until acting is allowed, the slot is
// lost (an error wrapping budget.ErrSlotLost) or ctx ends (an error
// wrapping budget.ErrPaused). Each attempt is bounded by ctx and by
// the time the lease is known to live: a holder that cannot confirm before
// its lease might expire gets an error wrapping
// budget.ErrUnavailable and must not act; a slot not held gives an
// error wrapping budget.ErrSlotLost (and Lost is closed).
//
// A holder frozen after Fence returned and before its request is written
// (SIGSTOP, a VM paused) can still act late: see the package
// documentation, "The fence-to-act bound".
func (s *slot) Fence(ctx context.Context) (budget.Validity, error) { return s.fence(ctx, nil) }

func (s *slot) fence(ctx context.Context, g gate) (budget.Validity, error) {
	start := time.Now()
	for {
		if err := s.Err(); err != nil {
			return budget.Validity{}, err
		}
		if s.releasing.Load() {
			return budget.Validity{}, fmt.Errorf("%w: %s of %s was released", budget.ErrSlotLost, s.entry, s.key)
		}
		if g != nil {
			if ok, _ := g.open(); !ok {
				if err := g.wait(ctx, s.lost, s.progress); err != nil {
					return budget.Validity{}, s.heldBackErr(ctx, "outside its maintenance window", err)
				}
				continue
			}
		}
		deadline, ok := s.k.alive()
		if !ok {
			err := fmt.Errorf("%w: %s of %s: lease %x may have expired by this machine's clock (no keep-alive answered for its %s TTL)",
				budget.ErrSlotLost, s.entry, s.key, int64(s.k.id), s.b.cfg.TTL)
			s.setLost(err)
			return budget.Validity{}, s.Err()
		}
		paused, err := s.confirm(ctx, deadline)
		if err != nil {
			return budget.Validity{}, err
		}
		if paused {
			if err := s.b.awaitResume(ctx, s.key, s.lost, s.progress); err != nil {
				return budget.Validity{}, s.heldBackErr(ctx, "paused", err)
			}
			continue
		}
		until, ok := s.k.alive()
		if !ok {
			return budget.Validity{}, fmt.Errorf("%w: fencing %s of %s: confirmed too late, its lease may have expired meanwhile", budget.ErrUnavailable, s.entry, s.key)
		}
		valid := until.Sub(start) - s.b.fenceMargin()
		if g != nil {
			ok, left := g.open()
			if !ok {
				continue // the window closed meanwhile: wait for it (the act recorded only makes a successor wait)
			}
			if left > 0 {
				valid = min(valid, time.Since(start)+left)
			}
		}
		if valid <= time.Since(start) {
			return budget.Validity{}, fmt.Errorf("%w: fencing %s of %s: confirmed with no time left before its lease might expire", budget.ErrUnavailable, s.entry, s.key)
		}
		return budget.ValidFor(valid), nil
	}
}

// heldBackErr is Fence's error when a wait for a pause or a window ended
// with err: the slot lost, or ctx ended (a *HaltedError when a halt held
// it back).
func (s *slot) heldBackErr(ctx context.Context, why string, err error) error {
	if lerr := s.Err(); lerr != nil {
		return lerr
	}
	var he *HaltedError
	if errors.As(err, &he) {
		return he // wraps budget.ErrPaused, budget.ErrHalted and the cause; names the halt and the resume
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %s of %s held back (%s) until the operation's bounds ended: %w", budget.ErrPaused, s.entry, s.key, why, context.Cause(ctx))
	}
	return err
}

// confirm renews the lease and, in one transaction, checks the slot is
// held and not paused and records the act. paused: the slot is held but a
// pause record exists (nothing recorded).
func (s *slot) confirm(ctx context.Context, deadline time.Time) (paused bool, err error) {
	fctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	out := &outage{bound: time.Until(deadline)}
	sent := time.Now()
	err = s.b.call(fctx, out, "fencing "+s.entry, func(actx context.Context) error {
		sent = time.Now()
		if err := s.b.keepAliveOnce(actx, s.k.id); err != nil || s.guard == 0 {
			return err
		}
		// The guard's lease too, so that a successor cannot enter
		// before this renewal's TTL plus the lock-delay: the bound a
		// holder frozen after this fence is judged by.
		return s.b.keepAliveOnce(actx, s.guard)
	})
	var held bool
	if err == nil {
		s.k.renewed(sent)
		s.wmu.Lock()
		rec := s.rec
		rec.Acts++
		rec.Acted = time.Now().UTC()
		val, _ := json.Marshal(rec)
		scopes := budget.PauseScopes(s.key)
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(s.entry), "=", s.rev),
			clientv3.Compare(clientv3.LeaseValue(s.entry), "=", s.k.id),
		}
		for _, sc := range scopes {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(s.b.pauseKey(sc)), "=", 0))
		}
		var then []clientv3.Op
		if s.guard != 0 {
			then = append(then, clientv3.OpPut(s.gkey, string(val), clientv3.WithLease(s.guard)))
		}
		// Not keys-only: etcd 3.7 answers a keys-only range from its index,
		// without the lease (server/storage/mvcc kvstore_txn.go,
		// FastKeysOnly).
		els := []clientv3.Op{clientv3.OpGet(s.entry)}
		for _, sc := range scopes {
			els = append(els, clientv3.OpGet(s.b.pauseKey(sc), clientv3.WithKeysOnly()))
		}
		err = s.b.call(fctx, out, "fencing "+s.entry, func(actx context.Context) error {
			resp, err := s.b.kv(actx).Txn(actx).If(cmps...).Then(then...).Else(els...).Commit()
			if err != nil {
				return err
			}
			if resp.Succeeded {
				held = true
				s.rec, s.grev = rec, resp.Header.Revision
				return nil
			}
			kvs := resp.Responses[0].GetResponseRange().Kvs
			held = len(kvs) == 1 && kvs[0].CreateRevision == s.rev && kvs[0].Lease == int64(s.k.id)
			if held {
				for _, r := range resp.Responses[1:] {
					paused = paused || len(r.GetResponseRange().Kvs) > 0
				}
			}
			return nil
		})
		s.wmu.Unlock()
	}
	switch {
	case errors.Is(err, errLeaseGone) || (err == nil && !held):
		s.setLost(fmt.Errorf("%w: fencing %s of %s: the slot is no longer held (lease expired or entry deleted): %v", budget.ErrSlotLost, s.entry, s.key, err))
		if lerr := s.Err(); lerr != nil {
			return false, lerr
		}
		return false, fmt.Errorf("%w: %s of %s", budget.ErrSlotLost, s.entry, s.key)
	case err != nil && ctx.Err() != nil:
		return false, fmt.Errorf("%w: fencing %s of %s: %w", budget.ErrUnavailable, s.entry, s.key, context.Cause(ctx))
	case errors.Is(err, budget.ErrRefused):
		return false, err
	case err != nil:
		return false, fmt.Errorf("%w: fencing %s of %s: could not confirm the slot before its lease might expire: %w", budget.ErrUnavailable, s.entry, s.key, err)
	}
	return paused, nil
}

// MarkReady records, in the slot's lock-delay guard, that the services
// this holder disrupted are ready again after its last recorded act (see
// budget.Readier). A successor that finds this holder vanished
// then takes the slot without waiting out the lock-delay. It writes only
// while the guard is as this holder last wrote it (a successor that
// already judged it deleted it); without a lock-delay there is nothing to
// record.
func (s *slot) MarkReady(ctx context.Context) error {
	if s.guard == 0 {
		return nil
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	rec := s.rec
	rec.Ready, rec.ReadyAt = rec.Acts, time.Now().UTC()
	val, _ := json.Marshal(rec)
	var ok bool
	var rev int64
	err := s.b.call(ctx, &outage{bound: s.b.cfg.Unreachable}, "recording "+s.entry+" ready", func(actx context.Context) error {
		resp, err := s.b.kv(actx).Txn(actx).If(clientv3.Compare(clientv3.ModRevision(s.gkey), "=", s.grev)).
			Then(clientv3.OpPut(s.gkey, string(val), clientv3.WithLease(s.guard))).
			Else(clientv3.OpGet(s.gkey)).Commit() // with its lease: not keys-only
		if err != nil {
			return err
		}
		ok, rev = resp.Succeeded, resp.Header.Revision
		if !ok {
			// A retry after a lost answer finds its own write.
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 1 && kvs[0].ModRevision > s.grev && kvs[0].Lease == int64(s.guard) {
				ok, rev = true, kvs[0].ModRevision
			}
		}
		return nil
	})
	switch {
	case err != nil:
		return fmt.Errorf("etcdbudget: recording that %s of %s is ready: %w", s.entry, s.key, err)
	case !ok:
		return fmt.Errorf("etcdbudget: recording that %s of %s is ready: its lock-delay guard %s is gone or changed (the slot was lost and a successor judged it)", s.entry, s.key, s.gkey)
	}
	s.rec, s.grev = rec, rev
	return nil
}

// Release gives the slot back at once: in one transaction it deletes the
// slot's entry and its lock-delay guard (the next waiter's watch fires;
// no lock-delay applies to an orderly release), then stops the slot's
// keep-alives and watch and revokes its leases (one attempt each: a lease
// left behind holds no key and expires by itself). The transaction is
// bounded by ctx and Config.Unreachable.
//
// Release may be called again after it failed, and each call tries again:
// a failed call stops the keep-alives (the entry then expires within TTL)
// but leaves the guard to the next call, which deletes it, so a release
// that failed only because etcd was unreachable for a moment still hands
// the slot over without the lock-delay. Once a call succeeded, later
// calls return nil and send nothing.
func (s *slot) Release(ctx context.Context) error {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if s.released {
		return nil
	}
	s.releasing.Store(true)
	del := []clientv3.Op{clientv3.OpDelete(s.entry)}
	if s.guard != 0 {
		del = append(del, clientv3.OpDelete(s.gkey))
	}
	for _, m := range s.markers {
		del = append(del, clientv3.OpDelete(m))
	}
	// Both keys are this holder's own (its lease and a sequence name
	// them): deleting them is safe to repeat.
	err := s.b.call(ctx, &outage{bound: s.b.cfg.Unreachable}, "releasing "+s.entry, func(actx context.Context) error {
		_, err := s.b.kv(actx).Txn(actx).Then(del...).Commit()
		return err
	})
	s.stop()
	if err != nil && s.guard == 0 {
		return fmt.Errorf("etcdbudget: releasing %s (its entry expires within %s anyway, or when Release is called again and succeeds): %w",
			s.entry, s.b.cfg.TTL, err)
	}
	if err != nil {
		return fmt.Errorf("etcdbudget: releasing %s (its entry expires within %s anyway; call Release again to delete its lock-delay guard %s, else it holds the slot back up to %s): %w",
			s.entry, s.b.cfg.TTL, s.gkey, s.b.cfg.TTL+max(s.b.cfg.LockDelay, 0), err)
	}
	s.released = true
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.b.cfg.Attempt)
	defer cancel()
	_ = s.b.revoke(actx, s.entry, s.guard, s.k.id)
	return nil
}

// Abandon lets go of the slot as a holder that crashed would
// (budget.Abandoner): its keep-alives and watch stop, and nothing is
// deleted or revoked. Its entry expires with its lease, within TTL, and
// its lock-delay guard, on a lease of TTL+LockDelay, holds the slot back
// LockDelay longer unless the slot was marked ready since its last fence
// (the guard then says so). A later Release does nothing.
func (s *slot) Abandon() {
	s.relMu.Lock()
	defer s.relMu.Unlock()
	if s.released {
		return
	}
	s.releasing.Store(true)
	s.stop()
	s.released = true
}

// abandon gives back a slot that Acquire took but does not return (its
// context ended while the key was paused): the holder never acted, so its
// guard holds nothing back. It stops the keep-alives and the watch and
// revokes the leases in one attempt (bounded by Config.Attempt) if etcd
// answered the last keep-alive, else leaves them to expire within TTL:
// unlike Release it never waits for an unreachable etcd, so Acquire
// returns promptly.
func (s *slot) abandon() {
	healthy := s.k.healthy()
	s.releasing.Store(true)
	s.stop()
	if !healthy {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.b.cfg.Attempt)
	defer cancel()
	_ = s.b.revoke(ctx, s.entry, s.guard, s.k.id)
}

// stop ends the slot's keep-alives and its watch, once.
func (s *slot) stop() {
	s.stopOnce.Do(func() {
		s.cancel()
		s.k.stop()
		s.watching.Wait()
	})
}

// unbudgeted is a slot granted without etcd (no cluster yet, or fail
// open). It is never lost.
type unbudgeted struct {
	key, holder string
	never       chan struct{}
}

func newUnbudgeted(key, holder string) *unbudgeted {
	return &unbudgeted{key: key, holder: holder, never: make(chan struct{})}
}

func (u *unbudgeted) Key() string                   { return u.key }
func (u *unbudgeted) Holder() string                { return u.holder }
func (u *unbudgeted) Lost() <-chan struct{}         { return u.never }
func (u *unbudgeted) Err() error                    { return nil }
func (u *unbudgeted) Release(context.Context) error { return nil }

// Fence confirms for ever: nothing can take an unbudgeted slot away.
func (u *unbudgeted) Fence(context.Context) (budget.Validity, error) {
	return budget.Unbounded(), nil
}
