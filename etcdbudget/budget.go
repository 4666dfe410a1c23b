package etcdbudget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// Defaults of Config.
const (
	DefaultPrefix      = "/snapsvc/restart-budget/"
	DefaultTTL         = 10 * time.Second
	DefaultUnreachable = 15 * time.Second
)

// Config configures a Budget.
type Config struct {
	// Client reaches the etcd cluster. The Budget does not close it.
	Client *clientv3.Client
	// Prefix is where the budget's keys live (default DefaultPrefix).
	Prefix string
	// Max is how many holders a key may have at once (default 1). Every
	// participant should use the same Max; when they differ, a waiter
	// obeys the smallest Max among itself and the entries ahead of it.
	Max int
	// TTL is the lease of each slot and waiter, in whole seconds (default
	// DefaultTTL; at least 2s, etcd's minimum with its default timing): a
	// holder that crashes or is cut off from etcd loses its slot at most
	// TTL after its last answered keep-alive.
	TTL time.Duration
	// Holder identifies this participant in the entries others read
	// (default "HOSTNAME pid PID").
	Holder string
	// Unreachable bounds how long Acquire keeps trying while etcd cannot
	// be reached or has no quorum (default DefaultUnreachable). Past it
	// Acquire fails closed with an error wrapping
	// snapsvc.ErrBudgetUnavailable, unless FailOpen.
	Unreachable time.Duration
	// FailOpen makes Acquire grant an unbudgeted slot, instead of failing,
	// when etcd stayed unreachable for Unreachable. Logged at warning level.
	FailOpen bool
	// ClusterExists, when set, is asked first by every Acquire; when it
	// reports false (no cluster has been bootstrapped yet, so there is
	// nobody to coordinate with and no etcd to ask) Acquire grants an
	// unbudgeted slot at once. Without it etcd is always consulted and an
	// unreachable etcd is an outage.
	ClusterExists func(ctx context.Context) bool
	// Logger receives what the budget does (default: discard).
	Logger *slog.Logger
}

// Budget is a snapsvc.RestartBudget on etcd. It is safe for concurrent
// use.
type Budget struct {
	cfg Config
	seq atomic.Uint64
}

// entry is the value of a waiter's or holder's key.
type entry struct {
	Holder string    `json:"holder"`
	Max    int       `json:"max"`
	Since  time.Time `json:"since"`
}

