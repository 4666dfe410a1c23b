package etcdbudget_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func holdersOf(es []etcdbudget.Entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Holder)
	}
	return out
}

// waitFor reads from waits until one satisfies ok.
func waitFor(ctx context.Context, t *testing.T, waits <-chan budget.Wait, what string, ok func(budget.Wait) bool) budget.Wait {
	t.Helper()
	for {
		select {
		case w := <-waits:
			if ok(w) {
				return w
			}
		case <-ctx.Done():
			t.Fatalf("never saw %s", what)
		}
	}
}

func pausedWait(w budget.Wait) bool {
	return len(w.Holders) == 1 && strings.HasPrefix(w.Holders[0], "paused by operator")
}

// Status shows holders with since and waiters in order; a pause holds the
// next machine at the front of the queue, with its slot, until resumed,
// and the machines behind it stay queued.
func TestStatusPauseResume(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	before := time.Now().UTC()
	first, err := newBudget(t, cli, "node-a", 1).Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan acquired, 2)
	waitsB := make(chan budget.Wait, 10)
	acquireAsync(ctx, newBudget(t, cli, "node-b", 1), "node-b", key, out, waitsB)
	<-waitsB
	waitsC := make(chan budget.Wait, 10)
	acquireAsync(ctx, newBudget(t, cli, "node-c", 1), "node-c", key, out, waitsC)
	<-waitsC

	op := newBudget(t, cli, "operator", 1)
	st, err := op.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if got := holdersOf(st.Holders); !slices.Equal(got, []string{"node-a"}) || st.Max != 1 {
		t.Fatalf("holders %q max %d, want [node-a] 1", got, st.Max)
	}
	if got := holdersOf(st.Waiters); !slices.Equal(got, []string{"node-b", "node-c"}) {
		t.Fatalf("waiters %q, want [node-b node-c] in order", got)
	}
	if h := st.Holders[0]; h.Since.Before(before.Add(-time.Second)) || h.Lease == 0 || st.Paused != nil {
		t.Fatalf("holder %+v (since should be after %s), paused %+v", h, before, st.Paused)
	}

	rec, err := op.Pause(ctx, key, "investigating node-a")
	if err != nil || rec.By != "operator" || rec.Reason != "investigating node-a" {
		t.Fatalf("Pause: %+v %v", rec, err)
	}
	if again, err := newBudget(t, cli, "someone-else", 1).Pause(ctx, key, "x"); err != nil || again.By != "operator" {
		t.Fatalf("a second Pause must keep the first record: %+v %v", again, err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// node-b is at the front with the slot, held back by the pause.
	waitFor(ctx, t, waitsB, "node-b told of the pause", pausedWait)
	select {
	case a := <-out:
		t.Fatalf("%s returned while the key is paused: %v", a.name, a.err)
	default:
	}
	st, err = op.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Paused == nil || st.Paused.By != "operator" || !slices.Equal(holdersOf(st.Holders), []string{"node-b"}) || !slices.Equal(holdersOf(st.Waiters), []string{"node-c"}) {
		t.Fatalf("paused status: paused %+v holders %q waiters %q", st.Paused, holdersOf(st.Holders), holdersOf(st.Waiters))
	}

	if was, err := op.Resume(ctx, key); err != nil || !was {
		t.Fatalf("Resume: %v %v", was, err)
	}
	b := <-out
	if b.name != "node-b" || b.err != nil {
		t.Fatalf("after resume %s got %v, want node-b with a slot", b.name, b.err)
	}
	if err := b.slot.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c := <-out
	if c.name != "node-c" || c.err != nil {
		t.Fatalf("then %s got %v, want node-c with a slot", c.name, c.err)
	}
	if err := c.slot.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if was, err := op.Resume(ctx, key); err != nil || was {
		t.Fatalf("Resume of a key not paused: %v %v", was, err)
	}
}

// A cancelled Acquire held back by a pause gives its slot back.
func TestPausedAcquireCancelled(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	op := newBudget(t, cli, "operator", 1)
	if _, err := op.Pause(ctx, key, ""); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	out := make(chan acquired, 1)
	waits := make(chan budget.Wait, 10)
	acquireAsync(actx, newBudget(t, cli, "node-a", 1), "node-a", key, out, waits)
	waitFor(ctx, t, waits, "node-a told of the pause", pausedWait)
	cancel()
	if a := <-out; !errors.Is(a.err, context.Canceled) {
		t.Fatalf("want the context's error, got %v", a.err)
	}
	st, err := op.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Holders)+len(st.Waiters) != 0 {
		t.Fatalf("entries left after a cancelled, paused Acquire: %q %q", holdersOf(st.Holders), holdersOf(st.Waiters))
	}
	if _, err := op.Resume(ctx, key); err != nil {
		t.Fatal(err)
	}
}

