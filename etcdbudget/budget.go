package etcdbudget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/snapsvc/snapsvc/budget"
)

// Defaults of Config.
const (
	DefaultPrefix      = "/snapsvc/restart-budget/"
	DefaultTTL         = 10 * time.Second
	DefaultUnreachable = 15 * time.Second
	// DefaultLockDelay is how long a slot whose holder vanished (its
	// lease expired: killed, paused, cut off) stays unusable after the
	// expiry. The vanished holder may have sent its restart just before
	// it vanished, and snapd carries it out without it: the service may
	// be down, then not ready, for the restart plus its readiness. A
	// kube-apiserver or a datastore member of a snap-based Kubernetes
	// needs seconds to stop and start and up to tens of seconds to be
	// ready again; one minute covers that with a margin, and is what
	// Chubby uses as its lock-delay bound. Set Config.HolderReady to end
	// the delay as soon as the vanished holder is seen ready again.
	DefaultLockDelay = time.Minute
	// DefaultRecheck is Config.Recheck's default: an idle waiter reads
	// its queue about once a minute.
	DefaultRecheck = time.Minute
	// DefaultHistoryLimit is Config.HistoryLimit's default: history
	// records kept per key.
	DefaultHistoryLimit = budget.DefaultHistoryLimit
	// DefaultHistoryAge is Config.HistoryAge's default: 30 days.
	DefaultHistoryAge = budget.DefaultHistoryAge
)

// VanishedHolder is what a waiter knows of a holder whose lease expired
// without a release, from the records that holder left in its lock-delay
// guard (times are the holder's clock, UTC).
type VanishedHolder struct {
	// Key is the budget key.
	Key string
	// Holder identifies the holder ("node-1 pid 4242").
	Holder string
	// Granted is when it took the slot.
	Granted time.Time
	// Acts counts its fences that recorded an act (a request that
	// disrupts may have followed each).
	Acts int
	// Acted is when it recorded its last act.
	Acted time.Time
}

// Config configures a Budget.
type Config struct {
	// Client reaches the etcd cluster. The Budget does not close it.
	// Build it from ClientConfig, whose gRPC keep-alive drops a
	// connection to a member that hangs.
	Client *clientv3.Client
	// Prefix is where the budget's keys live (default DefaultPrefix).
	Prefix string
	// Max is how many holders a key may have at once (default 1). Every
	// participant must use the same Max for a key: a waiter that finds a
	// holder of its key with another Max fails with an error wrapping
	// budget.ErrRefused.
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
	// Acquire fails closed with an *UnreachableError (wrapping
	// budget.ErrUnavailable), unless FailOpen.
	Unreachable time.Duration
	// Attempt bounds each attempt of each etcd request (default TTL/5,
	// at least 500ms, at most 2s). A member that hangs costs one attempt;
	// the next ones go around it (see Stats.Detours).
	Attempt time.Duration
	// LockDelay is how long a slot taken over from a holder that
	// vanished, rather than released it, stays unusable after the
	// holder's lease expired (default DefaultLockDelay; negative: none).
	// An orderly Release hands the slot over at once.
	LockDelay time.Duration
	// HolderReady, when set, may end a vanished holder's lock-delay
	// early. It is consulted only for a holder that recorded an act (its
	// Fence) and no readiness after it (its MarkReady), only by the first
	// waiter in line, every 500ms, with what the holder recorded: return
	// true only on evidence that postdates h.Acted, that the holder's
	// services restarted after its act and are ready again (for example
	// the service's start time, as systemd reports it, after h.Acted, and
	// its readiness endpoint answering). A probe that only sees "ready"
	// cannot tell "ready again" from "not restarted yet": a holder frozen
	// between its fence and its request looks ready. A holder that never
	// recorded an act, or marked itself ready after its last one, needs
	// no lock-delay at all and is not probed. It runs beside the wait:
	// its context ends after 5s (or with the wait), and a call that does
	// not return delays neither the wait, the keep-alives nor the
	// caller's cancellation; it is not called again until it returns.
	HolderReady func(ctx context.Context, h VanishedHolder) bool
	// Recheck is how long a waiter or holder trusts a silent watch before
	// reading again (default DefaultRecheck, each wait drawn within ±20%
	// so that waiters do not read together). It bounds what a watch stuck
	// on a member that hangs can hide; with ClientConfig, gRPC's
	// keep-alive drops such a connection within 13s and the watch goes on
	// on another member from its revision, so this is a backstop.
	Recheck time.Duration
	// FailOpen makes Acquire grant an unbudgeted slot, instead of
	// failing, when etcd stayed unreachable for Unreachable; never when
	// etcd answered with a refusal. Each grant is logged at warning
	// level and counted in Stats.
	FailOpen bool
	// ClusterExists, when set, is asked first by every Acquire; when it
	// reports false (no cluster has been bootstrapped yet, so there is
	// nobody to coordinate with and no etcd to ask) Acquire grants an
	// unbudgeted slot at once. Without it etcd is always consulted and an
	// unreachable etcd is an outage.
	ClusterExists func(ctx context.Context) bool
	// LegacyKeys returns, for a key (canonical), the keys of earlier
	// etcdbudgets (v0.1.1, v0.2.0) whose holders disrupt the same
	// services, as those releases spelled them: a slot of key also counts
	// their holders and waiters queued before it, and they count it (see
	// the package documentation, Mixed versions). Default (nil):
	// LegacySnapKeys, v0.1.1's key of a whole-snap restart. Once no
	// machine runs an earlier release, NoLegacyKeys spares the markers and
	// the reads (machines of this release never count each other's
	// markers).
	LegacyKeys func(key string) []string
	// HaltAfter is how many failed acts of a key (budget.Act.Failed),
	// counted since its last budget.OutcomeReady act or its last resume,
	// halt it: the slot's Record that reaches it writes the key's pause
	// record with the budget.Halt, in the same transaction, and no holder
	// acts on the key until an operator resumes it (see Slot's Record and
	// the package documentation, History and halts). 0 means
	// budget.DefaultHaltAfter (the first failure halts); negative: never
	// halt, keep the history only.
	HaltAfter int
	// HistoryLimit is how many history records are kept per key (default
	// DefaultHistoryLimit); each append removes the oldest beyond it, in
	// the same transaction.
	HistoryLimit int
	// HistoryAge is how old a history record may grow before an append
	// removes it (default DefaultHistoryAge; negative: no age bound),
	// judged by the records' own Time (the writers' clocks). It is
	// housekeeping only: no safety decision (a halt, a failure count)
	// reads it.
	HistoryAge time.Duration
	// Logger receives what the budget does (default: discard).
	Logger *slog.Logger
}

