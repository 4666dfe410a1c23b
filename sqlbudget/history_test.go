package sqlbudget_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/sqlbudget"
)

// failedAct is a failed restart of key's service by machine, change id.
func failedAct(machine, change string) budget.Act {
	return budget.Act{Holder: machine + " pid 1", Machine: machine, Action: "restart", Services: []string{"svc.daemon"}, Change: change,
		Spawn: time.Date(2026, 12, 6, 5, 0, 0, 123456789, time.UTC), Ready: time.Date(2026, 12, 6, 5, 0, 1, 987654321, time.UTC),
		Outcome: budget.OutcomeFailed, Reason: "svc.daemon not ready within 30s", Waited: 1500 * time.Microsecond, Held: 31 * time.Second}
}

func readyAct(machine, change string) budget.Act {
	a := failedAct(machine, change)
	a.Outcome, a.Reason = budget.OutcomeReady, ""
	return a
}

func acquire(t *testing.T, ctx context.Context, b *sqlbudget.Budget, key string) budget.Slot {
	t.Helper()
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func record(t *testing.T, ctx context.Context, s budget.Slot, act budget.Act) *budget.Halt {
	t.Helper()
	h, err := s.(budget.Recorder).Record(ctx, act)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func kinds(recs []budget.Record) string {
	var out []string
	for _, r := range recs {
		k := string(r.Kind)
		if r.Act != nil {
			k += ":" + string(r.Act.Outcome)
		}
		out = append(out, k)
	}
	return strings.Join(out, " ")
}

func history(t *testing.T, ctx context.Context, b *sqlbudget.Budget, key string, limit int) []budget.Record {
	t.Helper()
	recs, err := b.History(ctx, key, limit)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// eventLog collects a Budget's events.
type eventLog struct {
	mu     sync.Mutex
	evs    []sqlbudget.Event
	paused chan struct{} // one send per "paused" event
}

func newEventLog() *eventLog { return &eventLog{paused: make(chan struct{}, 16)} }

func (l *eventLog) on(ev sqlbudget.Event) {
	l.mu.Lock()
	l.evs = append(l.evs, ev)
	l.mu.Unlock()
	if ev.Kind == sqlbudget.EventPaused {
		select {
		case l.paused <- struct{}{}:
		default:
		}
	}
}

func (l *eventLog) count(kind string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ev := range l.evs {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// HaltAfter 1 (the default): the first failed act halts its key, in the
// write that records it. The halt names the machine, services, change
// and reason, shows in Status and Keys, in the history (the act, then the
// halt, with the act's times as given), as events and metrics; the
// halting holder's Fence then waits, and so does every other machine's.
func TestHaltAtFirstFailure(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	log := newEventLog()
	a := newBudget(t, sqlbudget.DBTx(db), "node-1 pid 1", func(c *sqlbudget.Config) { c.OnEvent = log.on })
	op := newBudget(t, sqlbudget.DBTx(db), "operator")
	const key = "svc.daemon"
	s := acquire(t, ctx, a, key)
	if _, err := s.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatal(err)
	}
	act := failedAct("node-1", "42")
	h := record(t, ctx, s, act)
	if h == nil || h.Key != key || h.Machine != "node-1" || h.Change != "42" || h.Reason != act.Reason || h.Failures != 1 ||
		len(h.Services) != 1 || h.Services[0] != "svc.daemon" || h.Holder != act.Holder || h.Since.IsZero() {
		t.Fatalf("Record of a failed act, HaltAfter 1: halt %+v; want the act's machine, change, services and reason, 1 failure", h)
	}
	st, err := op.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Halt == nil || st.Halt.Change != "42" || st.Paused == nil || st.Paused.Halt == nil ||
		!strings.Contains(st.Paused.Reason, "node-1's restart of svc.daemon (change 42): svc.daemon not ready") || st.Paused.By != act.Holder {
		t.Fatalf("status of the halted key: halt %+v, pause %+v", st.Halt, st.Paused)
	}
	keys, err := op.Keys(ctx)
	if err != nil || len(keys) != 1 || keys[0] != key {
		t.Fatalf("Keys: %v %v; want [%s] (the halted key)", keys, err, key)
	}
	recs := history(t, ctx, op, key, 0)
	if kinds(recs) != "act:failed halted" {
		t.Fatalf("history: %s; want the failed act, then the halt", kinds(recs))
	}
	got := recs[0].Act
	if got.Change != "42" || !got.Spawn.Equal(act.Spawn) || !got.Ready.Equal(act.Ready) || got.Waited != act.Waited || got.Held != act.Held ||
		got.Machine != "node-1" || got.Holder != act.Holder || got.Key != key || got.Action != "restart" || got.Reason != act.Reason ||
		recs[1].Halt == nil || recs[1].Halt.Change != "42" || recs[0].Seq >= recs[1].Seq || recs[0].Time.IsZero() {
		t.Fatalf("history records: %+v %+v; want the act as recorded, then its halt", *got, recs[1])
	}
	// A holder already halted, recording again: the halt stands (once).
	if h := record(t, ctx, s, failedAct("node-1", "43")); h == nil || h.Change != "42" {
		t.Fatalf("a second failure of a halted key: halt %+v; want the first halt", h)
	}
	if kinds(history(t, ctx, op, key, 0)) != "act:failed halted act:failed" {
		t.Fatalf("history after a failure while halted: %s", kinds(history(t, ctx, op, key, 0)))
	}
	m := a.Metrics()
	if m.Records != 2 || m.Halts != 1 || log.count(sqlbudget.EventRecorded) != 2 || log.count(sqlbudget.EventHalted) != 1 {
		t.Errorf("metrics Records %d Halts %d, events recorded %d halted %d; want 2, 1, 2, 1", m.Records, m.Halts,
			log.count(sqlbudget.EventRecorded), log.count(sqlbudget.EventHalted))
	}
	s.Release(ctx)

	// Another machine takes the slot: it may not act while halted.
	b := newBudget(t, sqlbudget.DBTx(db), "node-2 pid 1")
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(short, key, nil)
	if !errors.Is(err, budget.ErrHalted) || !errors.Is(err, budget.ErrPaused) {
		t.Fatalf("Acquire of a halted key: %v; want ErrHalted and ErrPaused", err)
	}
}

// HaltAfter 2: a ready act between two failures ends the run (no halt);
// an abandoned act neither counts nor ends it; two failures in a row
// halt.
func TestHaltAfterTwoCountsTheRun(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	a := newBudget(t, sqlbudget.DBTx(db), "node-1", func(c *sqlbudget.Config) { c.HaltAfter = 2 })
	const key = "svc.daemon"
	s := acquire(t, ctx, a, key)
	defer s.Release(ctx)
	steps := []struct {
		act  budget.Act
		halt bool
	}{
		{failedAct("node-1", "1"), false},
		{readyAct("node-1", "2"), false},
		{failedAct("node-1", "3"), false},
		{func() budget.Act { a := failedAct("node-1", "4"); a.Outcome = budget.OutcomeAbandoned; return a }(), false},
		{failedAct("node-1", "5"), true},
	}
	for i, st := range steps {
		h := record(t, ctx, s, st.act)
		if (h != nil) != st.halt {
			t.Fatalf("step %d (%s, change %s): halt %+v, want halted %v", i, st.act.Outcome, st.act.Change, h, st.halt)
		}
		if h != nil && (h.Change != "5" || h.Failures != 2) {
			t.Fatalf("halt %+v; want change 5, 2 failures", h)
		}
	}
	if got := kinds(history(t, ctx, a, key, 0)); got != "act:failed act:ready act:failed act:abandoned act:failed halted" {
		t.Fatalf("history: %s", got)
	}
	// A negative HaltAfter never halts: history only.
	never := newBudget(t, sqlbudget.DBTx(db), "node-2", func(c *sqlbudget.Config) { c.HaltAfter = -1 })
	ns := acquire(t, ctx, never, "other")
	defer ns.Release(ctx)
	for i := range 3 {
		if h := record(t, ctx, ns, failedAct("node-2", fmt.Sprint(i))); h != nil {
			t.Fatalf("HaltAfter -1: halt %+v", h)
		}
	}
}

// Two participants record a failure at once (HaltAfter 2, Max 2):
// exactly one halt, both acts recorded once, even with every other
// commit's answer lost (the transactions run again).
func TestConcurrentFailuresHaltOnce(t *testing.T) {
	for _, lossy := range []bool{false, true} {
		t.Run(fmt.Sprintf("lossy=%v", lossy), func(t *testing.T) {
			ctx := ctxT(t, time.Minute)
			_, db := tempDB(t)
			var lost atomic.Int64
			tx := func() sqlbudget.TxFunc {
				if lossy {
					return lossyTx(db, &lost)
				}
				return sqlbudget.DBTx(db)
			}
			const key = "svc.daemon"
			var ps []*sqlbudget.Budget
			var slots []budget.Slot
			for i := range 2 {
				b := newBudget(t, tx(), fmt.Sprintf("node-%d", i+1), func(c *sqlbudget.Config) { c.HaltAfter, c.Max = 2, 2 })
				ps = append(ps, b)
				slots = append(slots, acquire(t, ctx, b, key))
			}
			var wg sync.WaitGroup
			halts := make([]*budget.Halt, 2)
			errs := make([]error, 2)
			start := make(chan struct{})
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					halts[i], errs[i] = slots[i].(budget.Recorder).Record(ctx, failedAct(fmt.Sprintf("node-%d", i+1), fmt.Sprint(i+1)))
				}()
			}
			close(start)
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			recs := history(t, ctx, ps[0], key, 0)
			if got := kinds(recs); got != "act:failed act:failed halted" {
				t.Fatalf("history: %s; want both acts once, then one halt", got)
			}
			second := recs[1].Act.Change
			if recs[2].Halt.Change != second || recs[2].Halt.Failures != 2 {
				t.Errorf("halt %+v; want the second act's (change %s), 2 failures", recs[2].Halt, second)
			}
			if ps[0].Metrics().Halts+ps[1].Metrics().Halts != 1 {
				t.Errorf("halts written: %d + %d, want 1", ps[0].Metrics().Halts, ps[1].Metrics().Halts)
			}
			// The one recorded last learns of the halt.
			last := halts[0]
			if recs[1].Act.Change == "2" {
				last = halts[1]
			}
			if last == nil || last.Change != second {
				t.Errorf("the second Record's answer: %+v; want the halt", last)
			}
			for _, s := range slots {
				s.Release(ctx)
			}
			t.Logf("%d commits' answers lost", lost.Load())
		})
	}
}

// A Record repeated by its caller (its answer lost) appends the act once
// and counts it once: the act's ID, whatever the slot and whatever the
// caller measured again; acts without an ID are one per Record call.
func TestRecordRepeatedAppendsOnce(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	b := newBudget(t, sqlbudget.DBTx(db), "node-1", func(c *sqlbudget.Config) { c.HaltAfter = 3 })
	const key = "svc.daemon"
	s := acquire(t, ctx, b, key)
	act := failedAct("node-1", "7")
	act.ID = "act-7"
	for range 3 {
		if h := record(t, ctx, s, act); h != nil {
			t.Fatalf("the same failed act recorded 3 times halted the key (HaltAfter 3): %+v", h)
		}
	}
	// Waited and Held measured again by the caller's retry: the same act.
	again := act
	again.Held += time.Second
	record(t, ctx, s, again)
	if got := kinds(history(t, ctx, b, key, 0)); got != "act:failed" {
		t.Fatalf("history after 4 Records of one act: %s; want it once", got)
	}
	s.Release(ctx)
	s2 := acquire(t, ctx, b, key)
	defer s2.Release(ctx)
	// The same ID by another hold: still that act.
	if h := record(t, ctx, s2, act); h != nil {
		t.Fatalf("the act recorded again by a second hold halted the key: %+v", h)
	}
	// Without an ID, each Record call is an act of its own.
	noID := act
	noID.ID = ""
	record(t, ctx, s2, noID)
	if h := record(t, ctx, s2, noID); h == nil || h.Failures != 3 {
		t.Fatalf("two acts without an ID after one with: halt %+v; want 3 failures, halted", h)
	}
	if got := kinds(history(t, ctx, b, key, 0)); got != "act:failed act:failed act:failed halted" {
		t.Fatalf("history: %s; want three acts, then the halt", got)
	}
	if m := b.Metrics(); m.Records != 3 {
		t.Errorf("Metrics.Records %d, want 3", m.Records)
	}
}

// Two failed acts of one slot alike in every field but their IDs (a kept
// slot, no change id known) are two failures: HaltAfter 2 halts. Records
// without IDs, with every other commit's answer lost, count once each.
func TestRecordDistinctIDsCount(t *testing.T) {
	for _, lossy := range []bool{false, true} {
		t.Run(fmt.Sprintf("lossy=%v", lossy), func(t *testing.T) {
			ctx := ctxT(t, time.Minute)
			_, db := tempDB(t)
			var lost atomic.Int64
			tx := sqlbudget.DBTx(db)
			if lossy {
				tx = lossyTx(db, &lost)
			}
			b := newBudget(t, tx, "node-1", func(c *sqlbudget.Config) { c.HaltAfter = 2 })
			const key = "svc.daemon"
			s := acquire(t, ctx, b, key)
			defer s.Release(ctx)
			first, second := failedAct("node-1", ""), failedAct("node-1", "")
			if lossy {
				first.ID, second.ID = "", "" // the backend's own, one per call
			} else {
				first.ID, second.ID = "a", "b"
			}
			if h := record(t, ctx, s, first); h != nil {
				t.Fatalf("first failure, HaltAfter 2: halt %+v", h)
			}
			if h := record(t, ctx, s, second); h == nil || h.Failures != 2 {
				t.Fatalf("second failure (another act, the same fields), HaltAfter 2: halt %+v; want halted after 2", h)
			}
			if got := kinds(history(t, ctx, b, key, 0)); got != "act:failed act:failed halted" {
				t.Fatalf("history: %s", got)
			}
			if m := b.Metrics(); m.Records != 2 || m.Halts != 1 {
				t.Errorf("Metrics Records %d Halts %d, want 2, 1", m.Records, m.Halts)
			}
		})
	}
}

// An act's ID is recognised after retention removed its record: with
// HistoryLimit 1 the halt's record removes the failed act's in the
// transaction that halts, yet that transaction retried after its
// commit's answer was lost, and the caller's retry a while later, append
// and count nothing.
func TestRecordIDOutlivesRetention(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	var lost atomic.Int64
	b := newBudget(t, lossyTx(db, &lost), "node-1", func(c *sqlbudget.Config) { c.HistoryLimit, c.HaltAfter = 1, 2 })
	op := newBudget(t, sqlbudget.DBTx(db), "operator")
	const key = "svc.daemon"
	s := acquire(t, ctx, b, key)
	defer s.Release(ctx)
	one, two := failedAct("node-1", "1"), failedAct("node-1", "2")
	one.ID, two.ID = "one", "two"
	record(t, ctx, s, one)
	if h := record(t, ctx, s, two); h == nil || h.Failures != 2 || h.Change != "2" {
		t.Fatalf("two failures, HaltAfter 2: halt %+v", h)
	}
	if got := kinds(history(t, ctx, op, key, 0)); got != "halted" {
		t.Fatalf("history, HistoryLimit 1: %s; want the halt only", got)
	}
	if was, err := op.Resume(ctx, key); err != nil || !was {
		t.Fatalf("Resume: %v %v", was, err)
	}
	// Both acts recorded again (their records gone): nothing appended,
	// nothing counted.
	for _, a := range []budget.Act{one, two, two} {
		if h := record(t, ctx, s, a); h != nil {
			t.Fatalf("act %s recorded again after its record was trimmed: halt %+v", a.ID, h)
		}
	}
	recs := history(t, ctx, op, key, 0)
	if kinds(recs) != "halted resumed" { // the operator's Budget keeps 1000
		t.Fatalf("history after the acts were recorded again: %s; want the halt and the resume only", kinds(recs))
	}
	if m := b.Metrics(); m.Records != 2 || m.Halts != 1 {
		t.Errorf("Metrics Records %d Halts %d, want 2, 1", m.Records, m.Halts)
	}
	// Counted afresh: one new failure after the resume does not halt.
	three := failedAct("node-1", "3")
	three.ID = "three"
	if h := record(t, ctx, s, three); h != nil {
		t.Fatalf("one failure after the resume, HaltAfter 2: halt %+v", h)
	}
}

// An operator pauses a key; a failed act reaches the threshold meanwhile:
// the pause becomes the halt (the operator's by and reason kept), so a
// Resume that read the pause before the failure lifts nothing and the
// key stays halted; a fresh Resume lifts the halt, and the failures are
// counted afresh after it.
func TestPauseThenFailureHalts(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	b := newBudget(t, sqlbudget.DBTx(db), "node-1", func(c *sqlbudget.Config) { c.HaltAfter = 1 })
	op := newBudget(t, sqlbudget.DBTx(db), "operator")
	const key = "svc.daemon"
	s := acquire(t, ctx, b, key)
	defer s.Release(ctx)
	if _, err := op.Pause(ctx, key, "maintenance"); err != nil {
		t.Fatal(err)
	}
	// A Resume whose first attempt reads the pause and fails before its
	// commit; the failure is recorded before its retry.
	halted := false
	var h *budget.Halt
	attempts := 0
	failing := func(ctx context.Context, f func(context.Context, *sql.Tx) error) error {
		attempts++
		if attempts > 1 {
			return sqlbudget.DBTx(db)(ctx, f)
		}
		err := sqlbudget.DBTx(db)(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if err := f(ctx, tx); err != nil {
				return err
			}
			return errors.New("test: the connection was lost before the commit")
		})
		h = record(t, ctx, s, failedAct("node-1", "9"))
		halted = h != nil
		return err
	}
	stale := newBudget(t, failing, "stale-operator")
	if _, err := stale.Resume(ctx, key); err != nil {
		t.Fatal(err)
	}
	if !halted || h.Change != "9" || h.Failures != 1 {
		t.Fatalf("a failure on a paused key, HaltAfter 1: halt %+v; want change 9's", h)
	}
	st, err := op.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Halt == nil || st.Halt.Change != "9" || st.Paused == nil || st.Paused.By != "operator" || st.Paused.Reason != "maintenance" {
		t.Fatalf("status after a Resume that read the pause before the failure: halt %+v, pause %+v; want the halt, on the operator's pause", st.Halt, st.Paused)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := s.(budget.Fencer).Fence(short); !errors.Is(err, budget.ErrHalted) || !strings.Contains(err.Error(), "change 9") {
		t.Fatalf("Fence after the stale Resume: %v; want ErrHalted naming change 9", err)
	}
	if got := kinds(history(t, ctx, op, key, 0)); got != "paused act:failed halted" {
		t.Fatalf("history: %s; want the pause, the failure, the halt (no resume)", got)
	}
	// A failure while halted: the halt stands, once.
	if h := record(t, ctx, s, failedAct("node-1", "10")); h == nil || h.Change != "9" {
		t.Fatalf("a failure while halted: %+v; want the first halt", h)
	}
	if was, err := op.Resume(ctx, key); err != nil || !was {
		t.Fatalf("Resume: %v %v", was, err)
	}
	if st, err := op.Status(ctx, key); err != nil || st.Paused != nil || st.Halt != nil {
		t.Fatalf("status after a fresh Resume: %+v %v; want neither paused nor halted", st, err)
	}
	recs := history(t, ctx, op, key, 0)
	if r := recs[len(recs)-1]; r.Kind != budget.RecordResumed || !strings.Contains(r.Reason, "lifted the halt") {
		t.Fatalf("last record %+v; want the resume lifting the halt", r)
	}
	if _, err := s.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatalf("Fence once resumed: %v", err)
	}
	// Counted afresh: the next failure halts with one failure, not three.
	if h := record(t, ctx, s, failedAct("node-1", "11")); h == nil || h.Change != "11" || h.Failures != 1 {
		t.Fatalf("a failure after the resume: halt %+v; want change 11's, 1 failure", h)
	}
}

// A Fence on a halted key waits, holding the slot (its row renewed), and
// returns once an operator resumes the key; when its context ends first
// its error wraps ErrPaused and ErrHalted, names the halt and says how to
// lift it. Failures are counted afresh after the resume.
func TestFenceWaitsOnHalt(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	log := newEventLog()
	b := newBudget(t, sqlbudget.DBTx(db), "node-1", func(c *sqlbudget.Config) { c.OnEvent = log.on; c.HaltAfter = 2 })
	op := newBudget(t, sqlbudget.DBTx(db), "operator")
	const key = "svc.daemon"
	s := acquire(t, ctx, b, key)
	defer s.Release(ctx)
	record(t, ctx, s, failedAct("node-1", "1"))
	if h := record(t, ctx, s, failedAct("node-1", "2")); h == nil {
		t.Fatal("2 failures, HaltAfter 2: no halt")
	}
	out := make(chan error, 1)
	go func() {
		_, err := s.(budget.Fencer).Fence(ctx)
		out <- err
	}()
	<-log.paused
	select {
	case err := <-out:
		t.Fatalf("Fence on a halted key returned %v before the resume", err)
	default:
	}
	if was, err := op.Resume(ctx, key); err != nil || !was {
		t.Fatalf("Resume: %v %v", was, err)
	}
	if err := <-out; err != nil {
		t.Fatalf("Fence once resumed: %v", err)
	}
	// Counted afresh: one failure after the resume does not halt (2).
	if h := record(t, ctx, s, failedAct("node-1", "3")); h != nil {
		t.Fatalf("one failure after the resume halted: %+v", h)
	}
	if h := record(t, ctx, s, failedAct("node-1", "4")); h == nil || h.Change != "4" {
		t.Fatalf("two failures after the resume: halt %+v, want change 4's", h)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err := s.(budget.Fencer).Fence(short)
	var he *sqlbudget.HaltedError
	if !errors.Is(err, budget.ErrPaused) || !errors.Is(err, budget.ErrHalted) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &he) {
		t.Fatalf("Fence on a halted key until its deadline: %v; want ErrPaused, ErrHalted and the deadline", err)
	}
	for _, want := range []string{"node-1", "svc.daemon", "change 4", "not ready within 30s", "Resume", "snapsvc-rollout resume " + key} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Fence's error %q does not name %q", err, want)
		}
	}
	if got := kinds(history(t, ctx, op, key, 0)); got != "act:failed act:failed halted resumed act:failed act:failed halted" {
		t.Errorf("history: %s", got)
	}
	recs := history(t, ctx, op, key, 0)
	if r := recs[3]; r.By != "operator" || !strings.Contains(r.Reason, "lifted the halt") {
		t.Errorf("resumed record: %+v; want by operator, lifting the halt", r)
	}
}

