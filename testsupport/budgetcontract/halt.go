package budgetcontract

// The whole-path cases of a bad restart (issue 42): a failure halts the
// key, an admission check holds the rollout back, and the history is
// snapd's own record. Judged from the fake snapds' change records and the
// backend's history (budget.Historian, which every backend implements).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// history returns key's history as p's budget keeps it.
func history(t *testing.T, ctx context.Context, p Participant, key string) []budget.Record {
	t.Helper()
	h, ok := p.(budget.Historian)
	if !ok {
		t.Fatalf("the participant's budget keeps no history (budget.Historian): %T", p)
	}
	recs, err := h.History(ctx, key, 0)
	if err != nil {
		t.Fatalf("history of %s: %v", key, err)
	}
	return recs
}

// restartAll restarts the whole service on every machine at once, each
// call bounded by bound (0: ctx only), and returns each one's error.
func restartAll(ctx context.Context, machines []*machine, bound time.Duration) []error {
	errs := make([]error, len(machines))
	var wg sync.WaitGroup
	for i, m := range machines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := ctx, context.CancelFunc(func() {})
			if bound > 0 {
				cctx, cancel = context.WithTimeout(ctx, bound)
			}
			defer cancel()
			_, errs[i] = m.c.Restart(cctx, []string{wholeService}, snapsvc.RestartOptions{})
		}()
	}
	wg.Wait()
	return errs
}

// haltStopsTheRollout: five machines (Max 1, the default halt threshold
// of 1) whose restart leaves the service never ready.
func (c *suite) haltStopsTheRollout(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	key := c.cfg.Key(t)
	var fixed atomic.Bool
	set := func(o *snapsvc.BudgetOptions) {
		o.Ready = func(string) probe.Probe {
			return probe.Func("readyz", func(context.Context) error {
				if fixed.Load() {
					return nil
				}
				return errors.New("connection refused")
			})
		}
		o.Probe = probe.Options{Interval: 10 * time.Millisecond, Timeout: time.Second, MaxWait: 300 * time.Millisecond}
	}
	var machines []*machine
	var ps []Participant
	for i := range 5 {
		name := fmt.Sprintf("m%d", i)
		p := c.h.New(t, Options{Holder: name, Max: 1})
		ps = append(ps, p)
		machines = append(machines, newMachineWith(t, name, p, key, 100*time.Millisecond, set))
	}
	// The rollout: every machine at once, each call bounded as a
	// controller's would be.
	errs := restartAll(ctx, machines, 4*time.Second)
	var first *machine
	halted := 0
	for i, m := range machines {
		switch n := len(m.changes()); {
		case n == 1 && first == nil:
			first = m
			var nr *probe.NotReadyError
			if !errors.As(errs[i], &nr) {
				t.Errorf("%s restarted into the fault: %v; want its service not ready", m.name, errs[i])
			}
		case n > 0:
			t.Errorf("%s made %d changes after %v failed: the rollout went on", m.name, n, first)
		case errors.Is(errs[i], snapsvc.ErrBudgetHalted):
			if !errors.Is(errs[i], snapsvc.ErrBudgetPaused) {
				t.Errorf("%s: a halt that is not a pause: %v", m.name, errs[i])
			}
			halted++
		}
	}
	if first == nil {
		t.Fatalf("no machine restarted: %v", errs)
	}
	if halted == 0 {
		t.Errorf("no machine was held back by the halt: %v", errs)
	}
	// The halt names the failed restart, as its machine's snapd made it.
	chg := first.changes()[0]
	var halt *budget.Halt
	for _, r := range history(t, ctx, ps[0], key) {
		if r.Kind == budget.RecordHalted {
			halt = r.Halt
		}
	}
	if halt == nil || halt.Change != chg.ID || halt.Holder != first.name || halt.Reason == "" {
		t.Fatalf("halt %+v, want one naming %s's change %s with a reason", halt, first.name, chg.ID)
	}
	// Still halted: nobody restarts, however often asked.
	if errs := restartAll(ctx, machines[:1], time.Second); !errors.Is(errs[0], snapsvc.ErrBudgetHalted) {
		t.Errorf("a restart while halted: %v, want ErrBudgetHalted", errs[0])
	}
	for _, m := range machines {
		if m != first && len(m.changes()) != 0 {
			t.Fatalf("%s restarted while the key was halted", m.name)
		}
	}
	// The operator fixes the fault and resumes: the rollout goes on.
	fixed.Store(true)
	c.h.Resume(t, key)
	var rest []*machine
	for _, m := range machines {
		if m != first {
			rest = append(rest, m)
		}
	}
	for i, err := range restartAll(ctx, rest, 0) {
		if err != nil {
			t.Errorf("%s after the resume: %v", rest[i].name, err)
		}
	}
	for _, m := range machines {
		m.released(t, ctx)
	}
	judge(t, machines, 1, 1)
}