// New checks cfg and returns a Budget. It sends no request.
func New(cfg Config) (*Budget, error) {
	if cfg.Client == nil {
		return nil, errors.New("etcdbudget: Config.Client is nil")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.Max == 0 {
		cfg.Max = 1
	}
	if cfg.Max < 0 {
		return nil, fmt.Errorf("etcdbudget: Max %d is negative", cfg.Max)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < 2*time.Second || cfg.TTL%time.Second != 0 {
		return nil, fmt.Errorf("etcdbudget: TTL %s must be whole seconds, at least 2s", cfg.TTL)
	}
	if cfg.Unreachable == 0 {
		cfg.Unreachable = DefaultUnreachable
	}
	if cfg.Holder == "" {
		cfg.Holder = DefaultHolder()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Budget{cfg: cfg}, nil
}

// DefaultHolder returns "HOSTNAME pid PID".
func DefaultHolder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host"
	}
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// Max returns the number of slots per key.
func (b *Budget) Max() int { return b.cfg.Max }

// dir is where key's entries live.
func (b *Budget) dir(key string) string { return b.cfg.Prefix + key + "/" }

// Acquire waits for a slot of key. It enqueues an entry under the key,
// bound to a lease of its own, and holds a slot once fewer than Max
// entries created before it remain; waiters are served in the order they
// enqueued (etcd's create revision). While it waits it watches the key's
// entries and reports who holds and how many are ahead. When ctx ends or
// Acquire fails, its entry is removed (its lease revoked; if even that
// cannot reach etcd, the lease expires within TTL).
func (b *Budget) Acquire(ctx context.Context, key string, progress func(snapsvc.BudgetWait)) (snapsvc.BudgetSlot, error) {
	if key == "" || strings.Contains(key, "/") {
		return nil, fmt.Errorf("etcdbudget: invalid key %q (empty or containing '/')", key)
	}
	if b.cfg.ClusterExists != nil && !b.cfg.ClusterExists(ctx) {
		b.cfg.Logger.Info("no cluster exists yet: proceeding without a slot", "key", key)
		return newUnbudgeted(key, b.cfg.Holder+" (no cluster yet, unbudgeted)"), nil
	}
	sess, err := b.session(ctx)
	if err != nil {
		return b.unreachable(ctx, key, err)
	}
	s, err := b.wait(ctx, sess, key, progress)
	if err != nil {
		if ctx.Err() == nil && errors.Is(err, snapsvc.ErrBudgetUnavailable) {
			// A revoke would only wait for the same outage: stop the
			// keep-alives and let the lease, and the entry, expire.
			sess.Orphan()
			return b.unreachable(ctx, key, err)
		}
		b.revoke(ctx, sess)
		return nil, err
	}
	// Operator controls (control.go): a paused key keeps the slot just
	// granted, and the queue behind it, until it is resumed.
	if err := b.awaitResume(ctx, key, s, progress); err != nil {
		_ = s.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	return s, nil
}

// session grants a lease of TTL and keeps it alive. The grant is bounded
// by Unreachable (concurrency.NewSession would wait on the client's own,
// unbounded context).
func (b *Budget) session(ctx context.Context) (*concurrency.Session, error) {
	gctx, cancel := context.WithTimeout(ctx, b.cfg.Unreachable)
	defer cancel()
	lease, err := b.cfg.Client.Grant(gctx, int64(b.cfg.TTL/time.Second))
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("%w: granting a lease: %w", snapsvc.ErrBudgetUnavailable, err)
	}
	return concurrency.NewSession(b.cfg.Client, concurrency.WithLease(lease.ID), concurrency.WithTTL(int(b.cfg.TTL/time.Second)))
}

// revoke ends sess and deletes its keys, bounded in time even when ctx has
// ended; if etcd cannot be reached the lease expires by itself.
func (b *Budget) revoke(ctx context.Context, sess *concurrency.Session) error {
	sess.Orphan()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(b.cfg.Unreachable, b.cfg.TTL))
	defer cancel()
	_, err := b.cfg.Client.Revoke(rctx, sess.Lease())
	return err
}

// unreachable decides what an Acquire that cannot reach etcd returns.
func (b *Budget) unreachable(ctx context.Context, key string, cause error) (snapsvc.BudgetSlot, error) {
	if ctx.Err() != nil || !errors.Is(cause, snapsvc.ErrBudgetUnavailable) {
		return nil, cause
	}
	if b.cfg.FailOpen {
		b.cfg.Logger.Warn("etcd unreachable: proceeding without a slot (fail open)", "key", key, "error", cause)
		return newUnbudgeted(key, b.cfg.Holder+" (etcd unreachable, fail open: unbudgeted)"), nil
	}
	return nil, cause
}

// outage tracks the time etcd has been failing, for the Unreachable bound.
type outage struct {
	bound time.Duration
	since time.Time
}

// failed records a failure of a request sent at sent and says whether
// the bound has run out. The outage counts from the first failed
// request's start, so the bound holds across retries.
func (o *outage) failed(sent time.Time) bool {
	if o.since.IsZero() {
		o.since = sent
	}
	return time.Since(o.since) >= o.bound
}

func (o *outage) ok() { o.since = time.Time{} }

// remaining is how long requests may still take.
func (o *outage) remaining() time.Duration {
	if o.since.IsZero() {
		return o.bound
	}
	return max(o.bound-time.Since(o.since), 0)
}

// wait enqueues sess's entry for key and waits until it holds a slot.
func (b *Budget) wait(ctx context.Context, sess *concurrency.Session, key string, progress func(snapsvc.BudgetWait)) (*slot, error) {
	cli := b.cfg.Client
	dir := b.dir(key)
	myKey := fmt.Sprintf("%s%016x-%d", dir, int64(sess.Lease()), b.seq.Add(1))
	val, err := json.Marshal(entry{Holder: b.cfg.Holder, Max: b.cfg.Max, Since: time.Now().UTC()})
	if err != nil {
		return nil, err
	}
	// Requests end with the caller's context and with the session: a
	// waiter whose keep-alives go unanswered for TTL is told at once.
	caller := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(sess.Ctx(), cancel)()
	out := &outage{bound: b.cfg.Unreachable}
	unavailable := func(what string, err error) error {
		if caller.Err() != nil {
			return context.Cause(caller)
		}
		if sess.Ctx().Err() != nil {
			what, err = "waiting", errSessionDone
		}
		return fmt.Errorf("%w: %s for %s (etcd unreachable or without quorum): %w", snapsvc.ErrBudgetUnavailable, what, b.cfg.Unreachable, err)
	}

	// Enqueue. A retry after a lost answer finds the entry it made.
	var myRev int64
	for {
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, out.remaining())
		resp, err := cli.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(myKey), "=", 0)).
			Then(clientv3.OpPut(myKey, string(val), clientv3.WithLease(sess.Lease()))).
			Else(clientv3.OpGet(myKey)).Commit()
		cancel()
		if err == nil {
			myRev = resp.Header.Revision
			if !resp.Succeeded {
				myRev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
			}
			out.ok()
			break
		}
		if ctx.Err() != nil || out.failed(sent) {
			return nil, unavailable("enqueuing", err)
		}
	}

	var last snapsvc.BudgetWait
	reported := false
	for {
		// Who is ahead (a linearizable read: it needs a quorum).
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, out.remaining())
		resp, err := cli.Get(rctx, dir, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		cancel()
		if err != nil {
			if ctx.Err() != nil || out.failed(sent) {
				return nil, unavailable("reading the queue", err)
			}
			continue
		}
		out.ok()
		idx := slices.IndexFunc(resp.Kvs, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == myKey })
		if idx < 0 {
			return nil, fmt.Errorf("%w: this waiter's entry vanished (its lease expired: etcd was unreachable for longer than the %s TTL)", snapsvc.ErrBudgetUnavailable, b.cfg.TTL)
		}
		limit := b.cfg.Max
		holders := make([]string, 0, limit)
		for i, kv := range resp.Kvs[:idx+1] {
			var e entry
			if json.Unmarshal(kv.Value, &e) == nil && e.Max > 0 {
				limit = min(limit, e.Max)
			}
			if i < idx {
				holders = append(holders, e.Holder)
			}
		}
		if idx < limit {
			b.cfg.Logger.Debug("slot acquired", "key", key, "entry", myKey, "revision", myRev)
			return newSlot(b, sess, key, myKey, myRev), nil
		}
		w := snapsvc.BudgetWait{Key: key, Holders: holders[:min(limit, len(holders))], Ahead: idx - limit, Max: limit}
		if progress != nil && (!reported || w.Ahead != last.Ahead || !slices.Equal(w.Holders, last.Holders)) {
			progress(w)
			last, reported = w, true
		}
		if err := b.watchDeletes(ctx, sess, dir, resp.Header.Revision+1); err != nil {
			if ctx.Err() != nil || errors.Is(err, errSessionDone) {
				return nil, unavailable("waiting", err)
			}
			// A watch may fail long after it started: the outage
			// counts from its failure.
			if out.failed(time.Now()) {
				return nil, unavailable("watching the queue", err)
			}
			// Do not spin on a watch that fails at once (no leader).
			select {
			case <-ctx.Done():
				return nil, unavailable("waiting", err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

var errSessionDone = errors.New("the waiter's lease keep-alive ended (no answer for its TTL)")

// watchDeletes returns once an entry of dir is deleted at or after rev,
// or when the watch fails (no leader, connection lost), sess ends or ctx
// ends.
func (b *Budget) watchDeletes(ctx context.Context, sess *concurrency.Session, dir string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := b.cfg.Client.Watch(wctx, dir, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithFilterPut())
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-sess.Done():
			return errSessionDone
		case wr, ok := <-wch:
			if !ok {
				return errors.New("watch closed")
			}
			if err := wr.Err(); err != nil {
				return err
			}
			if len(wr.Events) > 0 {
				return nil
			}
		}
	}
}

// slot is a held slot: an entry among the first Max of its key, bound to
// its own lease.
type slot struct {
	b     *Budget
	sess  *concurrency.Session
	key   string
	entry string

	lost     chan struct{}
	released chan struct{}
	once     sync.Once
	rel      sync.Once
	mu       sync.Mutex
	err      error
	relErr   error
	watching sync.WaitGroup
}

func newSlot(b *Budget, sess *concurrency.Session, key, entryKey string, rev int64) *slot {
	s := &slot{b: b, sess: sess, key: key, entry: entryKey, lost: make(chan struct{}), released: make(chan struct{})}
	s.watching.Add(1)
	go s.watch(rev)
	return s
}

// watch reports the slot lost when its lease's keep-alive ends or its
// entry is deleted by anyone else.
func (s *slot) watch(rev int64) {
	defer s.watching.Done()
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := s.b.cfg.Client.Watch(wctx, s.entry, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for {
		select {
		case <-s.released:
			return
		case <-s.sess.Done():
			s.setLost(fmt.Errorf("%w: lease %x of %s expired (etcd answered no keep-alive for its %s TTL), so another machine may hold the slot now",
				snapsvc.ErrSlotLost, int64(s.sess.Lease()), s.entry, s.b.cfg.TTL))
			return
		case wr, ok := <-wch:
			if !ok {
				wch = nil // client closing; the session ends too
				continue
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					s.setLost(fmt.Errorf("%w: entry %s was deleted by someone else", snapsvc.ErrSlotLost, s.entry))
					return
				}
			}
		}
	}
}

func (s *slot) setLost(err error) {
	select {
	case <-s.released:
		return
	default:
	}
	s.once.Do(func() {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
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

// Release revokes the slot's lease, which deletes its entry: the next
// waiter's watch sees the delete at once.
func (s *slot) Release(ctx context.Context) error {
	s.rel.Do(func() {
		close(s.released)
		s.watching.Wait()
		s.relErr = s.b.revoke(ctx, s.sess)
		if s.relErr != nil {
			s.relErr = fmt.Errorf("etcdbudget: releasing %s (the lease expires within %s anyway): %w", s.entry, s.b.cfg.TTL, s.relErr)
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

// Holders lists who holds or waits for key, oldest first (for status
// output). It is a linearizable read.
func (b *Budget) Holders(ctx context.Context, key string) (holding, waiting []string, err error) {
	resp, err := b.cfg.Client.Get(ctx, b.dir(key), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", snapsvc.ErrBudgetUnavailable, err)
	}
	limit := b.cfg.Max
	for i, kv := range resp.Kvs {
		var e entry
		if json.Unmarshal(kv.Value, &e) == nil && e.Max > 0 {
			limit = min(limit, e.Max)
		}
		if i < limit {
			holding = append(holding, e.Holder)
		} else {
			waiting = append(waiting, e.Holder)
		}
	}
	return holding, waiting, nil
}
