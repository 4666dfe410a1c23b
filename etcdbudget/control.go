package etcdbudget

// Operator controls of a budget key: its status (who holds, who waits),
// a cluster-wide pause, and the machines taking part in a rollout (for a
// max-unavailable given as a percentage). The keys live next to the
// key's queue, under names a budget key cannot contain ('#'):
//
//	PREFIX KEY/LEASE-SEQ             the queue (budget.go)
//	PREFIX KEY#pause                 the pause record, no lease: it stays until resumed
//	PREFIX KEY#participants/HOLDER   one per machine taking part, on its lease
//	PREFIX KEY#max                   a percentage resolved to a count, pinned for the rollout
//	PREFIX KEY#history/SEQ           the key's history, one record each, no lease (history.go)
//	PREFIX KEY#history-head          the history's last SEQ, its failures since the last ready act or resume, its last act IDs
//
// A halt (history.go) is a pause record that carries a budget.Halt: a
// halted key is a paused key, held back and resumed the same way.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/budget"
)

func (b *Budget) pauseKey(key string) string        { return b.cfg.Prefix + key + "#pause" }
func (b *Budget) participantsDir(key string) string { return b.cfg.Prefix + key + "#participants/" }
func (b *Budget) pinKey(key string) string          { return b.cfg.Prefix + key + "#max" }