// LegacySnapKeys is Config.LegacyKeys's default: for each "+"-part of key
// naming a service ("k8s.kubelet"), its snap ("k8s"), the key under which
// etcdbudget v0.1.1 (through snapsvc v0.1.1) budgeted a whole-snap
// restart.
func LegacySnapKeys(key string) []string {
	var out []string
	for _, p := range strings.Split(key, "+") {
		if snap, _, ok := strings.Cut(p, "."); ok && snap != "" && !slices.Contains(out, snap) {
			out = append(out, snap)
		}
	}
	return out
}

// NoLegacyKeys is a Config.LegacyKeys for a fleet where no machine runs an
// etcdbudget earlier than this one: no key of theirs is counted.
func NoLegacyKeys(string) []string { return nil }

// ClientConfig returns an etcd client configuration for endpoints with
// the defaults a budget needs on a real cluster: a 5s dial timeout, and
// gRPC keep-alive pings every 10s (gRPC's minimum) answered within 3s,
// so a connection to a member that hangs without closing it (a frozen
// machine, a black-holed network) is dropped and its requests and
// watches move to another member. It logs nothing. Add TLS and
// credentials as needed.
func ClientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second,
		Logger:               zap.NewNop(),
	}
}

// Budget is a budget.Budget on etcd. It is safe for concurrent
// use.
type Budget struct {
	cfg Config
	seq atomic.Uint64

	diag diagnosis

	requests  atomic.Uint64
	keepalive atomic.Uint64
	reads     atomic.Uint64
	watches   atomic.Uint64
	watching  atomic.Int64
	probes    atomic.Uint64
	failOpen  atomic.Uint64
	lost      atomic.Uint64
	delayed   atomic.Uint64
	refusals  atomic.Uint64
	acquired  atomic.Uint64
	unreached atomic.Uint64
	detoured  atomic.Uint64
}

