package snapsvc_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// acts collects what a recording memBudget was asked to record.
type acts struct {
	mu   sync.Mutex
	acts []budget.Act
	halt *budget.Halt // returned for a failed act
}

func (r *acts) record(a budget.Act) (*budget.Halt, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.acts = append(r.acts, a)
	if a.Failed() && r.halt != nil {
		if r.halt.Holder == "" { // the first failure halts the key, as a backend's would
			r.halt.Holder, r.halt.Change, r.halt.Services = a.Holder, a.Change, a.Services
		}
		h := *r.halt
		return &h, nil
	}
	return nil, nil
}

func (r *acts) all() []budget.Act {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.acts)
}

// A budgeted restart records its act, with the change snapd made and its
// times as snapd recorded them, before its slot is given back: ready when
// its services passed their checks, failed (with why) when they did not.
func TestBudgetRecordsEachActBeforeItsRelease(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	rec := &acts{}
	b.recorder = rec.record
	var failing sync.Mutex
	notReady := false
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Ready: func(string) probe.Probe {
			return probe.Func("readyz", func(context.Context) error {
				failing.Lock()
				defer failing.Unlock()
				if notReady {
					return errors.New("connection refused")
				}
				return nil
			})
		},
		Probe: probe.Options{Interval: time.Millisecond, Timeout: time.Second, MaxWait: 20 * time.Millisecond},
	}))
	res, err := c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	failing.Lock()
	notReady = true
	failing.Unlock()
	res2, err := c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
	if err == nil {
		t.Fatalf("a restart whose service never became ready succeeded: %+v", res2)
	}
	got := rec.all()
	if len(got) != 2 {
		t.Fatalf("%d acts recorded for two restarts: %+v", len(got), got)
	}
	changes := map[string]bool{}
	for i, a := range got {
		chg, ok := changeByID(srv, a.Change)
		if !ok {
			t.Fatalf("act %d names change %q, which the fake never made", i, a.Change)
		}
		changes[a.Change] = true
		if !a.Spawn.Equal(chg.SpawnTime) || !a.Ready.Equal(chg.ReadyTime) {
			t.Errorf("act %d: spawn %v ready %v, snapd recorded %v and %v", i, a.Spawn, a.Ready, chg.SpawnTime, chg.ReadyTime)
		}
		if a.Key != "k8s.kube-apiserver" || a.Holder != "node-1" || a.Action != "restart" || !slices.Equal(a.Services, []string{"k8s.kube-apiserver"}) {
			t.Errorf("act %d: %+v", i, a)
		}
	}
	if got[0].Change != res.ChangeID || len(changes) != 2 {
		t.Errorf("acts name changes %q and %q; the first restart's was %s", got[0].Change, got[1].Change, res.ChangeID)
	}
	if got[0].Outcome != budget.OutcomeReady || got[1].Outcome != budget.OutcomeFailed || got[1].Reason == "" {
		t.Errorf("outcomes %q %q (reason %q), want ready then failed with a reason", got[0].Outcome, got[1].Outcome, got[1].Reason)
	}
	want := []string{
		"acquire k8s.kube-apiserver", "fence k8s.kube-apiserver", "ready k8s.kube-apiserver",
		"record k8s.kube-apiserver ready", "release k8s.kube-apiserver",
		"acquire k8s.kube-apiserver", "fence k8s.kube-apiserver",
		"record k8s.kube-apiserver failed", "release k8s.kube-apiserver",
	}
	if steps := b.steps(); !slices.Equal(steps, want) {
		t.Errorf("steps %q, want %q", steps, want)
	}
}