// Keys lists the budget's keys that have anything in etcd under the
// prefix: holders or waiters, a pause or halt, a pinned max-unavailable,
// machines that joined, a vanished holder's lock-delay, a history; sorted,
// each once. It
// reads key names only (one range request, keys only), retried as Status
// is while etcd is unreachable.
func (b *Budget) Keys(ctx context.Context) ([]string, error) {
	var resp *clientv3.GetResponse
	err := b.retryControl(ctx, "listing the keys under "+b.cfg.Prefix, func(actx context.Context) (err error) {
		resp, err = b.kv(actx).Get(actx, b.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		return err
	})
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	keys := []string{}
	for _, kv := range resp.Kvs {
		rest := strings.TrimPrefix(string(kv.Key), b.cfg.Prefix)
		if i := strings.Index(rest, "/"+markerMark); i >= 0 && !strings.ContainsAny(rest[:i], "/#") {
			continue // a marker under a legacy key: it stands for another key
		}
		if i := strings.IndexAny(rest, "/#"); i >= 0 {
			rest = rest[:i]
		}
		if rest != "" && !seen[rest] {
			seen[rest] = true
			keys = append(keys, rest)
		}
	}
	sort.Strings(keys)
	return keys, nil
}

// lockDelayDir is where a key's lock-delay guards live (budget.go's
// layout; read here only for Status).
func (b *Budget) lockDelayDir(key string) string { return b.cfg.Prefix + key + "#lock-delay/" }

// controlKey puts key in canonical form, as Acquire does (Key), and
// checks it.
func controlKey(key string) (string, error) { return normaliseKey(key) }

// unavailable wraps an etcd failure of an operator request.
func unavailable(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", budget.ErrUnavailable, what, err)
}

// controlAttempt bounds one attempt of a control request (TTL/5, within
// 500ms..2s): a member that hangs costs one attempt, and the next goes
// around it (detour.go).
func (b *Budget) controlAttempt() time.Duration {
	return min(max(b.cfg.TTL/5, 500*time.Millisecond), 2*time.Second)
}

// retryControl runs the control request f, each attempt bounded by
// Config.Attempt (a member that hangs costs one attempt; the next goes
// around it), until it succeeds, etcd refuses it (an error wrapping
// budget.ErrRefused), ctx ends or Config.Unreachable passed (an
// error wrapping budget.ErrUnavailable). Errors name the endpoints
// and why each failed. f must be safe to repeat.
func (b *Budget) retryControl(ctx context.Context, what string, f func(context.Context) error) error {
	err := b.call(ctx, &outage{bound: b.cfg.Unreachable, early: true}, what, f)
	switch {
	case err == nil, errors.Is(err, budget.ErrRefused), errors.Is(err, budget.ErrUnavailable):
		return err
	}
	return fmt.Errorf("%w: %w", budget.ErrUnavailable, err) // err names what failed

}

// Entry is one machine in a key's queue, holding or waiting.
type Entry struct {
	// Holder identifies the machine ("node-1 pid 4242").
	Holder string `json:"holder"`
	// Since is when it entered the queue (its own clock).
	Since time.Time `json:"since"`
	// Acquired is when a holder took its slot, where the budget records
	// it (its lock-delay guard); zero otherwise.
	Acquired time.Time `json:"acquired,omitzero"`
	// Acts counts the acts a holder's fences recorded (a request that
	// disrupts may have followed each), Acted is when the last one was
	// recorded, and ReadyAt when it recorded its services ready again
	// after it (zero: not since its last act). From its lock-delay guard.
	Acts    int       `json:"acts,omitempty"`
	Acted   time.Time `json:"acted,omitzero"`
	ReadyAt time.Time `json:"ready-at,omitzero"`
	// BlockedBy, for a waiter, names the vanished holders whose
	// lock-delay alone keeps it from holding a slot.
	BlockedBy []string `json:"blocked-by,omitempty"`
	// Max is the slot count it was configured with.
	Max int `json:"max,omitempty"`
	// Lease is the etcd lease its entry lives on.
	Lease int64 `json:"lease,omitempty"`
	// Key is its etcd key.
	Key string `json:"key"`
}

// PauseRecord is a key's pause, as Pause wrote it.
type PauseRecord struct {
	// By is who paused the key.
	By string `json:"by"`
	// Since is when.
	Since time.Time `json:"since"`
	// Reason is the operator's note (may be empty); for a halt, what
	// halted the key ("halted: node-1's restart of k8s.kubelet (change
	// 42): ...").
	Reason string `json:"reason,omitempty"`
	// Halt is set when the key halted itself (Config.HaltAfter failed
	// acts): By is then the holder whose Record halted it.
	Halt *budget.Halt `json:"halt,omitempty"`
}

// KeyStatus is what etcd says about a key at one revision.
type KeyStatus struct {
	// Key is the normalised budget key.
	Key string `json:"key"`
	// Max is the key's slot count: the holders' (they all use the same),
	// or this Budget's when the queue is empty.
	Max int `json:"max"`
	// Holders hold the key's slots, oldest first.
	Holders []Entry `json:"holders"`
	// Waiters wait, in the order they will be served; those that would
	// hold a slot but for a vanished holder's lock-delay name it
	// (Entry.BlockedBy).
	Waiters []Entry `json:"waiters"`
	// Vanished are holders whose lease expired without a release, whose
	// slot is held back by their lock-delay (until the guard's lease
	// expires, or the first waiter finds the holder never acted or was
	// ready after its last act).
	Vanished []Entry `json:"vanished,omitempty"`
	// Paused is the key's pause, nil when it is not paused.
	Paused *PauseRecord `json:"paused,omitempty"`
	// Halt is the key's halt (Paused.Halt), nil when it is not halted: a
	// halted key is paused until an operator resumes it.
	Halt *budget.Halt `json:"halt,omitempty"`
	// Participants are the machines that registered for the key's
	// rollout (see Join).
	Participants []Entry `json:"participants,omitempty"`
	// Pinned is the slot count a percentage was resolved to for the
	// current rollout (0: none).
	Pinned *Pin `json:"pinned,omitempty"`
	// Revision is etcd's revision of the read.
	Revision int64 `json:"revision"`
}

// Status reads key's holders, waiters, pause and participants in one
// linearizable transaction (it needs a quorum). Errors wrap
// budget.ErrUnavailable (etcd did not answer within ctx or
// Config.Unreachable) or budget.ErrRefused (a key the budget
// cannot use).
func (b *Budget) Status(ctx context.Context, key string) (*KeyStatus, error) {
	key, err := controlKey(key)
	if err != nil {
		return nil, err
	}
	sorted := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}
	var resp *clientv3.TxnResponse
	err = b.retryControl(ctx, "reading the status of "+key, func(actx context.Context) (err error) {
		resp, err = b.kv(actx).Txn(actx).Then(
			clientv3.OpGet(b.dir(key), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), b.entriesOf(key)),
			clientv3.OpGet(b.lockDelayDir(key), sorted...),
			clientv3.OpGet(b.pauseKey(key)),
			clientv3.OpGet(b.participantsDir(key), sorted...),
			clientv3.OpGet(b.pinKey(key)),
		).Commit()
		return err
	})
	if err != nil {
		return nil, err
	}
	st := &KeyStatus{Key: key, Max: b.cfg.Max, Revision: resp.Header.Revision, Holders: []Entry{}, Waiters: []Entry{}}
	entries := entriesOf(resp.Responses[0].GetResponseRange().Kvs)
	if len(entries) > 0 && entries[0].Max > 0 {
		st.Max = entries[0].Max
	}
	// A holder is an entry among the first Max with its lock-delay guard
	// (put when it took the slot); a guard without its entry is a
	// vanished holder's; an entry among the first Max without a guard
	// holds (no lock-delay configured, or taking it now) unless the
	// vanished holders' guards count against it: then it waits, blocked
	// by their lock-delay, as Acquire counts (entries ahead + vanished
	// < Max).
	guardKvs := resp.Responses[1].GetResponseRange().Kvs
	guarded := map[string]guard{}
	for _, kv := range guardKvs {
		guarded[b.dir(key)+strings.TrimPrefix(string(kv.Key), b.lockDelayDir(key))] = guardOf(kv.Value)
	}
	withRecord := func(e Entry, g guard) Entry {
		e.Acquired, e.Acts, e.Acted = g.Since, g.Acts, g.Acted
		if g.Acts > 0 && g.Ready >= g.Acts {
			e.ReadyAt = g.ReadyAt
		}
		return e
	}
	for _, kv := range guardKvs {
		name := strings.TrimPrefix(string(kv.Key), b.lockDelayDir(key))
		if !slices.ContainsFunc(entries, func(e Entry) bool { return e.Key == b.dir(key)+name }) {
			g := guardOf(kv.Value)
			st.Vanished = append(st.Vanished, withRecord(Entry{Holder: g.Holder, Since: g.Since, Key: string(kv.Key), Lease: kv.Lease}, g))
		}
	}
	var vanished []string
	for _, v := range st.Vanished {
		vanished = append(vanished, v.Holder)
	}
	for i, e := range entries {
		g, ok := guarded[e.Key]
		switch {
		case i >= st.Max:
			st.Waiters = append(st.Waiters, e)
		case ok:
			st.Holders = append(st.Holders, withRecord(e, g))
		case i+len(st.Vanished) < st.Max:
			st.Holders = append(st.Holders, e)
		default:
			e.BlockedBy = vanished
			st.Waiters = append(st.Waiters, e)
		}
	}
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) == 1 {
		var p PauseRecord
		if json.Unmarshal(kvs[0].Value, &p) != nil {
			p.By = "?"
		}
		st.Paused = &p
		st.Halt = p.Halt
	}
	st.Participants = entriesOf(resp.Responses[3].GetResponseRange().Kvs)
	if kvs := resp.Responses[4].GetResponseRange().Kvs; len(kvs) == 1 {
		var p Pin
		if json.Unmarshal(kvs[0].Value, &p) == nil {
			st.Pinned = &p
		}
	}
	return st, nil
}