// Stats counts what a Budget did since New.
type Stats struct {
	// Acquired counts slots taken from etcd.
	Acquired uint64
	// FailOpenGrants counts unbudgeted slots granted because etcd was
	// unreachable (Config.FailOpen).
	FailOpenGrants uint64
	// Unreachable counts Acquires that found etcd unreachable.
	Unreachable uint64
	// Refused counts Acquires that etcd refused (ErrBudgetRefused).
	Refused uint64
	// Lost counts slots lost while held.
	Lost uint64
	// DelayedTakeovers counts slots taken over from a vanished holder
	// after its lock-delay.
	DelayedTakeovers uint64
	// Requests counts etcd request attempts, keep-alives included.
	Requests uint64
	// KeepAlives counts keep-alive requests (two per renewal).
	KeepAlives uint64
	// QueueReads counts the reads of a key's queue by waiters (one when
	// a waiter enqueues, one each time something ahead of it changed,
	// one per Recheck while idle).
	QueueReads uint64
	// Watches counts the watches waiters opened; Watching is how many
	// are open now (at most Max+1 per waiter, and one more per vanished
	// holder for the first in line).
	Watches  uint64
	Watching int64
	// HolderReadyProbes counts the calls of Config.HolderReady.
	HolderReadyProbes uint64
	// Detours counts the detours this budget took: after an attempt got
	// no answer, the first member to say it has a leader, through which
	// the requests of every budget of the client went for a few seconds
	// (the client's balancer keeps sending a hung member its share until
	// gRPC's keep-alive closes its connection).
	Detours uint64
}

// Stats returns the budget's counters.
func (b *Budget) Stats() Stats {
	return Stats{Acquired: b.acquired.Load(), FailOpenGrants: b.failOpen.Load(), Unreachable: b.unreached.Load(),
		Refused: b.refusals.Load(), Lost: b.lost.Load(), DelayedTakeovers: b.delayed.Load(), Requests: b.requests.Load(),
		KeepAlives: b.keepalive.Load(), QueueReads: b.reads.Load(), Watches: b.watches.Load(), Watching: b.watching.Load(),
		HolderReadyProbes: b.probes.Load(), Detours: b.detoured.Load()}
}

// entry is the value of a waiter's or holder's key, and of its markers
// under legacy keys.
type entry struct {
	Holder string    `json:"holder"`
	Max    int       `json:"max"`
	Since  time.Time `json:"since"`
	// V is entryVersion; 0 in an entry of an earlier etcdbudget (v0.1.1,
	// v0.2.0), which a waiter counts under a legacy key.
	V int `json:"v,omitempty"`
	// For is, in a marker, the key it stands for.
	For string `json:"for,omitempty"`
}

// entryVersion marks the entries this package writes (see entry.V).
const entryVersion = 3

// markerMark begins the name of a marker: an entry under a legacy key
// that stands for a waiter or holder of another key, so that earlier
// etcdbudgets, which count every key under their key's directory, count
// it. '~' sorts after every character of an entry's name (hex digits,
// '-'): this package reads a key's entries below it, markers apart.
const markerMark = "~"

// guard is the value of a holder's lock-delay guard: who holds the slot
// and since when, and the evidence a successor judges if the holder
// vanishes: the acts its fences recorded and the readiness it recorded
// after them (MarkReady).
type guard struct {
	// V is the record's version: 2 since guards carry act records. A
	// guard without it was written by an earlier etcdbudget, whose holder
	// recorded no acts: judged as one that may have acted.
	V       int       `json:"v,omitempty"`
	Holder  string    `json:"holder"`
	Since   time.Time `json:"since"`
	Acts    int       `json:"acts,omitempty"`    // fences that recorded an act
	Acted   time.Time `json:"acted,omitzero"`    // the last one
	Ready   int       `json:"ready,omitempty"`   // Acts when MarkReady last ran
	ReadyAt time.Time `json:"ready-at,omitzero"` // when
}

// settled reports whether a vanished holder of this guard needs no
// lock-delay: it never recorded an act, or recorded its services ready
// after its last one.
func (g guard) settled() bool { return g.Acts == 0 || g.Ready >= g.Acts }

// guardVersion is the version of the guards this package writes.
const guardVersion = 2

