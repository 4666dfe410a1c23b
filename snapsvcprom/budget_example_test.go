package snapsvcprom_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/snapsvcprom"
)

// oneSlot is a restart budget of one slot per key kept in memory: what
// etcdbudget keeps in etcd for a whole cluster. waiting is told each time
// someone starts waiting.
type oneSlot struct {
	mu      sync.Mutex
	holder  map[string]string
	freed   map[string]chan struct{}
	waiting chan string
}

func newOneSlot() *oneSlot {
	return &oneSlot{holder: map[string]string{}, freed: map[string]chan struct{}{}, waiting: make(chan string, 16)}
}

// take gives key's slot to holder; it reports false when it is taken.
func (b *oneSlot) take(key, holder string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, busy := b.holder[key]; busy {
		return false
	}
	b.holder[key], b.freed[key] = holder, make(chan struct{})
	return true
}

func (b *oneSlot) release(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, busy := b.holder[key]; busy {
		delete(b.holder, key)
		close(b.freed[key])
	}
}

func (b *oneSlot) Acquire(ctx context.Context, key string, progress func(snapsvc.BudgetWait)) (snapsvc.BudgetSlot, error) {
	for !b.take(key, "node-1") {
		b.mu.Lock()
		holder, freed := b.holder[key], b.freed[key]
		b.mu.Unlock()
		progress(snapsvc.BudgetWait{Key: key, Holders: []string{holder}, Max: 1})
		b.waiting <- key
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return &memSlot{b: b, key: key}, nil
}

type memSlot struct {
	b   *oneSlot
	key string
}

func (s *memSlot) Key() string                       { return s.key }
func (s *memSlot) Holder() string                    { return "node-1" }
func (s *memSlot) Lost() <-chan struct{}             { return nil }
func (s *memSlot) Err() error                        { return nil }
func (s *memSlot) Release(ctx context.Context) error { s.b.release(s.key); return nil }

// Restart budget metrics: the client passes ObserveBudget as its budget's
// Progress (and Observe as its observer). Here another machine, node-2,
// holds kubelet's only slot when the restart begins: the restart waits
// (budget_waiting is 1), node-2 gives the slot back, the restart takes it,
// restarts kubelet and gives it back. WithConstLabels tells this client's
// series from another's.
func ExampleMetrics_ObserveBudget() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
	}}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	reg := prometheus.NewRegistry()
	m := snapsvcprom.New(snapsvcprom.WithConstLabels(prometheus.Labels{"client": "controller"}))
	reg.MustRegister(m)
	budget := newOneSlot()
	budget.take("k8s.kubelet", "node-2")
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithoutFileLock(), snapsvc.WithObserver(m.Observe),
		snapsvc.WithRestartBudget(budget, snapsvc.BudgetOptions{Progress: m.ObserveBudget}))
	if err != nil {
		log.Fatal(err)
	}

	go func() {
		<-budget.waiting // the restart waits behind node-2
		err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP snapsvc_budget_waiting 1 while an operation waits for a restart budget slot of the key, else 0.
# TYPE snapsvc_budget_waiting gauge
snapsvc_budget_waiting{client="controller",key="k8s.kubelet"} 1
`), "snapsvc_budget_waiting")
		fmt.Println("waiting behind node-2:", err == nil)
		budget.release("k8s.kubelet") // node-2 is done
	}()
	if _, err := c.Restart(context.Background(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		log.Fatal(err)
	}
	c.Close() // waits for the slot to be given back

	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP snapsvc_budget_acquired_total Restart budget slots taken.
# TYPE snapsvc_budget_acquired_total counter
snapsvc_budget_acquired_total{client="controller",key="k8s.kubelet"} 1
# HELP snapsvc_budget_slots_held Restart budget slots of the key held now: taken and not yet given back or lost.
# TYPE snapsvc_budget_slots_held gauge
snapsvc_budget_slots_held{client="controller",key="k8s.kubelet"} 0
# HELP snapsvc_budget_waiting 1 while an operation waits for a restart budget slot of the key, else 0.
# TYPE snapsvc_budget_waiting gauge
snapsvc_budget_waiting{client="controller",key="k8s.kubelet"} 0
# HELP snapsvc_operations_total Service operations (start, stop, restart) ended, by action and outcome.
# TYPE snapsvc_operations_total counter
snapsvc_operations_total{action="restart",client="controller",outcome="done"} 1
`), "snapsvc_budget_acquired_total", "snapsvc_budget_slots_held", "snapsvc_budget_waiting", "snapsvc_operations_total")
	fmt.Println("metrics as expected:", err == nil)
	for _, h := range []string{"snapsvc_budget_wait_seconds", "snapsvc_budget_hold_seconds"} {
		n, _ := testutil.GatherAndCount(reg, h)
		fmt.Println(h, "series:", n)
	}
	// Output:
	// waiting behind node-2: true
	// metrics as expected: true
	// snapsvc_budget_wait_seconds series: 1
	// snapsvc_budget_hold_seconds series: 1
}