// entriesOf decodes queue (or participant, or guard) entries.
func entriesOf(kvs []*mvccpb.KeyValue) []Entry {
	out := make([]Entry, 0, len(kvs))
	for _, kv := range kvs {
		var e Entry
		if json.Unmarshal(kv.Value, &e) != nil || e.Holder == "" {
			e.Holder = "?"
		}
		e.Key, e.Lease = string(kv.Key), kv.Lease
		out = append(out, e)
	}
	return out
}

// Pause pauses key cluster-wide: from now on every Acquire of the key
// that reaches the front of the queue keeps its place, and its slot,
// without returning until the key is resumed; the machines behind it stay
// queued in order. A restart already under way is not interrupted. The
// record has no lease: it stays until Resume, whoever set it. Pausing a
// paused (or halted) key keeps the first record and returns it. The same
// transaction appends a budget.RecordPaused record (By, Reason) to the
// key's history.
func (b *Budget) Pause(ctx context.Context, key, reason string) (*PauseRecord, error) {
	key, err := controlKey(key)
	if err != nil {
		return nil, err
	}
	rec := PauseRecord{By: b.cfg.Holder, Since: time.Now().UTC(), Reason: reason}
	val, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	pk, hk := b.pauseKey(key), b.historyHead(key)
	var old *PauseRecord
	err = b.retryControl(ctx, "pausing "+key, func(actx context.Context) error {
		for {
			st, err := b.readHistory(actx, key, -1)
			if err != nil {
				return err
			}
			if st.pause != nil {
				old = pauseOf(st.pause) // paused already (or by an attempt whose answer was lost)
				return nil
			}
			ops := b.appending(key, st, st.head.Failures, rec.Since,
				historyValue{Record: budget.Record{Kind: budget.RecordPaused, By: rec.By, Reason: reason}})
			resp, err := b.kv(actx).Txn(actx).
				If(clientv3.Compare(clientv3.CreateRevision(pk), "=", 0), clientv3.Compare(clientv3.ModRevision(hk), "=", st.headRev)).
				Then(append(ops, clientv3.OpPut(pk, string(val)))...).Commit()
			if err != nil {
				return err
			}
			if resp.Succeeded {
				return nil
			}
			// Paused meanwhile, or the history moved on: read again.
		}
	})
	if err != nil {
		return nil, err
	}
	if old != nil {
		return old, nil
	}
	return &rec, nil
}