func guardOf(v []byte) guard {
	var g guard
	if json.Unmarshal(v, &g) != nil || g.Holder == "" {
		g.Holder = "?"
	}
	if g.V < guardVersion || g.Holder == "?" {
		// Unreadable, or written by an earlier version (a rolling
		// upgrade): judge it as a holder that may have acted.
		g.Acts, g.Ready = max(g.Acts, 1), 0
	}
	return g
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
	if cfg.Attempt == 0 {
		cfg.Attempt = min(max(cfg.TTL/5, 500*time.Millisecond), 2*time.Second)
	}
	if cfg.Attempt < 0 || cfg.Unreachable < 0 || cfg.Recheck < 0 {
		return nil, errors.New("etcdbudget: Attempt, Unreachable and Recheck must not be negative")
	}
	if cfg.Attempt > cfg.TTL/2 {
		return nil, fmt.Errorf("etcdbudget: Attempt %s must be at most half the TTL %s (keep-alives need retries within it)", cfg.Attempt, cfg.TTL)
	}
	if cfg.LockDelay == 0 {
		cfg.LockDelay = DefaultLockDelay
	}
	if cfg.LockDelay > 0 && cfg.LockDelay%time.Second != 0 {
		return nil, fmt.Errorf("etcdbudget: LockDelay %s must be whole seconds", cfg.LockDelay)
	}
	if cfg.Recheck == 0 {
		cfg.Recheck = max(DefaultRecheck, cfg.TTL)
	}
	if cfg.Holder == "" {
		cfg.Holder = DefaultHolder()
	}
	if cfg.HaltAfter == 0 {
		cfg.HaltAfter = budget.DefaultHaltAfter
	}
	if cfg.HistoryLimit == 0 {
		cfg.HistoryLimit = DefaultHistoryLimit
	}
	if cfg.HistoryLimit < 0 {
		return nil, fmt.Errorf("etcdbudget: HistoryLimit %d is negative", cfg.HistoryLimit)
	}
	if cfg.HistoryAge == 0 {
		cfg.HistoryAge = DefaultHistoryAge
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

// dir is where key's entries live; guards is where its lock-delay guards
// live ('#' cannot occur in a key, so neither range holds the other's
// keys, nor another key's).
func (b *Budget) dir(key string) string    { return b.cfg.Prefix + key + "/" }
func (b *Budget) guards(key string) string { return b.cfg.Prefix + key + "#lock-delay/" }

// entriesOf is the range of key's entries, markers left out: from dir(key)
// (the OpGet's key) to its end.
func (b *Budget) entriesOf(key string) clientv3.OpOption {
	return clientv3.WithRange(b.dir(key) + markerMark)
}

// legacyDirs returns the directories of key's legacy keys
// (Config.LegacyKeys): each checked as v0.1.1 checked its keys, and none
// that is key itself (its entries are counted anyway).
func (b *Budget) legacyDirs(key string) ([]string, error) {
	f := b.cfg.LegacyKeys
	if f == nil {
		f = LegacySnapKeys
	}
	var dirs []string
	for _, k := range f(key) {
		if k == "" || strings.Contains(k, "/") {
			return nil, refused("taking a slot of "+key, fmt.Errorf("legacy key %q (Config.LegacyKeys): empty or containing '/'", k))
		}
		if k != key && !slices.Contains(dirs, b.dir(k)) {
			dirs = append(dirs, b.dir(k))
		}
	}
	return dirs, nil
}

// Acquire waits for a slot of key (normalised as Key does). It enqueues
// an entry under the key, bound to a lease of its own, and holds a slot
// once fewer than Max entries created before it remain and no slot is
// held back by a vanished holder's lock-delay; waiters are served in the
// order they enqueued (etcd's create revision). While it waits it
// watches only the Max entries just ahead of it, and reports who holds
// and how many are ahead. When ctx ends or Acquire fails, its entry is
// removed (its lease revoked, one attempt at most; if etcd does not
// answer at once, the lease expires within TTL).
func (b *Budget) Acquire(ctx context.Context, key string, progress func(budget.Wait)) (budget.Slot, error) {
	key, err := normaliseKey(key)
	if err != nil {
		b.refusals.Add(1)
		return nil, err
	}
	if b.cfg.ClusterExists != nil && !b.cfg.ClusterExists(ctx) {
		b.cfg.Logger.Info("no cluster exists yet: proceeding without a slot", "key", key)
		return newUnbudgeted(key, b.cfg.Holder+" (no cluster yet, unbudgeted)"), nil
	}
	out := &outage{bound: b.cfg.Unreachable}
	k, err := b.grant(ctx, out, key)
	if err != nil {
		return b.failed(ctx, key, err)
	}
	w := &waiter{b: b, k: k, out: out, key: key}
	s, err := w.wait(ctx, progress)
	if err != nil {
		w.abandon()
		return b.failed(ctx, key, err)
	}
	// Operator controls (control.go): a paused key keeps the slot just
	// granted, and the queue behind it, until it is resumed (and Fence
	// checks the pause again at the moment of acting).
	if err := b.awaitResume(ctx, key, s.Lost(), progress); err != nil {
		s.abandon()
		return nil, err
	}
	b.acquired.Add(1)
	return s, nil
}

// failed decides what an Acquire that failed with err returns: a slot
// only under FailOpen and only when etcd was unreachable.
func (b *Budget) failed(ctx context.Context, key string, err error) (budget.Slot, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	var u *UnreachableError
	switch {
	case errors.Is(err, errLeaseGone) && !errors.Is(err, budget.ErrUnavailable):
		// Every path where this waiter's own lease expired is the same
		// failure whatever request noticed it: its place in the queue
		// is lost and a later Acquire may succeed (retryable).
		return nil, fmt.Errorf("%w: waiting for %s: this waiter's lease expired: %w", budget.ErrUnavailable, key, err)
	case errors.As(err, &u):
		b.unreached.Add(1)
		if b.cfg.FailOpen {
			n := b.failOpen.Add(1)
			b.cfg.Logger.Warn("etcd unreachable: proceeding without a slot (fail open)", "key", key, "grants", n, "error", err)
			return newUnbudgeted(key, b.cfg.Holder+" (etcd unreachable, fail open: unbudgeted)"), nil
		}
	case errors.Is(err, budget.ErrRefused):
		b.refusals.Add(1)
	}
	return nil, err
}

// waiter is one Acquire in progress.
type waiter struct {
	b     *Budget
	k     *keeper
	out   *outage
	key   string
	name  string // the entry's name under dir
	entry string // its key
	rev   int64  // its create revision
	// legacy are the directories of the key's legacy keys; markers the
	// waiter's marker in each (created with the entry, on its lease).
	legacy, markers []string
	held            bool // waited behind a vanished holder's lock-delay
	// probing is the HolderReady probe in flight (pollReady), nil while
	// none runs.
	probing chan error
}

// probeTimeout bounds each call of Config.HolderReady (its context ends
// then, or when the wait it serves ends).
const probeTimeout = 5 * time.Second

// abandon stops the waiter's lease: revoked (one attempt) when etcd
// answers, else left to expire, so a cancelled Acquire returns promptly.
func (w *waiter) abandon() {
	healthy := w.k.healthy() && !w.out.failing()
	w.k.stop()
	if !healthy {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.b.cfg.Attempt)
	defer cancel()
	_ = w.b.revokeOnce(ctx, w.k.id)
}

// queue is what one read of the key says about a waiter.
type queue struct {
	rev     int64              // revision of the read
	mine    bool               // the waiter's entry exists
	older   []string           // keys of entries created before it, nearest first
	legacy  []string           // keys of earlier etcdbudgets' entries under legacy keys created before it
	holders []*mvccpb.KeyValue // the first Max entries
	orphans []*mvccpb.KeyValue // guards whose holder's entry is gone
}

// head reports whether the waiter is first in line: it would hold a slot
// but for the vanished holders' guards.
func (q queue) head(max int) bool { return len(q.older)+len(q.legacy) < max }

// read reads, in one linearizable transaction, the entries ahead of the
// waiter (keys only, nearest first), the first Max entries (the holders)
// and the key's lock-delay guards.
func (w *waiter) read(ctx context.Context) (queue, error) {
	b := w.b
	var q queue
	err := b.call(ctx, w.out, "reading the queue of "+w.key, func(actx context.Context) error {
		b.reads.Add(1)
		ops := []clientv3.Op{
			clientv3.OpGet(b.dir(w.key), b.entriesOf(w.key), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(w.rev-1),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend)),
			clientv3.OpGet(b.dir(w.key), b.entriesOf(w.key), clientv3.WithLimit(int64(b.cfg.Max)),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
			clientv3.OpGet(b.guards(w.key), clientv3.WithPrefix()),
			clientv3.OpGet(w.entry, clientv3.WithKeysOnly()),
		}
		for _, d := range w.legacy {
			// Entries under a legacy key created before this waiter, its
			// markers and its peers' left out.
			ops = append(ops, clientv3.OpGet(d, clientv3.WithRange(d+markerMark), clientv3.WithMaxCreateRev(w.rev-1),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend)))
		}
		resp, err := b.kv(actx).Txn(actx).Then(ops...).Commit()
		if err != nil {
			return err
		}
		q = queue{rev: resp.Header.Revision}
		for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
			q.older = append(q.older, string(kv.Key))
		}
		q.holders = resp.Responses[1].GetResponseRange().Kvs
		for _, g := range resp.Responses[2].GetResponseRange().Kvs {
			name := strings.TrimPrefix(string(g.Key), b.guards(w.key))
			if !slices.ContainsFunc(q.holders, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == b.dir(w.key)+name }) {
				q.orphans = append(q.orphans, g)
			}
		}
		q.mine = len(resp.Responses[3].GetResponseRange().Kvs) == 1
		for _, r := range resp.Responses[4:] {
			for _, kv := range r.GetResponseRange().Kvs {
				var e entry
				if json.Unmarshal(kv.Value, &e) != nil || e.V == 0 {
					q.legacy = append(q.legacy, string(kv.Key))
				}
			}
		}
		return nil
	})
	return q, err
}