func TestMaxUnavailableOf(t *testing.T) {
	for _, tc := range []struct {
		spec         string
		participants int
		want         int
	}{
		{"2", 10, 2}, {"1", 0, 1}, {"25%", 3, 1}, {"25%", 8, 2}, {"25%", 10, 2}, {"50%", 4, 2},
		{"10%", 4, 1}, {"100%", 5, 5}, {"34%", 3, 1},
	} {
		m, err := etcdbudget.ParseMaxUnavailable(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Of(tc.participants); got != tc.want || m.String() != tc.spec {
			t.Errorf("%s of %d = %d (%s), want %d", tc.spec, tc.participants, got, m, tc.want)
		}
	}
	for _, bad := range []string{"0", "-1", "0%", "101%", "x", "", "5.5%"} {
		if _, err := etcdbudget.ParseMaxUnavailable(bad); err == nil {
			t.Errorf("ParseMaxUnavailable(%q) accepted", bad)
		}
	}
}

// A percentage is resolved over the machines registered for the key, once,
// and pinned: every machine then uses the same count; a machine asking for
// another percentage is refused.
func TestMaxUnavailablePercentage(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	cfg := func(holder string) etcdbudget.Config {
		return etcdbudget.Config{Client: cli, Holder: holder, TTL: 3 * time.Second, Unreachable: 2 * time.Second}
	}
	half := etcdbudget.MaxUnavailable{Percent: 50}
	var machines []*etcdbudget.Controlled
	for _, h := range []string{"node-a", "node-b", "node-c", "node-d"} {
		// No join period: resolved by the first to ask (the join period
		// is TestPercentageJoinPeriod's).
		c, err := etcdbudget.NewControlled(cfg(h), etcdbudget.Controls{MaxUnavailable: half, JoinPeriod: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		machines = append(machines, c)
	}
	// node-c and node-d register first (as they would on starting their
	// rollout); node-a resolves 50% of the 3 registered then: 1.
	for _, c := range machines[2:] {
		part, err := c.Budget().Join(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { part.Close() })
	}
	a, err := machines[0].Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	op := newBudget(t, cli, "operator", 1)
	st, err := op.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pinned == nil || st.Pinned.Max != 1 || st.Pinned.Participants != 3 || st.Pinned.Spec != "50%" || st.Max != 1 || len(st.Participants) != 3 {
		t.Fatalf("pinned %+v max %d participants %d; want 50%% of 3 = 1", st.Pinned, st.Max, len(st.Participants))
	}
	// node-b joins later: the pin holds, it waits behind node-a.
	out := make(chan acquired, 1)
	waits := make(chan budget.Wait, 10)
	go func() {
		s, err := machines[1].Acquire(ctx, key, func(w budget.Wait) { waits <- w })
		out <- acquired{"node-b", s, err}
	}()
	if w := <-waits; w.Max != 1 || !slices.Equal(w.Holders, []string{"node-a"}) {
		t.Fatalf("node-b waits %+v, want behind node-a with max 1", w)
	}
	// Another percentage is refused.
	other, err := etcdbudget.NewControlled(cfg("node-e"), etcdbudget.Controls{MaxUnavailable: etcdbudget.MaxUnavailable{Percent: 25}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Acquire(ctx, key, nil); !errors.Is(err, budget.ErrRefused) {
		t.Fatalf("a machine with another percentage: want ErrBudgetRefused, got %v", err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-out
	if b.err != nil {
		t.Fatal(b.err)
	}
	if err := b.slot.Release(ctx); err != nil {
		t.Fatal(err)
	}
	m := machines[0].Metrics()
	if m.Acquired != 1 || m.Released != 1 || m.Holding != 0 || m.Waiting != 0 {
		t.Fatalf("node-a metrics %+v", m)
	}
	if m := other.Metrics(); m.Failed != 1 || m.Acquired != 0 {
		t.Fatalf("node-e metrics %+v", m)
	}
}

// Outside its maintenance window a machine does not queue; it takes its
// slot once the window opens, on the injected clock.
func TestWindowWaits(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	w, err := etcdbudget.ParseWindow("Mon-Fri 22:00-04:00 Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	berlin, _ := time.LoadLocation("Europe/Berlin")
	t0 := time.Date(2026, 12, 4, 21, 0, 0, 0, berlin) // a Friday, an hour before
	mc := fake.NewManualClock(t0)
	var evMu sync.Mutex
	var events []etcdbudget.Event
	c, err := etcdbudget.NewControlled(etcdbudget.Config{Client: cli, Holder: "node-a", TTL: 3 * time.Second, Unreachable: 2 * time.Second},
		etcdbudget.Controls{Window: w, Clock: testclock.Of(mc), OnEvent: func(ev etcdbudget.Event) {
			evMu.Lock()
			events = append(events, ev)
			evMu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	out := make(chan acquired, 1)
	waits := make(chan budget.Wait, 10)
	go func() {
		s, err := c.Acquire(ctx, key, func(w budget.Wait) { waits <- w })
		out <- acquired{"node-a", s, err}
	}()
	wt := <-waits
	if len(wt.Holders) != 1 || !strings.Contains(wt.Holders[0], "outside the maintenance window") {
		t.Fatalf("wait %+v", wt)
	}
	testclock.WaitTimerAt(ctx, t, mc, t0.Add(time.Hour))
	if st, err := c.Budget().Status(ctx, key); err != nil || len(st.Holders)+len(st.Waiters) != 0 {
		t.Fatalf("queued outside the window: %+v %v", st, err)
	}
	if m := c.Metrics(); m.Waiting != 1 || m.WindowWaits != 1 {
		t.Fatalf("metrics while waiting %+v", m)
	}
	mc.Advance(time.Hour)
	a := <-out
	if a.err != nil {
		t.Fatal(a.err)
	}
	if err := a.slot.Release(ctx); err != nil {
		t.Fatal(err)
	}
	evMu.Lock()
	defer evMu.Unlock()
	var kinds []string
	for _, ev := range events {
		kinds = append(kinds, ev.Kind)
	}
	if !slices.Equal(kinds, []string{"window", "acquired", "released"}) || !events[0].Opens.Equal(t0.Add(time.Hour)) {
		t.Fatalf("events %q (opens %s)", kinds, events[0].Opens)
	}
}

// Metrics count a slot lost while held (its entry deleted by an
// operator), with its hold time, and the "lost" event.
func TestControlledMetricsLost(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	lost := make(chan etcdbudget.Event, 1)
	c, err := etcdbudget.NewControlled(etcdbudget.Config{Client: cli, Holder: "node-a", TTL: 3 * time.Second, Unreachable: 2 * time.Second},
		etcdbudget.Controls{MaxUnavailable: etcdbudget.MaxUnavailable{Count: 2}, OnEvent: func(ev etcdbudget.Event) {
			if ev.Kind == "lost" {
				lost <- ev
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Budget().Status(ctx, key)
	if err != nil || len(st.Holders) != 1 || st.Max != 2 {
		t.Fatalf("status %+v %v", st, err)
	}
	if _, err := cli.Delete(ctx, st.Holders[0].Key); err != nil { // an operator removes it
		t.Fatal(err)
	}
	var ev etcdbudget.Event
	select {
	case ev = <-lost:
	case <-ctx.Done():
		t.Fatal("no lost event")
	}
	if !errors.Is(ev.Err, budget.ErrSlotLost) || ev.Held <= 0 || ev.Max != 2 {
		t.Fatalf("lost event %+v", ev)
	}
	_ = s.Release(ctx)
	if m := c.Metrics(); m.Lost != 1 || m.Holding != 0 || m.Released != 0 || m.HoldSeconds <= 0 {
		t.Fatalf("metrics %+v", m)
	}
}

// With one etcd member hung (SIGSTOP: a frozen machine, no RST), the
// operator commands still answer: each attempt is bounded, and one that
// hung sends the next ones around the hung member.
func TestControlsWithHungMember(t *testing.T) {
	p := newCluster(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	b := newBudget(t, cli, "operator", 1, func(c *etcdbudget.Config) { c.Unreachable = 10 * time.Second })
	if _, err := b.Status(ctx, key); err != nil { // connections to every member are up
		t.Fatal(err)
	}
	pid := p.Pid(0)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	var slowest time.Duration
	for i := range 6 { // the balancer sends some to the hung member
		start := time.Now()
		var err error
		switch i % 3 {
		case 0:
			_, err = b.Status(ctx, key)
		case 1:
			_, err = b.Pause(ctx, key, "")
		case 2:
			_, err = b.Resume(ctx, key)
		}
		if err != nil {
			t.Fatalf("request %d with a hung member: %v", i, err)
		}
		slowest = max(slowest, time.Since(start))
	}
	t.Logf("slowest operator request with one member hung: %s", slowest.Round(time.Millisecond))
}

// Keys lists every key with anything under the budget's prefix (a holder,
// a pause), each once, sorted; keys that share a beginning stay apart.
func TestKeys(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	prefix := "/" + uniqueKey(t) + "/"
	b := newBudget(t, cli, "node-a", 1, func(c *etcdbudget.Config) { c.Prefix = prefix })
	if keys, err := b.Keys(ctx); err != nil || len(keys) != 0 {
		t.Fatalf("empty budget: %q, %v", keys, err)
	}
	slot, err := b.Acquire(ctx, "k8s.kubelet", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer slot.Release(ctx)
	if _, err := b.Pause(ctx, "k8s", "testing"); err != nil {
		t.Fatal(err)
	}
	keys, err := b.Keys(ctx)
	if err != nil || !slices.Equal(keys, []string{"k8s", "k8s.kubelet"}) {
		t.Fatalf("keys %q, %v; want [k8s k8s.kubelet]", keys, err)
	}
}

// Closing a participation whose lease is already gone (expired, or
// revoked by an operator) is no error: it has left the rollout.
func TestParticipationCloseWithItsLeaseGone(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	part, err := newBudget(t, cli, "node-a", 1).Join(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := cli.Get(ctx, etcdbudget.DefaultPrefix+key+"#participants/node-a")
	if err != nil || len(reg.Kvs) != 1 {
		t.Fatalf("registration: %v, %v", reg, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(reg.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	if err := part.Close(); err != nil {
		t.Fatalf("Close with the lease gone: %v", err)
	}
}