// Resume lifts key's pause (or halt); the machines it held back go on in
// queue order. It reports whether the key was paused. It is ResumeWith
// with no reason.
func (b *Budget) Resume(ctx context.Context, key string) (bool, error) {
	return b.ResumeWith(ctx, key, "")
}

// ResumeWith lifts key's pause or halt, and appends, in the same
// transaction, a budget.RecordResumed record (By: Config.Holder, and
// reason) to the key's history: the failures that halt a key are counted
// after it. It reports whether the key was paused. It lifts the pause it
// reads and only that one (the deletion is conditional on the record's
// revision): a retry after a lost answer, or a Resume racing another
// operator's, leaves alone a pause or halt set after the one it read.
func (b *Budget) ResumeWith(ctx context.Context, key, reason string) (bool, error) {
	key, err := controlKey(key)
	if err != nil {
		return false, err
	}
	pk, hk := b.pauseKey(key), b.historyHead(key)
	var lifts int64 // the revision of the pause record this Resume lifts, once read
	err = b.retryControl(ctx, "resuming "+key, func(actx context.Context) error {
		if lifts == 0 {
			resp, err := b.kv(actx).Get(actx, pk, clientv3.WithKeysOnly())
			if err != nil {
				return err
			}
			if len(resp.Kvs) == 0 {
				return nil // not paused
			}
			lifts = resp.Kvs[0].ModRevision
		}
		for {
			st, err := b.readHistory(actx, key, -1)
			if err != nil {
				return err
			}
			if st.pause == nil || st.pause.ModRevision != lifts {
				return nil // lifted (by an attempt whose answer was lost, or someone else); a newer pause stands
			}
			ops := b.appending(key, st, 0, time.Now().UTC(),
				historyValue{Record: budget.Record{Kind: budget.RecordResumed, By: b.cfg.Holder, Reason: reason}})
			resp, err := b.kv(actx).Txn(actx).
				If(clientv3.Compare(clientv3.ModRevision(pk), "=", lifts), clientv3.Compare(clientv3.ModRevision(hk), "=", st.headRev)).
				Then(append(ops, clientv3.OpDelete(pk))...).Commit()
			if err != nil {
				return err
			}
			if resp.Succeeded {
				return nil
			}
		}
	})
	if err != nil {
		return false, err
	}
	return lifts != 0, nil
}