// wait enqueues the waiter's entry and waits until it holds a slot.
func (w *waiter) wait(ctx context.Context, progress func(budget.Wait)) (*slot, error) {
	b := w.b
	w.name = fmt.Sprintf("%016x-%d", int64(w.k.id), b.seq.Add(1))
	w.entry = b.dir(w.key) + w.name
	since := time.Now().UTC()
	val, err := json.Marshal(entry{Holder: b.cfg.Holder, Max: b.cfg.Max, Since: since, V: entryVersion})
	if err != nil {
		return nil, err
	}
	if w.legacy, err = b.legacyDirs(w.key); err != nil {
		return nil, err
	}
	puts := []clientv3.Op{clientv3.OpPut(w.entry, string(val), clientv3.WithLease(w.k.id))}
	for _, d := range w.legacy {
		mval, _ := json.Marshal(entry{Holder: b.cfg.Holder, Max: b.cfg.Max, Since: since, V: entryVersion, For: w.key})
		m := d + markerMark + w.name
		w.markers = append(w.markers, m)
		puts = append(puts, clientv3.OpPut(m, string(mval), clientv3.WithLease(w.k.id)))
	}
	// Requests end with the caller's context and with the lease: a
	// waiter whose keep-alives go unanswered for TTL is told at once.
	caller := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-w.k.gone:
			cancel(w.leaseErr())
		case <-ctx.Done():
		}
	}()
	fail := func(err error) error {
		if caller.Err() != nil {
			return context.Cause(caller)
		}
		if errors.Is(err, errLeaseGone) {
			return w.leaseErr()
		}
		return err
	}

	// Enqueue, with the markers under the legacy keys in the same
	// revision. A retry after a lost answer finds the entry it made.
	err = b.call(ctx, w.out, "enqueuing "+w.entry, func(actx context.Context) error {
		resp, err := b.kv(actx).Txn(actx).
			If(clientv3.Compare(clientv3.CreateRevision(w.entry), "=", 0)).
			Then(puts...).
			Else(clientv3.OpGet(w.entry)).Commit()
		if err != nil {
			return err
		}
		w.rev = resp.Header.Revision
		if !resp.Succeeded {
			w.rev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
		}
		return nil
	})
	if err != nil {
		return nil, fail(err)
	}

	var last budget.Wait
	reported := false
	for {
		q, err := w.read(ctx)
		if err != nil {
			return nil, fail(err)
		}
		if !q.mine {
			return nil, fail(w.vanished(ctx))
		}
		if err := w.checkMax(q); err != nil {
			return nil, err
		}
		if len(q.older)+len(q.legacy)+len(q.orphans) < b.cfg.Max {
			return w.take(ctx, q, progress)
		}
		if q.head(b.cfg.Max) && len(q.orphans) > 0 {
			// First in line behind vanished holders: a holder that never
			// recorded an act, or recorded its services ready after its
			// last one, needs no lock-delay; its guard goes now.
			if n, err := w.settle(ctx, q.orphans); err != nil {
				return nil, fail(err)
			} else if n > 0 {
				continue
			}
		}
		holders := make([]string, 0, b.cfg.Max)
		for _, kv := range q.holders {
			if string(kv.Key) != w.entry {
				holders = append(holders, holderOf(kv.Value))
			}
		}
		for _, g := range q.orphans {
			holders = append(holders, guardOf(g.Value).Holder+" (vanished; lock-delay)")
		}
		for _, k := range q.legacy {
			holders = append(holders, "an earlier etcdbudget's "+k)
		}
		ahead := max(len(q.older)+len(q.legacy)+len(q.orphans)-b.cfg.Max, 0)
		wt := budget.Wait{Key: w.key, Holders: holders, Ahead: ahead, Max: b.cfg.Max}
		if progress != nil && (!reported || wt.Ahead != last.Ahead || !slices.Equal(wt.Holders, last.Holders)) {
			progress(wt)
			last, reported = wt, true
		}
		// Wait for a change that can let this waiter in: the deletion of
		// one of the Max entries just ahead of it (no other deletion can
		// bring the count ahead below Max), or, first in line, the end of
		// a lock-delay. Its own entry too: deleted by an operator. So a
		// waiter keeps at most Max+1 watches, and the first in line one
		// more per vanished holder's guard.
		watch := append(slices.Clone(q.older[:min(len(q.older), b.cfg.Max)]), w.entry)
		watch = append(watch, q.legacy[:min(len(q.legacy), b.cfg.Max)]...)
		var orphans []*mvccpb.KeyValue
		if q.head(b.cfg.Max) {
			orphans = q.orphans
			w.held = w.held || len(orphans) > 0
		}
		if err := w.waitDeletes(ctx, watch, q.rev, orphans); err != nil {
			return nil, fail(err)
		}
	}
}

