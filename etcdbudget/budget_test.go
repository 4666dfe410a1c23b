package etcdbudget_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

var (
	sharedOnce sync.Once
	shared     *etcdtest.Processes
	sharedErr  error
)

func TestMain(m *testing.M) {
	etcdtest.MaybeRunMember()
	maybeRunMachine()
	maybeRunHolder()
	etcdtest.BuildMember() // before any timed cluster start
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	os.Exit(code)
}

// cluster returns the package's 3-member cluster (member processes),
// started on first use.
func cluster(t testing.TB) *etcdtest.Processes {
	t.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared, sharedErr = etcdtest.StartProcesses(ctx, 3)
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func newCluster(t *testing.T) *etcdtest.Processes {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := etcdtest.StartProcesses(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func client(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := newClient(endpoints)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// newClient is an etcd client with etcdbudget's defaults (gRPC
// keep-alive), as a daemon would build it.
func newClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(etcdbudget.ClientConfig(endpoints))
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// checkLeaks verifies, at the end of the test (after the clients it made
// are closed), that no goroutine of ours is left.
func checkLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// uniqueKey keeps tests sharing the cluster apart.
func uniqueKey(t *testing.T) string {
	return strings.ReplaceAll(t.Name(), "/", "-") + fmt.Sprintf("-%d", time.Now().UnixNano())
}

func newBudget(t testing.TB, cli *clientv3.Client, holder string, max int, mod ...func(*etcdbudget.Config)) *etcdbudget.Budget {
	t.Helper()
	cfg := etcdbudget.Config{Client: cli, Holder: holder, Max: max, TTL: 3 * time.Second, Unreachable: 2 * time.Second}
	for _, f := range mod {
		f(&cfg)
	}
	b, err := etcdbudget.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type acquired struct {
	name string
	slot budget.Slot
	err  error
}

// acquireAsync acquires in a goroutine; waits reports each progress call.
func acquireAsync(ctx context.Context, b *etcdbudget.Budget, name, key string, out chan<- acquired, waits chan<- budget.Wait) {
	go func() {
		s, err := b.Acquire(ctx, key, func(w budget.Wait) {
			if waits != nil {
				waits <- w
			}
		})
		out <- acquired{name, s, err}
	}()
}

func TestFIFOAndHolders(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	first, err := newBudget(t, cli, "node-a", 1).Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan acquired, 3)
	for i, name := range []string{"node-b", "node-c", "node-d"} {
		waits := make(chan budget.Wait, 10)
		acquireAsync(ctx, newBudget(t, cli, name, 1), name, key, out, waits)
		w := <-waits // queued: the next one enqueues strictly after it
		if w.Ahead != i || !slices.Equal(w.Holders, []string{"node-a"}) || w.Max != 1 {
			t.Fatalf("%s waits %+v, want %d ahead behind node-a", name, w, i)
		}
	}
	holding, waiting, err := newBudget(t, cli, "x", 1).Holders(ctx, key)
	if err != nil || !slices.Equal(holding, []string{"node-a"}) || !slices.Equal(waiting, []string{"node-b", "node-c", "node-d"}) {
		t.Fatalf("Holders: %q %q %v", holding, waiting, err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"node-b", "node-c", "node-d"} {
		a := <-out
		if a.err != nil || a.name != want {
			t.Fatalf("got %s (%v), want %s next", a.name, a.err, want)
		}
		if a.slot.Holder() != want || a.slot.Key() != key {
			t.Fatalf("slot %s/%s", a.slot.Holder(), a.slot.Key())
		}
		if err := a.slot.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMaxTwo(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	var slots []budget.Slot
	for _, n := range []string{"node-a", "node-b"} {
		s, err := newBudget(t, cli, n, 2).Acquire(ctx, key, func(w budget.Wait) { t.Errorf("%s had to wait: %+v", n, w) })
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	out := make(chan acquired, 1)
	waits := make(chan budget.Wait, 10)
	acquireAsync(ctx, newBudget(t, cli, "node-c", 2), "node-c", key, out, waits)
	if w := <-waits; w.Ahead != 0 || !slices.Equal(w.Holders, []string{"node-a", "node-b"}) || w.Max != 2 {
		t.Fatalf("node-c waits %+v", w)
	}
	if err := slots[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-out
	if a.err != nil {
		t.Fatal(a.err)
	}
	for _, s := range []budget.Slot{slots[0], a.slot} {
		if err := s.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Machines configured with different Max values for one key: the later
// one is refused (permanent, cause named), not silently given the
// smallest (issue 19).
func TestMaxMismatchRefused(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	sa, err := newBudget(t, cli, "node-a", 1).Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sa.Release(ctx)
	b := newBudget(t, cli, "node-b", 2, func(c *etcdbudget.Config) { c.FailOpen = true })
	_, err = b.Acquire(ctx, key, nil)
	if !errors.Is(err, budget.ErrRefused) || errors.Is(err, budget.ErrUnavailable) || !strings.Contains(err.Error(), "Max 1") {
		t.Fatalf("want a refusal naming the other Max, got %v", err)
	}
	if st := b.Stats(); st.FailOpenGrants != 0 || st.Refused != 1 {
		t.Fatalf("stats %+v: a refusal must never fail open", st)
	}
	_, waiting, err := b.Holders(ctx, key)
	if err != nil || len(waiting) != 0 {
		t.Fatalf("the refused waiter left its entry: %q %v", waiting, err)
	}
}

func TestCancelledWaiterLeavesNoEntry(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	first, err := newBudget(t, cli, "node-a", 1).Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	out := make(chan acquired, 2)
	waits := make(chan budget.Wait, 10)
	acquireAsync(wctx, newBudget(t, cli, "node-b", 1), "node-b", key, out, waits)
	<-waits
	waitsC := make(chan budget.Wait, 10)
	acquireAsync(ctx, newBudget(t, cli, "node-c", 1), "node-c", key, out, waitsC)
	if w := <-waitsC; w.Ahead != 1 {
		t.Fatalf("node-c waits %+v, want behind node-b", w)
	}
	cancel()
	if a := <-out; a.name != "node-b" || !errors.Is(a.err, context.Canceled) {
		t.Fatalf("cancelled waiter: %s %v", a.name, a.err)
	}
	if w := <-waitsC; w.Ahead != 0 {
		t.Fatalf("node-c still waits behind the cancelled one: %+v", w)
	}
	_, waiting, err := newBudget(t, cli, "x", 1).Holders(ctx, key)
	if err != nil || !slices.Equal(waiting, []string{"node-c"}) {
		t.Fatalf("waiting %q %v: the cancelled waiter's entry should be gone", waiting, err)
	}
	first.Release(ctx)
	a := <-out
	if a.err != nil || a.name != "node-c" {
		t.Fatalf("%s %v", a.name, a.err)
	}
	a.slot.Release(ctx)
}

func TestSlotLostWhenEntryDeleted(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	s, err := newBudget(t, cli, "node-a", 1).Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, etcdbudget.DefaultPrefix+key+"/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Lost():
	case <-ctx.Done():
		t.Fatal("slot not reported lost")
	}
	if !errors.Is(s.Err(), budget.ErrSlotLost) || !strings.Contains(s.Err().Error(), "deleted") {
		t.Fatalf("Err %v", s.Err())
	}
	s.Release(ctx)
}

func TestSlotLostWhenLeaseRevoked(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	s, err := newBudget(t, cli, "node-a", 1).Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, etcdbudget.DefaultPrefix+key+"/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("entries %v %v", resp, err)
	}
	found := false
	for _, l := range leases.Leases {
		if l.ID == clientv3.LeaseID(resp.Kvs[0].Lease) {
			found = true
		}
	}
	if !found {
		t.Fatal("the entry is not bound to a live lease")
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	<-s.Lost()
	if !errors.Is(s.Err(), budget.ErrSlotLost) {
		t.Fatalf("Err %v", s.Err())
	}
	s.Release(ctx)
}

// deadEndpoint is a loopback address where nothing listens.
func deadEndpoint(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func TestUnreachableFailsClosed(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	cli := client(t, deadEndpoint(t))
	b := newBudget(t, cli, "node-a", 1, func(c *etcdbudget.Config) { c.Unreachable = time.Second })
	start := time.Now()
	_, err := b.Acquire(ctx, "k8s.kube-apiserver", nil)
	if !errors.Is(err, budget.ErrUnavailable) {
		t.Fatalf("want ErrBudgetUnavailable, got %v", err)
	}
	// The bound is Unreachable; allow generously for a loaded machine,
	// but not for an unbounded wait.
	if waited := time.Since(start); waited < time.Second || waited > 10*time.Second {
		t.Fatalf("failed after %s, want about the 1s bound", waited)
	}

	// Through snapsvc: retryable, names the key, nothing restarted.
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kube-apiserver", Daemon: "simple", Active: true}}}))
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	if !errors.As(err, &opErr) || !opErr.Retryable() || !strings.Contains(err.Error(), "restart budget k8s.kube-apiserver") {
		t.Fatalf("want a retryable OpError naming the budget key, got %v", err)
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("%d changes made without a slot", n)
	}
}

func TestUnreachableFailOpenAndNoCluster(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	cli := client(t, deadEndpoint(t))
	open := newBudget(t, cli, "node-a", 1, func(c *etcdbudget.Config) { c.Unreachable = time.Second; c.FailOpen = true })
	s, err := open.Acquire(ctx, "k8s.kube-apiserver", nil)
	if err != nil || !strings.Contains(s.Holder(), "fail open") {
		t.Fatalf("fail open: %v %v", s, err)
	}
	s.Release(ctx)

	// Before any cluster exists the check comes first: no wait at all,
	// although the bound here is an hour.
	asked := 0
	boot := newBudget(t, cli, "node-a", 1, func(c *etcdbudget.Config) {
		c.Unreachable = time.Hour
		c.ClusterExists = func(context.Context) bool { asked++; return false }
	})
	s, err = boot.Acquire(ctx, "k8s.kube-apiserver", nil)
	if err != nil || !strings.Contains(s.Holder(), "no cluster yet") || asked != 1 {
		t.Fatalf("no cluster yet: %v %v (asked %d)", s, err, asked)
	}
	s.Release(ctx)

	// Through snapsvc, each unbudgeted grant leads to its restart (issue
	// 33, defect 1: its fence confirmed for 1<<63-1 ns, the send-by
	// overflowed and every write was refused until the call gave up).
	for name, b := range map[string]*etcdbudget.Budget{"fail open": open, "no cluster yet": boot} {
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kube-apiserver", Daemon: "simple", Active: true}}}))
		c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
		c.Close()
		if err != nil || res.Status != "Done" {
			t.Errorf("%s: restart: %+v, %v", name, res, err)
		}
		if n := len(srv.Changes()); n != 1 {
			t.Errorf("%s: %d changes made, want the restart's one", name, n)
		}
	}
}