// awaitResume waits while key is paused (a pause record of the key, of
// one of its parts, or of their snaps: budget.PauseScopes): it reports the pause
// through progress, and returns nil once no pause holds the key, ctx's
// cause once it ends (a *HaltedError wrapping it when a halt held the key
// back), or an error wrapping budget.ErrUnavailable
// once lost is closed (the slot held meanwhile was lost). It costs one
// read when the key is not paused. Acquire calls it once it holds its
// slot, Fence whenever its confirmation found a pause.
func (b *Budget) awaitResume(ctx context.Context, key string, lost <-chan struct{}, progress func(budget.Wait)) error {
	scopes := budget.PauseScopes(key)
	reported := ""
	var cur *PauseRecord // the pause last read, and its scope
	var curScope string
	// halted is the error of a wait that ended with cause while a halt
	// held the key back: it names the halt and how to lift it.
	halted := func(cause error) error {
		if cur == nil || cur.Halt == nil {
			return cause
		}
		return &HaltedError{Key: curScope, Halt: *cur.Halt, Err: cause}
	}
	for {
		var resp *clientv3.TxnResponse
		err := b.retryControl(ctx, "reading the pause of "+key, func(actx context.Context) (err error) {
			ops := make([]clientv3.Op, len(scopes))
			for i, sc := range scopes {
				ops[i] = clientv3.OpGet(b.pauseKey(sc))
			}
			resp, err = b.kv(actx).Txn(actx).Then(ops...).Commit()
			return err
		})
		if err != nil {
			if ctx.Err() != nil {
				return halted(context.Cause(ctx))
			}
			return err
		}
		scope, kv := "", (*mvccpb.KeyValue)(nil)
		for i, r := range resp.Responses {
			if kvs := r.GetResponseRange().Kvs; len(kvs) == 1 {
				scope, kv = scopes[i], kvs[0]
				break
			}
		}
		if kv == nil {
			return nil
		}
		p := pauseOf(kv)
		cur, curScope = p, scope
		if reported != scope {
			b.cfg.Logger.Info("key paused: holding the slot until it is resumed", "key", key, "pause", scope, "by", p.By, "reason", p.Reason,
				"halted", p.Halt != nil)
			if progress != nil {
				progress(budget.Wait{Key: key, Holders: []string{pausedMessage(key, scope, *p)}, Max: b.cfg.Max})
			}
			reported = scope
		}
		if err := b.watchGone(ctx, string(kv.Key), resp.Header.Revision+1, lost); err != nil {
			if ctx.Err() != nil {
				return halted(err)
			}
			return err
		}
	}
}

// Prefixes of the progress reports of waits that are not behind holders
// (BudgetWait.Holders[0]); DescribeWait reads them.
const (
	pausedPrefix = "paused by "
	windowPrefix = "outside the maintenance window "
)

// pausedMessage is the progress report of key held back by scope's pause.
func pausedMessage(key, scope string, p PauseRecord) string {
	msg := fmt.Sprintf("%s%s since %s", pausedPrefix, p.By, p.Since.Format(time.RFC3339))
	if scope != key {
		msg += " (the pause of " + scope + ")"
	}
	if p.Reason != "" {
		msg += ": " + p.Reason
	}
	if p.Halt != nil {
		msg += "; resume with: " + ResumeCommand(scope)
	}
	return msg
}

// DescribeWait renders what a budget wait (a "waiting" event's Wait)
// waits for, for people: "held by node-1, 2 ahead (max 1)", or, for the
// waits of a paused key or of a window that is closed, "paused by
// alice@ops-1 since 2026-12-04T10:34:26Z: disk alarm" and "outside the
// maintenance window Mon-Fri 22:00-04:00 UTC; opens …".
func DescribeWait(w budget.Wait) string {
	if len(w.Holders) == 1 && (strings.HasPrefix(w.Holders[0], pausedPrefix) || strings.HasPrefix(w.Holders[0], windowPrefix)) {
		return w.Holders[0]
	}
	held := "no holder yet"
	if len(w.Holders) > 0 {
		held = "held by " + strings.Join(w.Holders, ", ")
	}
	return fmt.Sprintf("%s, %d ahead (max %d)", held, w.Ahead, w.Max)
}

// watchGone returns nil once key is deleted at or after rev (or the watch
// needs a fresh read: it failed, was compacted, or a TTL passed), an error
// wrapping budget.ErrUnavailable once the slot is lost, or ctx's
// cause once it ends.
func (b *Budget) watchGone(ctx context.Context, key string, rev int64, lost <-chan struct{}) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := b.cfg.Client.Watch(wctx, key, clientv3.WithRev(rev), clientv3.WithFilterPut())
	recheck := time.NewTimer(b.cfg.TTL)
	defer recheck.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-lost:
			// Nothing acted on the slot yet: a later Acquire may succeed.
			return fmt.Errorf("%w: the slot's lease expired while the key was paused (etcd unreachable?)", budget.ErrUnavailable)
		case <-recheck.C:
			return nil
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || len(wr.Events) > 0 {
				// Deleted, or the watch cannot tell (compacted, closed,
				// no leader): read again. Never take a failed watch for
				// a deletion: the read decides.
				if !ok || wr.Err() != nil {
					if err := sleep(ctx, 100*time.Millisecond); err != nil {
						return err
					}
				}
				return nil
			}
		}
	}
}