func holderOf(v []byte) string {
	var e entry
	if json.Unmarshal(v, &e) != nil || e.Holder == "" {
		return "?"
	}
	return e.Holder
}

// leaseErr is the error of a waiter whose lease is gone.
func (w *waiter) leaseErr() error {
	err := w.k.Err()
	if err == nil {
		err = errLeaseGone
	}
	return fmt.Errorf("%w: waiting for %s: this waiter's lease expired, its place in the queue is lost: %w", budget.ErrUnavailable, w.key, err)
}

// vanished explains a waiter's entry that is gone: its lease expired
// (retryable), or someone deleted it (an operator: refused).
func (w *waiter) vanished(ctx context.Context) error {
	err := w.b.call(ctx, w.out, "checking lease of "+w.entry, func(actx context.Context) error {
		_, err := w.b.leases(actx).KeepAliveOnce(actx, w.k.id)
		return err
	})
	switch {
	case err == nil:
		return refused("waiting for "+w.key, fmt.Errorf("this waiter's entry %s was deleted by someone else (an operator?) while its lease is alive", w.entry))
	case errors.Is(err, errLeaseGone):
		// The entry went with this waiter's own lease (cut off or
		// paused past its TTL): retryable, never a bare "lease not
		// found".
		return w.leaseErr()
	}
	return err
}

