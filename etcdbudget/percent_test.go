package etcdbudget_test

// Tests of percentage budgets on real etcd: the machines that join over
// the join period count, and a lost pin.

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget"
)

// A percentage is resolved over the machines that joined within the join
// period: ten machines at 50% started 100ms apart run five at a time
// (issue 26, defect 3: the first machine resolved 50% of 1 and the ten
// half-second holds ran one at a time).
func TestPercentageJoinPeriod(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, 2*time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	const n, hold = 10, 500 * time.Millisecond
	var mu sync.Mutex
	holding, peak := 0, 0
	var wg sync.WaitGroup
	errs := make(chan error, n+1)
	var cs []*etcdbudget.Controlled
	start := time.Now()
	machine := func(name string) {
		defer wg.Done()
		c, err := etcdbudget.NewControlled(etcdbudget.Config{Client: cli, Holder: name, TTL: 3 * time.Second, Unreachable: 5 * time.Second},
			etcdbudget.Controls{MaxUnavailable: etcdbudget.MaxUnavailable{Percent: 50}, JoinPeriod: 1500 * time.Millisecond})
		if err != nil {
			errs <- err
			return
		}
		mu.Lock()
		cs = append(cs, c)
		mu.Unlock()
		s, err := c.Acquire(ctx, key, nil)
		if err != nil {
			errs <- fmt.Errorf("%s: %w", name, err)
			return
		}
		mu.Lock()
		holding++
		peak = max(peak, holding)
		mu.Unlock()
		time.Sleep(hold) // the restart's duration, not a synchronisation
		mu.Lock()
		holding--
		mu.Unlock()
		if err := s.Release(ctx); err != nil {
			errs <- err
		}
	}
	for i := range n {
		wg.Add(1)
		go machine(fmt.Sprintf("node-%d", i))
		time.Sleep(100 * time.Millisecond) // machines joining over a second
	}
	wg.Wait()
	took := time.Since(start)
	// One more machine after the pin: it uses it, it never makes it 6.
	wg.Add(1)
	machine("late")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st, err := cs[0].Budget().Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		c.Close()
	}
	t.Logf("pin %+v; at most %d holding at once; ten holds of %s took %s (join period 1.5s)", st.Pinned, peak, hold, took.Round(time.Millisecond))
	if st.Pinned == nil || st.Pinned.Max != 5 || st.Pinned.Participants != n {
		t.Fatalf("pinned %+v, want 50%% of the 10 machines that joined: 5", st.Pinned)
	}
	if peak > 5 || peak < 2 {
		t.Fatalf("at most %d machines held a slot at once, want up to 5 (and more than 1)", peak)
	}
}

// A pin lost while machines hold slots (every participant cut off from
// etcd for a TTL: the pin's lease expired) is made again with the Max of
// the machines in the queue, not re-counted over whoever is registered
// now: a count that differs from the holders' would refuse every machine
// that resolved it (found by TestRolloutFaults with a random seed: three
// machines resolved 40% of the two left and were refused).
func TestPercentagePinLost(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	forty := etcdbudget.Controls{MaxUnavailable: etcdbudget.MaxUnavailable{Percent: 40}, JoinPeriod: -1}
	cfg := func(h string) etcdbudget.Config {
		return etcdbudget.Config{Client: cli, Holder: h, TTL: 3 * time.Second, Unreachable: 2 * time.Second}
	}
	a, err := etcdbudget.NewControlled(cfg("node-a"), forty)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var others []*etcdbudget.Participation
	for _, h := range []string{"node-b", "node-c", "node-d", "node-e"} {
		part, err := newBudget(t, cli, h, 1).Join(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, part)
	}
	s, err := a.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	for _, part := range others {
		part.Close()
	}
	if _, err := cli.Delete(ctx, etcdbudget.DefaultPrefix+key+"#max"); err != nil { // as its lease expiring would
		t.Fatal(err)
	}
	b, err := etcdbudget.NewControlled(cfg("node-f"), forty)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	s2, err := b.Acquire(ctx, key, nil) // Max 2: a second slot, at once
	if err != nil {
		t.Fatalf("a machine joining after the pin was lost: %v", err)
	}
	defer s2.Release(ctx)
	st, err := a.Budget().Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Pinned == nil || st.Pinned.Max != 2 || len(st.Holders) != 2 {
		t.Fatalf("pin %+v, holders %q: want the rollout's 2 pinned again and both holding", st.Pinned, holdersOf(st.Holders))
	}
}
