package snapsvc_test

// A fleet's refresh under a restart budget of Max 1, judged from each
// machine's snapd's own records (the fakes' changes and service
// histories): at most one refresh change at a time across the fleet, and
// each machine's services active again before the next machine's refresh
// began.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// fleetMachine is one machine: its snapd and its Client under the fleet's
// budget.
type fleetMachine struct {
	name string
	srv  *fake.Server
	c    *snapsvc.Client
}

// svcdemoApps are svcdemo's services (svcdemoStore).
var svcdemoApps = []string{"alpha", "beta"}

// newFleet builds n machines whose svcdemo (revision 1, services alpha and
// beta taking d to stop and to start) the store offers rev of, each
// refreshing under b; a refresh's slots are held until snapd reports
// every service of svcdemo active (probe: every 5ms, for at most
// notReadyAfter).
func newFleet(t *testing.T, n int, b *queueBudget, d time.Duration, rev fake.StoreRevision, notReadyAfter time.Duration) []*fleetMachine {
	t.Helper()
	var ms []*fleetMachine
	for i := range n {
		m := &fleetMachine{name: fmt.Sprintf("node-%d", i+1)}
		sn, _ := svcdemoStore(d)
		m.srv = fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(sn), fake.WithStoreRevision("svcdemo", rev))
		active := probe.Func("svcdemo active", func(ctx context.Context) error {
			svcs, err := m.c.Services(ctx, "svcdemo")
			if err != nil {
				return err
			}
			for _, s := range svcs {
				if !s.Active {
					return fmt.Errorf("%s is inactive", s.FullName())
				}
			}
			return nil
		})
		m.c = newClient(t, m.srv, snapsvc.WithRestartBudget(b.machine(m.name), snapsvc.BudgetOptions{
			Ready: func(string) probe.Probe { return active },
			Probe: probe.Options{Interval: 5 * time.Millisecond, MaxWait: notReadyAfter},
		}))
		ms = append(ms, m)
	}
	return ms
}

// refreshAll refreshes svcdemo on every machine at once.
func refreshAll(ms []*fleetMachine) []error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = m.c.Refresh(context.Background(), "svcdemo", snapsvc.RefreshOptions{})
		}()
	}
	wg.Wait()
	return errs
}

// refreshSpan is one machine's refresh change, from snapd's records.
type refreshSpan struct {
	m            *fleetMachine
	id           string
	spawn, ready time.Time
}

// checkOneAtATime asserts, from the fakes' records, that every machine
// refreshed once, that no two refresh changes overlapped, and that each
// machine's services were all active again (their history) before the
// next machine's refresh change was spawned.
func checkOneAtATime(t *testing.T, ms []*fleetMachine) {
	t.Helper()
	var spans []refreshSpan
	for _, m := range ms {
		rs := changesOf(m.srv, "refresh-snap")
		if len(rs) != 1 || rs[0].Status != "Done" {
			t.Fatalf("%s: refresh changes %+v, want one Done", m.name, rs)
		}
		spans = append(spans, refreshSpan{m: m, id: rs[0].ID, spawn: rs[0].SpawnTime, ready: rs[0].ReadyTime})
	}
	slices.SortFunc(spans, func(a, b refreshSpan) int { return a.spawn.Compare(b.spawn) })
	for i := 1; i < len(spans); i++ {
		prev, next := spans[i-1], spans[i]
		if next.spawn.Before(prev.ready) {
			t.Fatalf("%s's refresh (%s) spawned at %v, before %s's was ready at %v: two refreshes at once",
				next.m.name, next.id, next.spawn, prev.m.name, prev.ready)
		}
		for _, app := range svcdemoApps {
			if at, ok := activeAgainBy(prev.m.srv, app, prev.spawn, next.spawn); !ok {
				t.Fatalf("%s's svcdemo.%s was not active again (from its refresh at %v) before %s's refresh at %v",
					prev.m.name, app, prev.spawn, next.m.name, next.spawn)
			} else if at.Before(prev.spawn) {
				t.Fatalf("%s's svcdemo.%s active at %v, before its own refresh", prev.m.name, app, at)
			}
		}
	}
}

