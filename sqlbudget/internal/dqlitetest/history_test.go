//go:build libsqlite3

package dqlitetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/sqlbudget/internal/sqltest"
	"github.com/snapsvc/snapsvc/testsupport/budgetcontract"
)

// historyTTL: the rows of the halt tests' participants, as the
// contract's (contractTTL).
const historyTTL = 3 * time.Second

func failedAct(machine, change string) budget.Act {
	return budget.Act{Holder: machine, Machine: machine, Action: "restart", Services: []string{"svc.daemon"}, Change: change,
		Spawn: time.Date(2026, 12, 6, 5, 0, 0, 123456789, time.UTC), Ready: time.Date(2026, 12, 6, 5, 0, 2, 5, time.UTC),
		Outcome: budget.OutcomeFailed, Reason: "not ready within 30s", Waited: time.Millisecond, Held: 31 * time.Second}
}

func recordKinds(recs []budget.Record) string {
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

// The halt and the history on a real 3-node dqlite cluster: two holders
// (Max 2, HaltAfter 2) record a failure at once: exactly one halt, both
// acts once; the halted key holds every Fence and Acquire back (their
// errors wrap ErrPaused and ErrHalted), Status and Keys show it; a Resume
// whose answer was lost, retried, never lifts a halt written meanwhile;
// once resumed, the next machine acts and its ready act is recorded.
func TestHaltAndHistoryDqlite(t *testing.T) {
	c := cluster(t)
	ctx := ctxT(t, 2*time.Minute)
	key := uniqueKey(t) + ".svc"
	h := &sqltest.Harness{TTL: historyTTL, Open: func(t *testing.T) sqlbudget.TxFunc {
		db := c.DB("history")
		t.Cleanup(func() { db.Close() })
		return sqlbudget.DBTx(db)
	}}
	participant := func(name string) *sqltest.Participant {
		cfg := h.Config(budgetcontract.Options{Holder: name, Max: 2})
		cfg.Max, cfg.HaltAfter = 2, 2
		return h.NewParticipant(t, cfg)
	}
	op := participant("operator")
	n1, n2, n3 := participant("node-1"), participant("node-2"), participant("node-3")
	var slots []budget.Slot
	for _, p := range []*sqltest.Participant{n1, n2} {
		s, err := p.Acquire(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	start := make(chan struct{})
	for i, s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = s.(budget.Recorder).Record(ctx, failedAct(fmt.Sprintf("node-%d", i+1), fmt.Sprint(i+1)))
		}()
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	recs, err := op.History(ctx, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := recordKinds(recs); got != "act:failed act:failed halted" {
		t.Fatalf("history after two failures at once: %s; want both acts once, one halt", got)
	}
	if a := recs[0].Act; !a.Spawn.Equal(failedAct("", "").Spawn) || !a.Ready.Equal(failedAct("", "").Ready) || a.Held != 31*time.Second {
		t.Errorf("recorded act %+v: times not as given", a)
	}
	if n1.Metrics().Halts+n2.Metrics().Halts != 1 {
		t.Errorf("halts written: %d + %d, want 1", n1.Metrics().Halts, n2.Metrics().Halts)
	}
	st, err := op.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Halt == nil || st.Halt.Failures != 2 || st.Halt.Change != recs[1].Act.Change {
		t.Fatalf("status: halt %+v; want the second failure's", st.Halt)
	}
	if keys, err := op.Keys(ctx); err != nil || !strings.Contains(strings.Join(keys, " "), key) {
		t.Fatalf("Keys: %v %v; want %s among them", keys, err, key)
	}
	short, cancel := context.WithTimeout(ctx, historyTTL/2)
	_, err = slots[0].(budget.Fencer).Fence(short)
	cancel()
	if !errors.Is(err, budget.ErrPaused) || !errors.Is(err, budget.ErrHalted) || !strings.Contains(err.Error(), "Resume") {
		t.Fatalf("Fence on the halted key: %v; want ErrPaused and ErrHalted, saying how to resume", err)
	}
	for _, s := range slots {
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	short, cancel = context.WithTimeout(ctx, historyTTL/2)
	_, err = n3.Acquire(short, key, nil)
	cancel()
	if !errors.Is(err, budget.ErrHalted) {
		t.Fatalf("Acquire of the halted key: %v; want ErrHalted", err)
	}

	// A resume whose answer was lost, retried, over a halt written
	// meanwhile (HaltAfter 2: two more failures).
	h.ResumeLosingAnswer(t, key, func() {
		s, err := n1.Acquire(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release(ctx)
		for i := range 2 {
			if _, err := s.(budget.Recorder).Record(ctx, failedAct("node-1", fmt.Sprint(10+i))); err != nil {
				t.Fatal(err)
			}
		}
	})
	short, cancel = context.WithTimeout(ctx, historyTTL/2)
	_, err = n3.Acquire(short, key, nil)
	cancel()
	if !errors.Is(err, budget.ErrHalted) || !strings.Contains(err.Error(), "change 11") {
		t.Fatalf("Acquire after a resume retried over a newer halt: %v; want ErrHalted naming change 11", err)
	}
	if was, err := op.Resume(ctx, key); err != nil || !was {
		t.Fatalf("Resume: %v %v", was, err)
	}
	s3, err := n3.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s3.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatalf("Fence once resumed: %v", err)
	}
	ready := failedAct("node-3", "20")
	ready.Outcome, ready.Reason = budget.OutcomeReady, ""
	if h, err := s3.(budget.Recorder).Record(ctx, ready); err != nil || h != nil {
		t.Fatalf("Record of a ready act: %+v %v", h, err)
	}
	if err := s3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	recs, err = op.History(ctx, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := "act:failed act:failed halted resumed act:failed act:failed halted resumed act:ready"
	if got := recordKinds(recs); got != want {
		t.Fatalf("history: %s; want %s", got, want)
	}
	if last, err := op.History(ctx, key, 2); err != nil || recordKinds(last) != "resumed act:ready" {
		t.Fatalf("History limit 2: %s %v", recordKinds(last), err)
	}
}