// A failure that halts its key says so: a "halted" event with the halt,
// before the slot is given back.
func TestBudgetHaltIsReported(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	srv.SetFailStart("k8s", "kubelet", "kubelet refuses its configuration")
	b := newMemBudget(1)
	rec := &acts{halt: &budget.Halt{Key: "k8s.kubelet", Reason: "halted: test", Failures: 1}}
	b.recorder = rec.record
	var mu sync.Mutex
	var halts []snapsvc.BudgetEvent
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Progress: func(ev snapsvc.BudgetEvent) {
			if ev.Kind == snapsvc.BudgetHalted {
				mu.Lock()
				halts = append(halts, ev)
				mu.Unlock()
			}
		},
	}))
	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var ce *snapsvc.ChangeError
	if !errors.As(err, &ce) {
		t.Fatalf("restart into a failing start: %v, want a ChangeError", err)
	}
	// A second failure on the halted key (the memBudget does not hold it
	// back) is recorded, and halts nothing more: no second event.
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err == nil {
		t.Fatal("the second restart into a failing start succeeded")
	}
	got := rec.all()
	if len(got) != 2 || got[0].Outcome != budget.OutcomeFailed || got[0].Change != ce.ID || got[0].ID == got[1].ID {
		t.Fatalf("acts %+v, want two failed acts of their own ids, the first of change %s", got, ce.ID)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(halts) != 1 || halts[0].Halt == nil || halts[0].Halt.Reason != "halted: test" || halts[0].Act == nil || halts[0].Act.Change != ce.ID {
		t.Fatalf("halted events %+v", halts)
	}
}

// The admission check is asked once the slot is held and fenced, before
// anything is sent; a refusal keeps the slot and asks again, and the
// restart goes on once it admits.
func TestAdmissionRefusalKeepsTheSlotAndAsksAgain(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.fence = func(context.Context, *memSlot) error { return nil }
	var mu sync.Mutex
	var asked []snapsvc.Admission
	var sentWhileRefused int
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Admit: func(ctx context.Context, a snapsvc.Admission) error {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, a)
			sentWhileRefused += srv.Counters().Requests["POST /v2/apps"]
			if b.holding("k8s.kubelet") != 1 {
				t.Errorf("admission asked without the slot held")
			}
			if len(asked) < 3 {
				return errors.New("2 of 3 mons in quorum")
			}
			return nil
		},
		AdmitRetry: snapsvc.AdmitBackoff{Initial: time.Millisecond, Max: 2 * time.Millisecond},
	}))
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 3 || sentWhileRefused != 0 {
		t.Fatalf("asked %d times, %d requests to act before it admitted", len(asked), sentWhileRefused)
	}
	if a := asked[2]; a.Action != "restart" || !slices.Equal(a.Keys, []string{"k8s.kubelet"}) || a.Refusals != 2 {
		t.Errorf("admission asked %+v", a)
	}
	want := []string{"acquire k8s.kubelet", "fence k8s.kubelet", "fence k8s.kubelet", "release k8s.kubelet"}
	if got := b.steps(); !slices.Equal(got, want) {
		t.Errorf("steps %q, want %q (fenced again after the wait)", got, want)
	}
	if n := len(srv.Changes()); n != 1 {
		t.Errorf("%d changes, want 1", n)
	}
}