// activeAgainBy reports whether svcdemo.app, stopped by a refresh spawned
// at from, was active again by until, by the service's history, and when.
func activeAgainBy(srv *fake.Server, app string, from, until time.Time) (time.Time, bool) {
	h := srv.ServiceHistory("svcdemo", app)
	stopped := false
	for _, st := range h {
		if st.At.Before(from) || st.At.After(until) {
			continue
		}
		if !st.Active {
			stopped = true
			continue
		}
		if stopped {
			return st.At, true
		}
	}
	return time.Time{}, false
}

func TestFleetRefreshOneAtATime(t *testing.T) {
	b := newQueueBudget(1)
	ms := newFleet(t, 3, b, 15*time.Millisecond, fake.StoreRevision{Revision: "2", Version: "1.1"}, 5*time.Second)
	for i, err := range refreshAll(ms) {
		if err != nil {
			t.Fatalf("%s: %v", ms[i].name, err)
		}
	}
	checkOneAtATime(t, ms)
	acts := b.history()
	if len(acts) != 2*len(ms) { // each refresh records on each of its two keys
		t.Fatalf("acts %+v", acts)
	}
	for _, a := range acts {
		if a.Action != "refresh" || a.Outcome != budget.OutcomeReady || a.Change == "" || !slices.Equal(a.Services, []string{"svcdemo"}) {
			t.Fatalf("act %+v", a)
		}
	}
	if b.holding("svcdemo.alpha")+b.holding("svcdemo.beta") != 0 {
		t.Fatal("slots still held")
	}
}

// TestFleetRefreshForeignChange: one machine's snap is held by a change
// of its own snapd's (a snap set running its configure hook); the fleet
// still refreshes one machine at a time, that machine once its change is
// done.
func TestFleetRefreshForeignChange(t *testing.T) {
	b := newQueueBudget(1)
	ms := newFleet(t, 3, b, 15*time.Millisecond, fake.StoreRevision{Revision: "2", Version: "1.1"}, 5*time.Second)
	busy := ms[1]
	foreign := busy.srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "svcdemo", WithSnapNames: true})
	done := make(chan []error, 1)
	go func() { done <- refreshAll(ms) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := busy.srv.WaitFor(ctx, func(v fake.View) bool { return v.Conflicts() >= 1 }); err != nil {
		t.Fatal(err)
	}
	foreign.Finish()
	for i, err := range <-done {
		if err != nil {
			t.Fatalf("%s: %v", ms[i].name, err)
		}
	}
	checkOneAtATime(t, ms)
	fchg, _ := busy.srv.ChangeByID(foreign.ID())
	if rs := changesOf(busy.srv, "refresh-snap"); rs[0].SpawnTime.Before(fchg.ReadyTime) {
		t.Fatalf("%s refreshed at %v, before its own change was done at %v", busy.name, rs[0].SpawnTime, fchg.ReadyTime)
	}
}