// MaxUnavailable is how many machines may be disrupted at once: a count,
// or a percentage of the machines taking part in the rollout.
type MaxUnavailable struct {
	// Count is the number of machines (when Percent is 0).
	Count int
	// Percent, 1 to 100, is the share of the participants.
	Percent int
}

// ParseMaxUnavailable parses "2" (a count, at least 1) or "25%" (a
// percentage of the machines taking part, 1 to 100).
func ParseMaxUnavailable(s string) (MaxUnavailable, error) {
	if p, ok := strings.CutSuffix(strings.TrimSpace(s), "%"); ok {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 100 {
			return MaxUnavailable{}, fmt.Errorf("max-unavailable %q: a percentage must be 1%% to 100%%", s)
		}
		return MaxUnavailable{Percent: n}, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 1 {
		return MaxUnavailable{}, fmt.Errorf("max-unavailable %q: want a count of at least 1 or a percentage such as 25%%", s)
	}
	return MaxUnavailable{Count: n}, nil
}

// String returns "2" or "25%".
func (m MaxUnavailable) String() string {
	if m.Percent > 0 {
		return fmt.Sprintf("%d%%", m.Percent)
	}
	return strconv.Itoa(m.Count)
}

// Of resolves m for a rollout of participants machines: a count as it
// is; a percentage of participants rounded down, but at least 1 (so 25%
// of 3 machines is 1, of 8 is 2, of 10 is 2).
func (m MaxUnavailable) Of(participants int) int {
	if m.Percent == 0 {
		return max(m.Count, 1)
	}
	return max(participants*m.Percent/100, 1)
}

// Pin is a percentage resolved to a slot count for one rollout of a key,
// stored in etcd so that every machine uses the same count.
type Pin struct {
	// Spec is the percentage ("25%").
	Spec string `json:"spec"`
	// Max is the count it resolved to.
	Max int `json:"max"`
	// Participants is how many machines took part when it was resolved.
	Participants int `json:"participants"`
	// By is the machine that resolved it.
	By string `json:"by"`
	// Since is when.
	Since time.Time `json:"since"`
}

// Participation is a machine's registration in a key's rollout: an entry
// under the key's participants on a lease of its own, kept alive until
// Close.
type Participation struct {
	b      *Budget
	key    string
	lease  clientv3.LeaseID
	joined time.Time // when Join registered it

	mu  sync.Mutex
	pin clientv3.LeaseID // the pin's lease, kept alive along (0: none)

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	pinCh  chan clientv3.LeaseID
}

// Join registers this machine as taking part in key's rollout, so that a
// percentage MaxUnavailable counts it, under its Holder name (a process
// started again under the same name replaces its registration). The
// registration lives on a lease of TTL kept alive until Close (or until
// the process dies: then it expires within TTL).
func (b *Budget) Join(ctx context.Context, key string) (*Participation, error) {
	key, err := controlKey(key)
	if err != nil {
		return nil, err
	}
	what := "registering for the rollout of " + key
	var lease *clientv3.LeaseGrantResponse
	if err := b.retryControl(ctx, what, func(actx context.Context) (err error) {
		lease, err = b.leases(actx).Grant(actx, int64(b.cfg.TTL/time.Second))
		return err
	}); err != nil {
		return nil, err
	}
	val, _ := json.Marshal(Entry{Holder: b.cfg.Holder, Since: time.Now().UTC()})
	if err := b.retryControl(ctx, what, func(actx context.Context) error {
		// Keyed by the holder: a machine started again under the same
		// name replaces its registration rather than counting twice
		// until its old lease expires.
		_, err := b.kv(actx).Put(actx, b.participantsDir(key)+b.cfg.Holder, string(val), clientv3.WithLease(lease.ID))
		return err
	}); err != nil {
		rctx, rcancel := context.WithTimeout(context.Background(), b.controlAttempt())
		_ = b.revokeOnce(rctx, lease.ID) // else it expires within TTL
		rcancel()
		return nil, err
	}
	p := &Participation{b: b, key: key, lease: lease.ID, joined: time.Now(), done: make(chan struct{}), pinCh: make(chan clientv3.LeaseID, 1)}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	go p.keepAlive()
	return p, nil
}

// keepAlive renews the participation's lease, and the pin's once known,
// every TTL/3. A renewal that fails is retried at the next tick: losing
// the participation only changes the count later rollouts resolve.
func (p *Participation) keepAlive() {
	defer close(p.done)
	b := p.b
	t := time.NewTicker(b.cfg.TTL / 3)
	defer t.Stop()
	var pin clientv3.LeaseID
	for {
		select {
		case <-p.ctx.Done():
			return
		case pin = <-p.pinCh:
			continue
		case <-t.C:
		}
		// Each renewal is two requests at once (a member that hangs
		// cannot eat it), retried until the next tick: a lost pin would
		// have to be made again.
		for _, id := range []clientv3.LeaseID{p.lease, pin} {
			if id == 0 {
				continue
			}
			until := time.Now().Add(b.cfg.TTL / 3)
			for {
				ctx, cancel := context.WithTimeout(p.ctx, min(b.cfg.Attempt, time.Until(until)))
				err := b.keepAliveOnce(ctx, id)
				cancel()
				if err == nil || p.ctx.Err() != nil || isLeaseGone(err) || time.Now().After(until) {
					if err != nil && p.ctx.Err() == nil {
						b.cfg.Logger.Debug("participation keep-alive failed", "key", p.key, "lease", int64(id), "error", err)
					}
					break
				}
				if sleep(p.ctx, 50*time.Millisecond) != nil {
					break
				}
			}
		}
	}
}

// DefaultJoinPeriod is how long a percentage max-unavailable waits for
// machines to join a rollout before it is resolved (Controls.JoinPeriod's
// default).
const DefaultJoinPeriod = 10 * time.Second

// Resolve is ResolveAfter with DefaultJoinPeriod.
func (p *Participation) Resolve(ctx context.Context, m MaxUnavailable) (int, error) {
	return p.ResolveAfter(ctx, m, DefaultJoinPeriod)
}

// ResolveAfter returns the slot count m stands for in this rollout. A
// count is returned as is. A percentage is resolved once per rollout of
// the key, over a join period: the first machine whose join period
// (joinPeriod after its own Join) ends without a pin counts the
// participants registered by then and pins the result in etcd, on a lease
// every participant keeps alive; every machine waits for that pin (or the
// end of its own join period) and uses it, so every machine uses the same
// count until all have left and the pin expires. Machines that join after
// the pin use it and do not change it: the count is a percentage of the
// machines that joined within the period, never of more, so a late joiner
// never lets a rollout disrupt more machines than the percentage of those
// counted. A pin made for another percentage is an error wrapping
// budget.ErrRefused.
func (p *Participation) ResolveAfter(ctx context.Context, m MaxUnavailable, joinPeriod time.Duration) (int, error) {
	if m.Percent == 0 {
		return m.Of(0), nil
	}
	b := p.b
	pk := b.pinKey(p.key)
	what := "resolving max-unavailable " + m.String() + " of " + p.key
	for {
		var resp *clientv3.TxnResponse
		if err := b.retryControl(ctx, what, func(actx context.Context) (err error) {
			resp, err = b.kv(actx).Txn(actx).Then(
				clientv3.OpGet(pk),
				clientv3.OpGet(b.participantsDir(p.key), clientv3.WithPrefix(), clientv3.WithCountOnly()),
				clientv3.OpGet(b.dir(p.key), b.entriesOf(p.key), clientv3.WithLimit(1), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)),
			).Commit()
			return err
		}); err != nil {
			return 0, err
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			var pin Pin
			if err := json.Unmarshal(kvs[0].Value, &pin); err != nil || pin.Max < 1 {
				return 0, fmt.Errorf("%w: the pinned max-unavailable of %s is unreadable: %q", budget.ErrRefused, p.key, kvs[0].Value)
			}
			if pin.Spec != m.String() {
				return 0, fmt.Errorf("%w: %s's rollout runs with max-unavailable %s (resolved to %d by %s), this machine asks for %s: every machine must use the same",
					budget.ErrRefused, p.key, pin.Spec, pin.Max, pin.By, m)
			}
			p.keepPin(clientv3.LeaseID(kvs[0].Lease))
			return pin.Max, nil
		}
		n := int(resp.Responses[1].GetResponseRange().Count)
		pin := Pin{Spec: m.String(), Max: m.Of(n), Participants: n, By: b.cfg.Holder, Since: time.Now().UTC()}
		var first entry
		if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) == 1 && json.Unmarshal(kvs[0].Value, &first) == nil && first.Max > 0 {
			// No pin, but machines are in the queue with the Max the
			// rollout resolved: its pin was lost (every participant cut
			// off for a TTL). Pin that Max again, never a new count over
			// whoever is registered now (machines with two Maxes would be
			// refused).
			pin.Max = first.Max
		} else if left := joinPeriod - time.Since(p.joined); left > 0 {
			// Within the join period: wait for a pin, or its end.
			if err := b.watchPut(ctx, pk, resp.Header.Revision+1, left); err != nil {
				return 0, err
			}
			continue
		}
		val, _ := json.Marshal(pin)
		var lease *clientv3.LeaseGrantResponse
		if err := b.retryControl(ctx, what, func(actx context.Context) (err error) {
			lease, err = b.leases(actx).Grant(actx, int64(b.cfg.TTL/time.Second))
			return err
		}); err != nil {
			return 0, err
		}
		var put *clientv3.TxnResponse
		if err := b.retryControl(ctx, what, func(actx context.Context) (err error) {
			// Pinned by this lease already (a retry after a lost answer)
			// or by nobody: put; else another machine pinned it first.
			put, err = b.kv(actx).Txn(actx).
				If(clientv3.Compare(clientv3.CreateRevision(pk), "=", 0)).
				Then(clientv3.OpPut(pk, string(val), clientv3.WithLease(lease.ID))).
				Else(clientv3.OpGet(pk)).Commit()
			return err
		}); err != nil {
			return 0, err
		}
		mine := put.Succeeded
		if !mine {
			kvs := put.Responses[0].GetResponseRange().Kvs
			mine = len(kvs) == 1 && kvs[0].Lease == int64(lease.ID) // our put, its answer lost
		}
		if mine {
			b.cfg.Logger.Info("max-unavailable resolved", "key", p.key, "spec", pin.Spec, "participants", n, "max", pin.Max)
			p.keepPin(lease.ID)
			return pin.Max, nil
		}
		// Another machine pinned it first: use theirs. An unused lease
		// expires within TTL.
		rctx, cancel := context.WithTimeout(ctx, b.controlAttempt())
		_ = b.revokeOnce(rctx, lease.ID)
		cancel()
	}
}

// watchPut returns once key is put at or after rev, d passed, or the
// watch fails (the caller reads again), or ctx's cause once it ends.
func (b *Budget) watchPut(ctx context.Context, key string, rev int64, d time.Duration) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := b.cfg.Client.Watch(wctx, key, clientv3.WithRev(rev), clientv3.WithFilterDelete())
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	case wr, ok := <-wch:
		if !ok || wr.Err() != nil {
			return sleep(ctx, 100*time.Millisecond)
		}
		return nil
	}
}

func (p *Participation) keepPin(id clientv3.LeaseID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pin == id {
		return
	}
	p.pin = id
	select {
	case <-p.pinCh:
	default:
	}
	p.pinCh <- id
}

// Close ends the participation: it stops the keep-alives and revokes its
// lease (bounded by the budget's Attempt-sized timeout: if etcd does not
// answer, the lease expires within TTL; one already gone is left). The
// pin's lease is left to the other participants, or to expire.
func (p *Participation) Close() error {
	p.cancel()
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), min(p.b.cfg.TTL, 2*time.Second))
	defer cancel()
	err := p.b.revokeOnce(ctx, p.lease)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !isLeaseGone(err) {
		return unavailable("leaving the rollout of "+p.key, err)
	}
	return nil
}
