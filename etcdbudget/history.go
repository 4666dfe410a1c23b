package etcdbudget

// A key's history and its halt (budget.Recorder, budget.Historian). The
// records live beside the key's other records (control.go's layout):
//
//	PREFIX KEY#history/SEQ     one record (budget.Record, SEQ as %020d so that
//	                           etcd's key order is SEQ's), no lease
//	PREFIX KEY#history-head    the last SEQ, the failed acts counted since
//	                           the key's last ready act or resume, and the
//	                           IDs of the key's last acts (recentIDs)
//
// Every write of the history (Record, Pause, Resume) reads the head and
// writes it again in one transaction conditional on the head's mod
// revision, so writers of one key are serialised (a writer that lost the
// race reads again), and a halt is written in the same transaction as the
// failure that reaches Config.HaltAfter.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/budget"
)

var (
	_ budget.Recorder  = (*slot)(nil)
	_ budget.Historian = (*Budget)(nil)
)

func (b *Budget) historyDir(key string) string  { return b.cfg.Prefix + key + "#history/" }
func (b *Budget) historyHead(key string) string { return b.cfg.Prefix + key + "#history-head" }
func (b *Budget) historyKey(key string, seq int64) string {
	return fmt.Sprintf("%s%020d", b.historyDir(key), seq)
}

// historyHead is the value of a key's history head.
type historyHead struct {
	// Seq is the last record's sequence number.
	Seq int64 `json:"seq"`
	// Failures counts the failed acts since the key's last ready act or
	// resume.
	Failures int `json:"failures"`
	// IDs are the budget.Act IDs of the key's last recentIDs acts,
	// oldest first: a Record of one of them appends nothing, even once
	// retention removed its record (HistoryLimit 1, other writers).
	IDs []string `json:"ids,omitempty"`
}

// recentIDs is how many act IDs the history head keeps.
const recentIDs = 16

// withIDs is ids with those of recs' acts appended, the last recentIDs of
// them kept (a new slice: ids is not modified).
func withIDs(ids []string, recs []historyValue) []string {
	out := slices.Clone(ids)
	for _, r := range recs {
		if r.Kind == budget.RecordAct && r.Act != nil && r.Act.ID != "" {
			out = append(out, r.Act.ID)
		}
	}
	if n := len(out) - recentIDs; n > 0 {
		out = slices.Delete(out, 0, n)
	}
	return out
}

// historyValue is a history record as stored: the record and, for a
// budget.RecordHalted record, the ID of the act whose failure halted the
// key (older versions stored the token of the Record call in its act's
// record too).
type historyValue struct {
	budget.Record
	Token string `json:"token,omitempty"`
}

// writtenBy reports whether v was written by a Record of the act id.
func (v historyValue) writtenBy(id string) bool {
	return v.Token == id || v.Act != nil && v.Act.ID == id
}

// historyState is what a history write reads first.
type historyState struct {
	head    historyHead
	headRev int64            // the head's mod revision (0: none)
	pause   *mvccpb.KeyValue // the key's own pause record (nil: none)
	oldest  []*mvccpb.KeyValue
	since   []*mvccpb.KeyValue // the records after the seq asked for
}

// oldestBatch is how many of the oldest records each append reads, to
// remove those older than Config.HistoryAge: more than it appends, so a
// backlog shrinks.
const oldestBatch = 8