// A Resume whose answer was lost, tried again, never lifts a halt set
// after the one it lifted (the contract's resume-lifts-only-its-pause, with
// a halt): the holder's next failure halts the key again meanwhile.
func TestResumeLostAnswerKeepsLaterHalt(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	h := sqliteHarness(t, time.Second)
	p := h.NewParticipant(t, h.Config(optionsOf("node-1", 0)))
	const key = "svc.daemon"
	s := acquire(t, ctx, p.Budget, key)
	defer s.Release(ctx)
	if record(t, ctx, s, failedAct("node-1", "1")) == nil {
		t.Fatal("no halt")
	}
	rehalted := false
	h.ResumeLosingAnswer(t, key, func() {
		rehalted = record(t, ctx, s, failedAct("node-1", "2")) != nil
	})
	if !rehalted {
		t.Fatal("the failure recorded after the first resume took effect did not halt the key")
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := s.(budget.Fencer).Fence(short); !errors.Is(err, budget.ErrHalted) || !strings.Contains(err.Error(), "change 2") {
		t.Fatalf("fence after a resume retried over a newer halt: %v; want ErrHalted naming change 2 (the newer halt must stand)", err)
	}
	if got := kinds(history(t, ctx, p.Budget, key, 0)); got != "act:failed halted resumed act:failed halted" {
		t.Errorf("history: %s; want one resume", got)
	}
}

// Retention: a key keeps its last HistoryLimit records (each Record
// removes the oldest), History's limit returns the newest, oldest first;
// HistoryAge removes records older than it by the database's clock but
// never the newest, whose count of failures still halts.
func TestHistoryRetention(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	clock := newDBClock()
	path := filepath.Join(t.TempDir(), "budget.db")
	db := clock.open(t, path)
	b := newBudget(t, sqlbudget.DBTx(db), "node-1", func(c *sqlbudget.Config) { c.HistoryLimit, c.HaltAfter = 5, -1 })
	const key = "svc.daemon"
	s := acquire(t, ctx, b, key)
	defer s.Release(ctx)
	for i := range 12 {
		record(t, ctx, s, readyAct("node-1", fmt.Sprint(i)))
	}
	recs := history(t, ctx, b, key, 0)
	var changes []string
	for _, r := range recs {
		changes = append(changes, r.Act.Change)
	}
	if got := strings.Join(changes, ","); got != "7,8,9,10,11" {
		t.Fatalf("HistoryLimit 5 after 12 acts: %s; want the last 5, oldest first", got)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM snapsvc_budget_history`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("rows kept: %d (%v), want 5", n, err)
	}
	if recs := history(t, ctx, b, key, 2); len(recs) != 2 || recs[0].Act.Change != "10" || recs[1].Act.Change != "11" || recs[0].Seq >= recs[1].Seq {
		t.Fatalf("History limit 2: %+v; want changes 10, 11", recs)
	}

	// By age: a record a day old goes at the next write; the newest stays
	// whatever its age, and with it the count of failures.
	aged := newBudget(t, sqlbudget.DBTx(db), "node-2", func(c *sqlbudget.Config) { c.HistoryAge, c.HaltAfter = time.Hour, 2 })
	const other = "other.daemon"
	as := acquire(t, ctx, aged, other)
	defer as.Release(ctx)
	record(t, ctx, as, readyAct("node-2", "1"))
	record(t, ctx, as, failedAct("node-2", "2"))
	clock.Step(24 * time.Hour)
	if _, err := aged.Pause(ctx, "third", "a write elsewhere"); err != nil { // another key's write trims nothing here
		t.Fatal(err)
	}
	if got := kinds(history(t, ctx, aged, other, 0)); got != "act:ready act:failed" {
		t.Fatalf("history of %s after a write to another key: %s", other, got)
	}
	if h := record(t, ctx, as, failedAct("node-2", "3")); h == nil || h.Failures != 2 {
		t.Fatalf("second failure a day after the first, the first trimmed by age: halt %+v; want the halt (2 failures)", h)
	}
	if got := kinds(history(t, ctx, aged, other, 0)); got != "act:failed halted" {
		t.Fatalf("history after the day-old records were trimmed: %s; want the last failure and its halt", got)
	}
}

// A version-4 database (sqlbudget before the history) is brought to
// version 5 on first use, keeping its rows: a holder's row still holds,
// an operator's pause still stands (no halt) and is lifted by Resume,
// which the new history records.
func TestMigrateFromVersion4(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	for _, u := range sqlbudget.SchemaUpdates()[:4] {
		if err := sqlbudget.DBTx(db)(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	now := `CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)`
	if _, err := db.ExecContext(ctx, `INSERT INTO snapsvc_budget_slots (key, token, holder, max_spec, beat, lease_ms, granted, since, renewed, granted_at)
		VALUES ('k', 't1', 'old-holder', '1', 1, 60000, 1, `+now+`, `+now+`, `+now+`)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO snapsvc_budget_pauses (key, by, since, reason, token) VALUES ('p', 'old-operator', 0, 'before the upgrade', 'tok')`); err != nil {
		t.Fatal(err)
	}
	b := newBudget(t, sqlbudget.DBTx(db), "new")
	st, err := b.Status(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders) != 1 || st.Holders[0].Holder != "old-holder" {
		t.Fatalf("status of k after the migration: holders %+v, want old-holder", st.Holders)
	}
	st, err = b.Status(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if st.Paused == nil || st.Paused.By != "old-operator" || st.Halt != nil || st.Paused.Halt != nil {
		t.Fatalf("status of p after the migration: pause %+v halt %+v, want the version-4 pause, no halt", st.Paused, st.Halt)
	}
	var v int
	if err := db.QueryRowContext(ctx, `SELECT max(version) FROM snapsvc_budget_schema`).Scan(&v); err != nil || v != 5 || sqlbudget.SchemaVersion != 5 {
		t.Fatalf("schema version %d (%v), want 5", v, err)
	}
	if keys, err := b.Keys(ctx); err != nil || strings.Join(keys, ",") != "k,p" {
		t.Fatalf("Keys after the migration: %v %v", keys, err)
	}
	if recs := history(t, ctx, b, "p", 0); len(recs) != 0 {
		t.Fatalf("history of a migrated key: %+v, want none", recs)
	}
	if was, err := b.Resume(ctx, "p"); err != nil || !was {
		t.Fatalf("Resume of the version-4 pause: %v %v", was, err)
	}
	recs := history(t, ctx, b, "p", 0)
	if kinds(recs) != "resumed" || recs[0].By != "new" || !strings.Contains(recs[0].Reason, "old-operator") {
		t.Fatalf("history after the resume: %+v", recs)
	}
	// A second Budget migrating the migrated database changes nothing.
	if err := sqlbudget.DBTx(db)(ctx, sqlbudget.Migrate); err != nil {
		t.Fatal(err)
	}
}

// Pause and Resume are recorded, once each (a retried Pause finds its own
// pause; a Resume of a key not paused records nothing).
func TestPauseResumeRecorded(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	_, db := tempDB(t)
	var lost atomic.Int64
	op := newBudget(t, lossyTx(db, &lost), "operator")
	if _, err := op.Pause(ctx, "k", "maintenance"); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Pause(ctx, "k", "again"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := op.Resume(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	recs := history(t, ctx, op, "k", 0)
	if kinds(recs) != "paused resumed" || recs[0].By != "operator" || recs[0].Reason != "maintenance" || recs[1].By != "operator" {
		t.Fatalf("history with lost answers: %+v; want one pause (maintenance), one resume", recs)
	}
}

// BenchmarkHistory10000 reads the whole history of a key that keeps
// 10,000 records (HistoryLimit 10000): one transaction, through the
// index, decoding every record.
func BenchmarkHistory10000(b *testing.B) {
	ctx := context.Background()
	db := openSQLite(b, filepath.Join(b.TempDir(), "budget.db"))
	bud, err := sqlbudget.New(sqlbudget.Config{DB: db, Holder: "node-1", HistoryLimit: 10000, HaltAfter: -1})
	if err != nil {
		b.Fatal(err)
	}
	const key = "svc.daemon"
	s, err := bud.Acquire(ctx, key, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Release(ctx)
	// The first records through Record; the rest written as Record
	// writes them, in one transaction (10,000 commits would take
	// minutes on a slow disk).
	for i := range 10 {
		if _, err := s.(budget.Recorder).Record(ctx, readyAct("node-1", fmt.Sprint(i))); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := db.ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 10 UNION ALL SELECT i + 1 FROM n WHERE i < 10010)
		INSERT INTO snapsvc_budget_history (key, kind, token, time, holder, machine, action, services, change_id, spawn, ready, outcome, reason, waited_ns, held_ns, by, halt, failures)
		SELECT key, kind, 'bench-' || n.i, time, holder, machine, action, services, CAST(n.i AS TEXT), spawn, ready, outcome, reason, waited_ns, held_ns, by, halt, failures
		FROM n, (SELECT * FROM snapsvc_budget_history ORDER BY id LIMIT 1)`); err != nil {
		b.Fatal(err)
	}
	// One more Record trims to the bound.
	if _, err := s.(budget.Recorder).Record(ctx, readyAct("node-1", "last")); err != nil {
		b.Fatal(err)
	}
	recs, err := bud.History(ctx, key, 0)
	if err != nil || len(recs) != 10000 || recs[9999].Act.Change != "last" {
		b.Fatalf("history: %d records (%v), want 10000 ending with the last", len(recs), err)
	}
	b.ResetTimer()
	for b.Loop() {
		recs, err := bud.History(ctx, key, 0)
		if err != nil || len(recs) != 10000 {
			b.Fatalf("history: %d records (%v)", len(recs), err)
		}
	}
}