// admissionHoldsTheRollout: three machines whose admission check refuses
// while a mon is down.
func (c *suite) admissionHoldsTheRollout(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	var monDown atomic.Bool
	monDown.Store(true)
	refused := make(chan struct{}, 100)
	set := func(o *snapsvc.BudgetOptions) {
		o.Admit = func(context.Context, snapsvc.Admission) error {
			if monDown.Load() {
				select {
				case refused <- struct{}{}:
				default:
				}
				return errors.New("mon.c is down: 2 of 3 mons in quorum")
			}
			return nil
		}
		o.AdmitRetry = snapsvc.AdmitBackoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond}
	}
	var machines []*machine
	for i := range 3 {
		name := fmt.Sprintf("m%d", i)
		machines = append(machines, newMachineWith(t, name, c.h.New(t, Options{Holder: name, Max: 1}), key, 100*time.Millisecond, set))
	}
	done := make(chan []error, 1)
	go func() { done <- restartAll(ctx, machines, 0) }()
	for range 3 {
		select {
		case <-refused:
		case <-ctx.Done():
			t.Fatal("the admission check was never asked")
		}
	}
	for _, m := range machines {
		if n := len(m.changes()); n != 0 {
			t.Fatalf("%s restarted %d times while its admission check refused", m.name, n)
		}
	}
	monDown.Store(false)
	var errs []error
	select {
	case errs = <-done:
	case <-ctx.Done():
		t.Fatal("the rollout never completed once the check agreed")
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", machines[i].name, err)
		}
	}
	for _, m := range machines {
		m.released(t, ctx)
	}
	judge(t, machines, 1, 1)
}

// historyIsSnapdsRecord: a five-machine rollout, then the key's history.
func (c *suite) historyIsSnapdsRecord(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	var machines []*machine
	var ps []Participant
	byName := map[string]*machine{}
	for i := range 5 {
		name := fmt.Sprintf("m%d", i)
		p := c.h.New(t, Options{Holder: name, Max: 1})
		ps = append(ps, p)
		m := newMachine(t, name, p, key, 100*time.Millisecond)
		machines = append(machines, m)
		byName[name] = m
	}
	for i, err := range restartAll(ctx, machines, 0) {
		if err != nil {
			t.Errorf("%s: %v", machines[i].name, err)
		}
	}
	for _, m := range machines {
		m.released(t, ctx)
	}
	judge(t, machines, 1, 1)
	seen := map[string]bool{}
	for _, r := range history(t, ctx, ps[4], key) {
		if r.Kind != budget.RecordAct {
			continue
		}
		a := r.Act
		m := byName[a.Holder]
		if m == nil || seen[a.Holder] {
			t.Errorf("an act of holder %q (seen before: %v): %+v", a.Holder, seen[a.Holder], a)
			continue
		}
		seen[a.Holder] = true
		chg := m.changes()[0]
		// Times at the millisecond: a store may keep no finer.
		sameMS := func(x, y time.Time) bool { return x.Truncate(time.Millisecond).Equal(y.Truncate(time.Millisecond)) }
		if a.Change != chg.ID || !sameMS(a.Spawn, chg.SpawnTime) || !sameMS(a.Ready, chg.ReadyTime) || a.Outcome != budget.OutcomeReady {
			t.Errorf("%s's act %+v; its snapd recorded change %s spawned %v ready %v", m.name, a, chg.ID, chg.SpawnTime, chg.ReadyTime)
		}
		if a.Key != key || a.Action != "restart" || a.Held <= 0 {
			t.Errorf("%s's act %+v", m.name, a)
		}
	}
	if len(seen) != 5 {
		t.Errorf("history holds acts of %d machines, want 5", len(seen))
	}
}
