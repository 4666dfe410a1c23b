package etcdbudget

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/snapsvc"
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

	lost      chan struct{}
	once      sync.Once
	rel       sync.Once
	releasing atomic.Bool
	mu        sync.Mutex
	err       error
	relErr    error
	ctx       context.Context // ends when the slot is released
	cancel    context.CancelFunc
	watching  sync.WaitGroup
}

var _ snapsvc.BudgetFencer = (*slot)(nil)

func newSlot(w *waiter, guard clientv3.LeaseID, rev int64) *slot {
	s := &slot{b: w.b, k: w.k, key: w.key, entry: w.entry, rev: w.rev, guard: guard, lost: make(chan struct{})}
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
func (s *slot) watch(rev int64) {
	defer s.watching.Done()
	b := s.b
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(s.ctx))
		wch := b.cfg.Client.Watch(wctx, s.entry, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
		deleted, ended := s.watchOnce(wch)
		cancel()
		if ended {
			return
		}
		if deleted {
			s.setLost(fmt.Errorf("%w: entry %s of %s was deleted (by someone else, or its lease expired)", snapsvc.ErrSlotLost, s.entry, s.key))
			return
		}
		// Read the entry again.
		for {
			var exists bool
			err := b.call(s.ctx, &outage{bound: b.cfg.Unreachable}, "checking the slot "+s.entry, func(actx context.Context) error {
				resp, err := b.cfg.Client.Get(actx, s.entry, clientv3.WithKeysOnly())
				if err == nil {
					exists = len(resp.Kvs) == 1 && resp.Kvs[0].CreateRevision == s.rev
					rev = resp.Header.Revision
				}
				return err
			})
			if s.ctx.Err() != nil || s.k.Err() != nil {
				s.lostLease()
				return
			}
			if err == nil && !exists {
				s.setLost(fmt.Errorf("%w: entry %s of %s is gone (deleted by someone else, or its lease expired)", snapsvc.ErrSlotLost, s.entry, s.key))
				return
			}
			if err == nil {
				break
			}
			// Unreachable for long: the keeper tells when the lease is
			// presumed expired; keep trying meanwhile.
			if sleep(s.ctx, time.Second) != nil {
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
		s.setLost(fmt.Errorf("%w: %s of %s: %w; another machine may hold the slot now", snapsvc.ErrSlotLost, s.entry, s.key, err))
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

// Fence confirms the slot is still held, right before a step that
// disrupts a service: it renews the slot's lease (etcd's leader answers;
// a lease it no longer knows means the slot is lost), then checks with a
// linearizable transaction that the slot's entry still exists with its
// create revision and lease, and finally that the lease cannot have
// expired yet by the local clock (the send time of the last answered
// keep-alive plus TTL). The whole check is bounded by ctx and by the
// time the lease is known to live: a holder that cannot confirm before
// its lease might expire gets an error wrapping
// snapsvc.ErrBudgetUnavailable and must not act; a slot not held gives
// an error wrapping snapsvc.ErrSlotLost (and Lost is closed). The
// confirmation stands until the lease's local deadline.
func (s *slot) Fence(ctx context.Context) (time.Duration, error) {
	if err := s.Err(); err != nil {
		return 0, err
	}
	if s.releasing.Load() {
		return 0, fmt.Errorf("%w: %s of %s was released", snapsvc.ErrSlotLost, s.entry, s.key)
	}
	deadline, ok := s.k.alive()
	if !ok {
		err := fmt.Errorf("%w: %s of %s: lease %x may have expired by this machine's clock (no keep-alive answered for its %s TTL)",
			snapsvc.ErrSlotLost, s.entry, s.key, int64(s.k.id), s.b.cfg.TTL)
		s.setLost(err)
		return 0, s.Err()
	}
	fctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	out := &outage{bound: time.Until(deadline)}
	sent := time.Now()
	err := s.b.call(fctx, out, "fencing "+s.entry, func(actx context.Context) error {
		sent = time.Now()
		return s.b.keepAliveOnce(actx, s.k.id)
	})
	var held bool
	if err == nil {
		s.k.renewed(sent)
		err = s.b.call(fctx, out, "fencing "+s.entry, func(actx context.Context) error {
			resp, err := s.b.cfg.Client.Txn(actx).If(
				clientv3.Compare(clientv3.CreateRevision(s.entry), "=", s.rev),
				clientv3.Compare(clientv3.LeaseValue(s.entry), "=", s.k.id),
			).Commit()
			if err == nil {
				held = resp.Succeeded
			}
			return err
		})
	}
	switch {
	case errors.Is(err, errLeaseGone) || (err == nil && !held):
		s.setLost(fmt.Errorf("%w: fencing %s of %s: the slot is no longer held (lease expired or entry deleted): %v", snapsvc.ErrSlotLost, s.entry, s.key, err))
		if lerr := s.Err(); lerr != nil {
			return 0, lerr
		}
		return 0, fmt.Errorf("%w: %s of %s", snapsvc.ErrSlotLost, s.entry, s.key)
	case err != nil && ctx.Err() != nil:
		return 0, fmt.Errorf("%w: fencing %s of %s: %w", snapsvc.ErrBudgetUnavailable, s.entry, s.key, context.Cause(ctx))
	case errors.Is(err, snapsvc.ErrBudgetRefused):
		return 0, err
	case err != nil:
		return 0, fmt.Errorf("%w: fencing %s of %s: could not confirm the slot before its lease might expire: %w", snapsvc.ErrBudgetUnavailable, s.entry, s.key, err)
	}
	until, ok := s.k.alive()
	if !ok {
		return 0, fmt.Errorf("%w: fencing %s of %s: confirmed too late, its lease may have expired meanwhile", snapsvc.ErrBudgetUnavailable, s.entry, s.key)
	}
	return time.Until(until), nil
}

// Release gives the slot back at once: it revokes the lock-delay guard's
// lease and the slot's (which deletes the entry, and the next waiter's
// watch fires) together, each bounded by ctx and by TTL (past it the
// lease has expired anyway), before it stops the slot's keep-alives and
// watch. It never waits on anything ctx does not bound.
func (s *slot) Release(ctx context.Context) error {
	s.rel.Do(func() {
		s.releasing.Store(true)
		rctx, cancel := context.WithTimeout(ctx, s.b.cfg.TTL)
		defer cancel()
		// A holder that releases hands over without lock-delay; if the
		// guard's revoke fails, the guard expires after TTL+LockDelay.
		err := s.b.revoke(rctx, s.entry, s.guard, s.k.id)
		s.cancel()
		s.k.stop()
		s.watching.Wait()
		if err != nil {
			s.relErr = fmt.Errorf("etcdbudget: releasing %s (its lease expires within %s anyway): %w", s.entry, s.b.cfg.TTL, err)
		}
	})
	return s.relErr
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
func (u *unbudgeted) Fence(context.Context) (time.Duration, error) {
	return time.Duration(1<<63 - 1), nil
}