// An admission check that refuses until the call's bounds end: nothing is
// sent, the error says so and is retryable, and the slot is given back.
func TestAdmissionRefusedToTheEndSendsNothing(t *testing.T) {
	checkLeaks(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	b.released = make(chan struct{}, 1)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Admit:      func(context.Context, snapsvc.Admission) error { return errors.New("ok-to-stop: no") },
		AdmitRetry: snapsvc.AdmitBackoff{Initial: time.Millisecond, Max: 5 * time.Millisecond},
	}))
	ctx, cancel := context.WithTimeout(ctxT(t), 100*time.Millisecond)
	defer cancel()
	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrAdmissionRefused) || !errors.As(err, &opErr) || !opErr.Retryable() {
		t.Fatalf("error %v, want ErrAdmissionRefused, retryable", err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 0 {
		t.Fatalf("%d requests to act sent while refused", n)
	}
	recvT(t, b.released) // in the background: the call's own time had run out
	if n := b.holding("k8s.kubelet"); n != 0 {
		t.Fatalf("slot still held after the refused call (%d)", n)
	}
}

// changeByID returns the fake's change id.
func changeByID(srv interface{ Changes() []fake.ChangeInfo }, id string) (fake.ChangeInfo, bool) {
	for _, c := range srv.Changes() {
		if c.ID == id {
			return c, true
		}
	}
	return fake.ChangeInfo{}, false
}

// A failed act whose record cannot be written (the budget's store away)
// keeps its slot until it is: the halt it may write must be there before
// anyone else can act. The act's ID makes the repeats one act.
func TestBudgetFailedActKeepsItsSlotUntilRecorded(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	srv.SetFailStart("k8s", "kubelet", "kubelet refuses its configuration")
	b := newMemBudget(1)
	b.released = make(chan struct{}, 1)
	var mu sync.Mutex
	var ids []string
	fails := 3
	b.recorder = func(a budget.Act) (*budget.Halt, error) {
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, a.ID)
		if fails > 0 {
			fails--
			if n := b.holding("k8s.kubelet"); n != 1 {
				t.Errorf("the slot was let go of before the failure was recorded (held %d)", n)
			}
			return nil, errors.New("etcd unreachable")
		}
		return nil, nil
	}
	c := newClient(t, srv, snapsvc.WithClock(&instantClock{}), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err == nil {
		t.Fatal("a restart into a failing start succeeded")
	}
	recvT(t, b.released)
	mu.Lock()
	defer mu.Unlock()
	if len(ids) != 4 || ids[0] == "" || slices.Compact(slices.Clone(ids))[0] != ids[0] || len(slices.Compact(slices.Clone(ids))) != 1 {
		t.Fatalf("records tried with ids %q, want 4 tries of one act id", ids)
	}
	steps := b.steps()
	if i, j := slices.Index(steps, "record k8s.kubelet failed"), slices.Index(steps, "release k8s.kubelet"); i < 0 || j < i || strings.Count(strings.Join(steps, "\n"), "record k8s.kubelet failed") != 4 {
		t.Fatalf("steps %q: want four tries, then the release", steps)
	}
}

// A slot lost while its change ran still records the act: the restart
// happened, and a failure must still halt the key.
func TestBudgetLostSlotStillRecordsTheFailure(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	rec := &acts{}
	b.recorder = rec.record
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		Ready: func(string) probe.Probe {
			return probe.Func("readyz", func(context.Context) error {
				if s := b.slot("k8s.kubelet"); s != nil && s.Err() == nil {
					s.lose()
				}
				return errors.New("connection refused")
			})
		},
		Probe: probe.Options{Interval: time.Millisecond, Timeout: time.Second, MaxWait: 20 * time.Millisecond},
	}))
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err == nil {
		t.Fatal("restart succeeded though its service never became ready")
	}
	got := rec.all()
	if len(got) != 1 || got[0].Outcome != budget.OutcomeFailed {
		t.Fatalf("acts %+v, want the failure recorded though the slot was lost", got)
	}
}

// A Start that takes a Stop's kept slots and fails before it sends
// anything (here its admission check refuses to the end) is no failed
// act: nothing is recorded, and the slots stay kept.
func TestBudgetStartRefusedBeforeSendingRecordsNothing(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	rec := &acts{}
	b.recorder = rec.record
	var refuse atomic.Bool
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
		StopsAndStarts: true,
		Admit: func(context.Context, snapsvc.Admission) error {
			if refuse.Load() {
				return errors.New("2 of 3 mons in quorum")
			}
			return nil
		},
		AdmitRetry: snapsvc.AdmitBackoff{Initial: time.Millisecond, Max: 2 * time.Millisecond},
	}))
	if _, err := c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{}); err != nil {
		t.Fatal(err)
	}
	refuse.Store(true)
	sctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Start(sctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{}); !errors.Is(err, snapsvc.ErrAdmissionRefused) {
		t.Fatalf("start: %v, want ErrAdmissionRefused", err)
	}
	if got := rec.all(); len(got) != 0 {
		t.Fatalf("acts %+v recorded for a start that sent nothing", got)
	}
	if n := b.holding("k8s.kubelet"); n != 1 {
		t.Fatalf("the stop's slot is no longer kept (held %d)", n)
	}
	refuse.Store(false)
	if _, err := c.Start(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := rec.all(); len(got) != 1 || got[0].Outcome != budget.OutcomeReady || got[0].Action != "start" {
		t.Fatalf("acts %+v, want the start's, ready", got)
	}
}