// readHistory reads key's history head (its SEQ the greater of the head's
// and the last record's, should the head be gone), its pause record, its
// oldest records and, when after >= 0, its records after the SEQ after.
// It sends range requests only (no transaction: a write is the only
// transaction a history write sends), the later ones at the first one's
// revision.
func (b *Budget) readHistory(actx context.Context, key string, after int64) (historyState, error) {
	var st historyState
	kv := b.kv(actx)
	resp, err := kv.Get(actx, b.historyHead(key))
	if err != nil {
		return st, err
	}
	rev := clientv3.WithRev(resp.Header.Revision)
	if len(resp.Kvs) == 1 {
		if err := json.Unmarshal(resp.Kvs[0].Value, &st.head); err != nil {
			return st, refused("reading the history of "+key, fmt.Errorf("its head %s is unreadable: %v", resp.Kvs[0].Key, err))
		}
		st.headRev = resp.Kvs[0].ModRevision
	}
	dir := b.historyDir(key)
	end := clientv3.WithRange(clientv3.GetPrefixRangeEnd(dir))
	last, err := kv.Get(actx, dir, end, rev, clientv3.WithKeysOnly(), clientv3.WithLimit(1), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		return st, err
	}
	if len(last.Kvs) == 1 {
		st.head.Seq = max(st.head.Seq, seqOf(string(last.Kvs[0].Key)))
	}
	p, err := kv.Get(actx, b.pauseKey(key), rev)
	if err != nil {
		return st, err
	}
	if len(p.Kvs) == 1 {
		st.pause = p.Kvs[0]
	}
	if b.cfg.HistoryAge > 0 {
		old, err := kv.Get(actx, dir, end, rev, clientv3.WithLimit(oldestBatch), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
		if err != nil {
			return st, err
		}
		st.oldest = old.Kvs
	}
	if after >= 0 {
		since, err := kv.Get(actx, b.historyKey(key, after+1), end, rev)
		if err != nil {
			return st, err
		}
		st.since = since.Kvs
	}
	return st, nil
}

// seqOf is the SEQ of a history record's etcd key (0: not one).
func seqOf(k string) int64 {
	i := strings.LastIndexByte(k, '/')
	n, _ := strconv.ParseInt(k[i+1:], 10, 64)
	return n
}

// appending returns the operations that append recs after st's head (their
// Seq and Time set here), write the new head (with failures, and the IDs
// of st's head and of recs' acts: withIDs) and apply retention: the
// records beyond Config.HistoryLimit and those of st's oldest older than
// Config.HistoryAge are removed (recs beyond Config.HistoryLimit are not
// written at all).
func (b *Budget) appending(key string, st historyState, failures int, now time.Time, recs ...historyValue) []clientv3.Op {
	var ops []clientv3.Op
	last := st.head.Seq + int64(len(recs))
	// The first SEQ kept: recs before it are not written (etcd refuses a
	// transaction that writes a key it deletes: HistoryLimit 1, a halt).
	first := last - int64(b.cfg.HistoryLimit) + 1
	for i, r := range recs {
		seq := st.head.Seq + 1 + int64(i)
		if seq < first {
			continue
		}
		r.Seq, r.Time = seq, now
		val, _ := json.Marshal(r)
		ops = append(ops, clientv3.OpPut(b.historyKey(key, seq), string(val)))
	}
	head, _ := json.Marshal(historyHead{Seq: last, Failures: failures, IDs: withIDs(st.head.IDs, recs)})
	ops = append(ops, clientv3.OpPut(b.historyHead(key), string(head)))
	if first > 1 {
		ops = append(ops, clientv3.OpDelete(b.historyDir(key), clientv3.WithRange(b.historyKey(key, first))))
	}
	if b.cfg.HistoryAge > 0 {
		cutoff := now.Add(-b.cfg.HistoryAge)
		for _, kv := range st.oldest {
			var v historyValue
			if json.Unmarshal(kv.Value, &v) == nil && !v.Time.IsZero() && v.Time.Before(cutoff) {
				ops = append(ops, clientv3.OpDelete(string(kv.Key)))
			}
		}
	}
	return ops
}

// pauseOf decodes a pause record (nil: none).
func pauseOf(kv *mvccpb.KeyValue) *PauseRecord {
	if kv == nil {
		return nil
	}
	var p PauseRecord
	if json.Unmarshal(kv.Value, &p) != nil {
		p.By = "?"
	}
	return &p
}

// haltOf is the halt of a pause record, nil when it is none or a pause
// an operator set.
func haltOf(kv *mvccpb.KeyValue) *budget.Halt {
	if p := pauseOf(kv); p != nil {
		return p.Halt
	}
	return nil
}

func newToken() string {
	var t [16]byte
	_, _ = rand.Read(t[:])
	return hex.EncodeToString(t[:])
}

// Record appends act to the key's history and, when act failed and the
// key's failed acts since its last ready act or resume reach
// Config.HaltAfter, halts the key in the same etcd transaction: it writes
// the key's pause record (no lease: it survives this process) carrying the
// budget.Halt, and a budget.RecordHalted record after the act, unless the
// key is halted already (see budget.Recorder). A key an operator paused is
// halted all the same: its pause record becomes the halt (the operator's
// By, Since and Reason kept, the Halt set), written again so that it has a
// new revision, and a Resume that read the pause lifts nothing (it lifts
// the revision it read). It returns the key's halt when the key is halted
// after the write (also when it was halted before), nil otherwise.
// Concurrent Records of one key are serialised by the history's head. A
// Record of an act ID already recorded for the key (budget.Act.ID; empty:
// Record makes one) appends nothing and counts nothing again: the head
// keeps the IDs of the key's last recentIDs acts, whatever retention
// removed, and a retry after a lost answer also finds its record among
// those written since its first read. Record times are this machine's
// clock (etcd has none), for people. Requests are retried while etcd is
// unreachable, within ctx and Config.Unreachable.
func (s *slot) Record(ctx context.Context, act budget.Act) (*budget.Halt, error) {
	h, _, err := s.b.record(ctx, s.key, act)
	return h, err
}

// record is Record for key; halted reports whether this call halted it.
func (b *Budget) record(ctx context.Context, key string, act budget.Act) (h *budget.Halt, halted bool, err error) {
	act.Key = key
	if act.Holder == "" {
		act.Holder = b.cfg.Holder
	}
	if act.ID == "" {
		act.ID = newToken()
	}
	id := act.ID
	what := "recording the act of " + key
	out := &outage{bound: b.cfg.Unreachable}
	after := int64(-1) // the head's SEQ at the first read: a record of ours is after it
	pk, hk := b.pauseKey(key), b.historyHead(key)
	for {
		var st historyState
		err := b.call(ctx, out, what, func(actx context.Context) (err error) {
			st, err = b.readHistory(actx, key, after)
			return err
		})
		if err != nil {
			return nil, false, fmt.Errorf("etcdbudget: %s: %w", what, err)
		}
		if after < 0 {
			after = st.head.Seq
		}
		// Recorded already: by an attempt of this call whose answer was
		// lost (its records are after the first read's SEQ, unless
		// retention removed them), or by an earlier call (the head's IDs).
		recorded, haltedHere := slices.Contains(st.head.IDs, id), false
		for _, kv := range st.since {
			var v historyValue
			if json.Unmarshal(kv.Value, &v) == nil && v.writtenBy(id) {
				recorded = true
				haltedHere = haltedHere || v.Kind == budget.RecordHalted
			}
		}
		if recorded {
			return haltOf(st.pause), haltedHere, nil
		}
		now := time.Now().UTC()
		failures, halts := budget.FailuresAfter(st.head.Failures, act, b.cfg.HaltAfter)
		h = haltOf(st.pause)
		halting := halts && h == nil
		recs := []historyValue{{Record: budget.Record{Kind: budget.RecordAct, Act: &act}}}
		var ops []clientv3.Op
		if halting {
			h = &budget.Halt{Key: key, Machine: act.Machine, Holder: act.Holder, Action: act.Action, Services: act.Services, Change: act.Change,
				Reason: act.Reason, Failures: failures, Since: now}
			recs = append(recs, historyValue{Record: budget.Record{Kind: budget.RecordHalted, Halt: h}, Token: id})
			rec := PauseRecord{By: act.Holder, Since: now, Reason: "halted: " + HaltSummary(*h), Halt: h}
			if p := pauseOf(st.pause); p != nil {
				// An operator's pause becomes the halt, under a new
				// revision: a Resume that read the pause lifts nothing.
				rec = *p
				rec.Halt = h
			}
			val, _ := json.Marshal(rec)
			ops = append(ops, clientv3.OpPut(pk, string(val)))
		}
		ops = append(ops, b.appending(key, st, failures, now, recs...)...)
		var pauseRev int64
		if st.pause != nil {
			pauseRev = st.pause.ModRevision
		}
		var ok bool
		err = b.call(ctx, out, what, func(actx context.Context) error {
			resp, err := b.kv(actx).Txn(actx).
				If(clientv3.Compare(clientv3.ModRevision(hk), "=", st.headRev), clientv3.Compare(clientv3.ModRevision(pk), "=", pauseRev)).
				Then(ops...).Commit()
			if err == nil {
				ok = resp.Succeeded
			}
			return err
		})
		if err != nil {
			return nil, false, fmt.Errorf("etcdbudget: %s: %w", what, err)
		}
		if ok {
			if halting {
				b.cfg.Logger.Warn("key halted: no machine acts on it until it is resumed", "key", key, "halt", HaltSummary(*h),
					"failures", failures, "resume", "snapsvc-rollout resume "+key)
			}
			return h, halting, nil
		}
		// Another writer of the key's history (or of its pause) came
		// first, or a lost answer of ours: read again.
	}
}

// HaltSummary renders a halt for people: "node-1's restart of
// k8s.kubelet (change 42): not ready within 5m0s".
func HaltSummary(h budget.Halt) string {
	who := h.Machine
	if who == "" {
		who = h.Holder
	}
	what := h.Action
	if what == "" {
		what = "restart"
	}
	msg := fmt.Sprintf("%s's %s of %s", who, what, strings.Join(h.Services, ", "))
	if h.Change != "" {
		msg += " (change " + h.Change + ")"
	}
	if h.Reason != "" {
		msg += ": " + h.Reason
	}
	return msg
}

// ResumeCommand is the command that lifts key's halt or pause.
func ResumeCommand(key string) string { return "snapsvc-rollout resume " + key }

// HaltedError is the error of a Fence or an Acquire held back by a halted
// key until its context ended: it wraps budget.ErrPaused, budget.ErrHalted
// and the context's cause, and names the halt and the command that lifts
// it.
type HaltedError struct {
	// Key is the key whose halt held the holder back (the key itself, or
	// a key it is a part of).
	Key string
	// Halt is the halt.
	Halt budget.Halt
	// Err is why the wait ended (the context's cause).
	Err error
}

func (e *HaltedError) Error() string {
	return fmt.Sprintf("%v: %v: %s halted after %d failed restart(s) since %s: %s; resume with: %s: %v", budget.ErrPaused, budget.ErrHalted,
		e.Key, e.Halt.Failures, e.Halt.Since.Format(time.RFC3339), HaltSummary(e.Halt), ResumeCommand(e.Key), e.Err)
}

// Unwrap returns budget.ErrPaused, budget.ErrHalted and the cause.
func (e *HaltedError) Unwrap() []error { return []error{budget.ErrPaused, budget.ErrHalted, e.Err} }

// historyPage is how many records History reads per request when it
// reads them all.
const historyPage = 2000

// History returns key's last limit history records (all that are kept
// when limit <= 0), oldest first (see budget.Historian): its acts, halts,
// pauses and resumes. It reads at one revision, linearizably, retried
// as Status is while etcd is unreachable.
func (b *Budget) History(ctx context.Context, key string, limit int) ([]budget.Record, error) {
	key, err := controlKey(key)
	if err != nil {
		return nil, err
	}
	dir := b.historyDir(key)
	end := clientv3.GetPrefixRangeEnd(dir)
	var out []budget.Record
	err = b.retryControl(ctx, "reading the history of "+key, func(actx context.Context) error {
		out = []budget.Record{}
		if limit > 0 {
			resp, err := b.kv(actx).Get(actx, dir, clientv3.WithRange(end), clientv3.WithLimit(int64(limit)),
				clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
			if err != nil {
				return err
			}
			for _, kv := range resp.Kvs {
				out = append(out, recordOf(kv))
			}
			slices.Reverse(out)
			return nil
		}
		// Pages at the first one's revision, each decoded beside the
		// request for the next (decoding is most of the cost).
		from := dir
		var rev int64
		var pages [][]budget.Record
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(historyPage), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}
			if rev > 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			resp, err := b.kv(actx).Get(actx, from, opts...)
			if err != nil {
				return err
			}
			rev = resp.Header.Revision
			page := make([]budget.Record, len(resp.Kvs))
			pages = append(pages, page)
			wg.Go(func() {
				for i, kv := range resp.Kvs {
					page[i] = recordOf(kv)
				}
			})
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		wg.Wait()
		out = slices.Concat(pages...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// recordOf decodes a history record; one that cannot be read keeps its
// SEQ and says so.
func recordOf(kv *mvccpb.KeyValue) budget.Record {
	var v historyValue
	if err := json.Unmarshal(kv.Value, &v); err != nil {
		return budget.Record{Seq: seqOf(string(kv.Key)), Reason: "unreadable record: " + err.Error()}
	}
	v.Seq = seqOf(string(kv.Key))
	return v.Record
}