// checkMax refuses a key whose holders were configured with another Max.
func (w *waiter) checkMax(q queue) error {
	for _, kv := range q.holders {
		var e entry
		if json.Unmarshal(kv.Value, &e) == nil && e.Max != w.b.cfg.Max {
			return refused("waiting for "+w.key, fmt.Errorf("%s holds it with Max %d, this machine has Max %d: every machine must use the same Max for a key", e.Holder, e.Max, w.b.cfg.Max))
		}
	}
	return nil
}

// waitDeletes waits until one of keys or of the orphan guards is
// deleted after rev, a vanished holder is seen ready again (HolderReady,
// orphans are given to the first waiter in line only), Recheck passed, or
// the watch failed (compaction, no leader: the caller reads again; a
// compacted or closed watch is never taken for a deletion).
func (w *waiter) waitDeletes(ctx context.Context, keys []string, rev int64, orphans []*mvccpb.KeyValue) error {
	b := w.b
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	woke := make(chan error, len(keys)+len(orphans)+1)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	watch := func(key string, opts ...clientv3.OpOption) {
		wg.Add(1)
		b.watches.Add(1)
		b.watching.Add(1)
		go func() {
			defer wg.Done()
			defer b.watching.Add(-1)
			for wr := range b.cfg.Client.Watch(wctx, key, append(opts, clientv3.WithRev(rev+1))...) {
				if err := wr.Err(); err != nil {
					woke <- err
					return
				}
				if len(wr.Events) > 0 {
					woke <- nil
					return
				}
			}
			woke <- errors.New("watch closed")
		}()
	}
	for _, k := range keys {
		watch(k, clientv3.WithFilterPut())
	}
	for _, g := range orphans {
		// Its deletion (the lease expired, or another waiter judged it)
		// and its puts: a vanished holder may still record its services
		// ready (MarkReady), which ends its lock-delay.
		watch(string(g.Key))
	}
	if b.cfg.HolderReady != nil && len(orphans) > 0 && w.probing == nil {
		// The probe runs beside the wait, not joined by it: a probe that
		// hangs holds neither the wait nor the caller's cancellation, and
		// is not started again until it returned.
		done := make(chan error, 1) // never blocks: it may end after Acquire
		w.probing = done
		go func() { done <- w.pollReady(wctx, orphans) }()
	}
	recheck := time.NewTimer(jitter(b.cfg.Recheck))
	defer recheck.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-recheck.C:
		return nil
	case <-w.probing: // nil while no probe runs
		// A guard deleted (its holder seen ready), or a probe of an
		// earlier wait that ended at last: read again.
		w.probing = nil
		return nil
	case err := <-woke:
		if err != nil {
			// The watch failed (compacted, no leader): read again, after
			// a pause so that a watch failing at once does not spin.
			b.cfg.Logger.Debug("watch failed; reading the queue again", "key", w.key, "error", err)
			return sleep(ctx, 100*time.Millisecond)
		}
		return nil
	}
}

// jitter returns d within ±20%.
func jitter(d time.Duration) time.Duration {
	return d - d/5 + rand.N(2*d/5+1)
}