// TestFleetRefreshNotReadyHalts: the new revision's service dies right
// after it starts. The first machine to refresh finds it not ready, its
// failed act halts the key, and no other machine refreshes.
func TestFleetRefreshNotReadyHalts(t *testing.T) {
	b := newQueueBudget(1)
	rev := fake.StoreRevision{Revision: "2", Version: "1.1", Apps: []fake.App{
		{Name: "alpha", Daemon: "simple", DiesAfterStart: true, StartDuration: time.Millisecond, StopDuration: time.Millisecond},
		{Name: "beta", Daemon: "simple", StartDuration: time.Millisecond, StopDuration: time.Millisecond}}}
	ms := newFleet(t, 3, b, time.Millisecond, rev, 200*time.Millisecond)
	errs := refreshAll(ms)
	var refreshed []*fleetMachine
	for i, m := range ms {
		rs := changesOf(m.srv, "refresh-snap")
		switch {
		case len(rs) == 1:
			refreshed = append(refreshed, m)
			var nr *probe.NotReadyError
			var be *snapsvc.BudgetError
			if !errors.As(errs[i], &be) || !errors.As(errs[i], &nr) || rs[0].Status != "Done" {
				t.Fatalf("%s refreshed (%s): err = %v, want not ready", m.name, rs[0].Status, errs[i])
			}
		case len(rs) == 0:
			var oe *snapsvc.OpError
			if !errors.Is(errs[i], snapsvc.ErrBudgetHalted) || !errors.As(errs[i], &oe) || oe.Retryable() || oe.ChangeID != "" {
				t.Fatalf("%s did not refresh: err = %v, want the key halted, not retryable", m.name, errs[i])
			}
		default:
			t.Fatalf("%s: %d refresh changes", m.name, len(rs))
		}
	}
	if len(refreshed) != 1 {
		t.Fatalf("%d machines refreshed, want 1 (the halt stops the rest)", len(refreshed))
	}
	chg := changesOf(refreshed[0].srv, "refresh-snap")[0]
	for _, key := range []string{"svcdemo.alpha", "svcdemo.beta"} {
		h := b.halted(key)
		if h == nil || h.Holder != refreshed[0].name || h.Change != chg.ID {
			t.Fatalf("halt of %s: %+v, want %s's change %s", key, h, refreshed[0].name, chg.ID)
		}
	}
	for _, a := range b.history() {
		if a.Outcome != budget.OutcomeFailed || a.Action != "refresh" || a.Holder != refreshed[0].name {
			t.Fatalf("act %+v: only the one failed refresh is recorded", a)
		}
	}
}

// TestFleetRefreshLostAnswer: under the budget too, a refresh whose
// answer was lost is found and waited for, never sent again, and its
// slot is held until its services are ready.
func TestFleetRefreshLostAnswer(t *testing.T) {
	b := newQueueBudget(1)
	ms := newFleet(t, 2, b, 15*time.Millisecond, fake.StoreRevision{Revision: "2", Version: "1.1"}, 5*time.Second)
	ms[0].srv.InjectFault(fake.Fault{Kind: fake.FaultLate, Method: "POST", Path: "/v2/snaps/svcdemo", Times: 1})
	for i, err := range refreshAll(ms) {
		if err != nil {
			t.Fatalf("%s: %v", ms[i].name, err)
		}
	}
	checkOneAtATime(t, ms)
	if n := ms[0].srv.Counters().Requests["POST /v2/snaps/svcdemo"]; n != 1 {
		t.Fatalf("%d refresh requests from the machine whose answer was lost, want 1", n)
	}
}

// TestBudgetedRefreshNoUpdate: a refresh with nothing newer gives its
// slots back at once and records no act.
func TestBudgetedRefreshNoUpdate(t *testing.T) {
	b := newQueueBudget(1)
	ms := newFleet(t, 1, b, time.Millisecond, fake.StoreRevision{Revision: "1", Version: "1.0"}, time.Second)
	res, err := ms[0].c.Refresh(context.Background(), "svcdemo", snapsvc.RefreshOptions{})
	if err != nil || !res.NoUpdate {
		t.Fatalf("refresh: %+v %v", res, err)
	}
	op, err := ms[0].c.RefreshAsync(context.Background(), "svcdemo", snapsvc.RefreshOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := op.Wait(doneCtx()); err != nil || !r.NoUpdate {
		t.Fatalf("async: %+v %v", r, err)
	}
	if len(b.history()) != 0 || b.holding("svcdemo.alpha")+b.holding("svcdemo.beta") != 0 || len(changesOf(ms[0].srv, "refresh-snap")) != 0 {
		t.Fatalf("acts %+v, slots held %d", b.history(), b.holding("svcdemo.alpha")+b.holding("svcdemo.beta"))
	}
}