// settle deletes the guards of vanished holders that need no lock-delay
// (guard.settled), each only if unchanged, and returns how many it found.
func (w *waiter) settle(ctx context.Context, orphans []*mvccpb.KeyValue) (int, error) {
	n := 0
	for _, kv := range orphans {
		g := guardOf(kv.Value)
		if !g.settled() {
			continue
		}
		n++
		err := w.b.call(ctx, w.out, "ending the lock-delay of "+string(kv.Key), func(actx context.Context) error {
			_, err := w.b.kv(actx).Txn(actx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
				Then(clientv3.OpDelete(string(kv.Key))).Commit()
			return err
		})
		if err != nil {
			return n, err
		}
		why := "it never acted"
		if g.Acts > 0 {
			why = "it recorded its services ready after its last act"
		}
		w.b.cfg.Logger.Info("vanished holder needs no lock-delay: "+why, "key", w.key, "holder", g.Holder, "acts", g.Acts)
	}
	return n, nil
}

// pollReady asks HolderReady about each orphan guard's holder every
// 500ms, each call bounded by probeTimeout; once one is ready it deletes
// that guard (if unchanged) and returns.
func (w *waiter) pollReady(ctx context.Context, orphans []*mvccpb.KeyValue) error {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		for _, kv := range orphans {
			g := guardOf(kv.Value)
			w.b.probes.Add(1)
			pctx, cancel := context.WithTimeout(ctx, probeTimeout)
			ready := w.b.cfg.HolderReady(pctx, VanishedHolder{Key: w.key, Holder: g.Holder, Granted: g.Since, Acts: g.Acts, Acted: g.Acted})
			cancel()
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if ready {
				actx, cancel := context.WithTimeout(ctx, w.b.cfg.Attempt)
				actx, _ = w.b.routed(actx)
				_, err := w.b.kv(actx).Txn(actx).If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
					Then(clientv3.OpDelete(string(kv.Key))).Commit()
				cancel()
				w.b.cfg.Logger.Info("vanished holder restarted after its act and ready again: lock-delay ended", "key", w.key, "holder", g.Holder)
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// take turns the waiter's entry into a held slot: it puts the slot's
// lock-delay guard, on a lease of TTL+LockDelay kept alive with the
// entry's, which outlives the entry by LockDelay when the holder
// vanishes and is revoked first by Release.
func (w *waiter) take(ctx context.Context, q queue, progress func(budget.Wait)) (*slot, error) {
	b := w.b
	rev := q.rev
	rec := guard{V: guardVersion, Holder: b.cfg.Holder, Since: time.Now().UTC()}
	var grev int64
	var gid clientv3.LeaseID
	if b.cfg.LockDelay > 0 {
		err := b.call(ctx, w.out, "granting the lock-delay lease of "+w.entry, func(actx context.Context) error {
			r, err := b.leases(actx).Grant(actx, int64((b.cfg.TTL+b.cfg.LockDelay)/time.Second))
			if err == nil {
				gid = r.ID
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		w.k.setExtra(gid)
		val, _ := json.Marshal(rec)
		var ok bool
		err = b.call(ctx, w.out, "putting the lock-delay guard of "+w.entry, func(actx context.Context) error {
			resp, err := b.kv(actx).Txn(actx).If(clientv3.Compare(clientv3.CreateRevision(w.entry), "=", w.rev)).
				Then(clientv3.OpPut(b.guards(w.key)+w.name, string(val), clientv3.WithLease(gid))).Commit()
			if err == nil {
				ok, rev, grev = resp.Succeeded, resp.Header.Revision, resp.Header.Revision
			}
			return err
		})
		if err == nil && !ok {
			err = w.vanished(ctx)
		}
		if err != nil {
			rctx, cancel := context.WithTimeout(context.Background(), b.cfg.Attempt)
			defer cancel()
			_ = b.revokeOnce(rctx, gid)
			return nil, err
		}
	}
	if w.held {
		b.delayed.Add(1)
		b.cfg.Logger.Info("slot taken over after a vanished holder's lock-delay", "key", w.key)
	}
	b.cfg.Logger.Debug("slot acquired", "key", w.key, "entry", w.entry, "revision", w.rev)
	return newSlot(w, gid, rev, rec, grev, progress), nil
}

// Holders lists who holds or waits for key, oldest first (for status
// output). It is a linearizable read.
func (b *Budget) Holders(ctx context.Context, key string) (holding, waiting []string, err error) {
	key, err = normaliseKey(key)
	if err != nil {
		return nil, nil, err
	}
	var resp *clientv3.GetResponse
	err = b.call(ctx, &outage{bound: b.cfg.Unreachable}, "reading the queue of "+key, func(actx context.Context) error {
		var err error
		resp, err = b.kv(actx).Get(actx, b.dir(key), b.entriesOf(key), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	for i, kv := range resp.Kvs {
		if i < b.cfg.Max {
			holding = append(holding, holderOf(kv.Value))
		} else {
			waiting = append(waiting, holderOf(kv.Value))
		}
	}
	return holding, waiting, nil
}
