package etcdbudget_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Regression tests of issue 19, on real 3-member clusters.

// Names given in another order are one key (issue 19, defect 8).
func TestKeysNormalised(t *testing.T) {
	if k := etcdbudget.Key("k8s.kubelet", "k8s.kube-apiserver", "k8s.kubelet"); k != "k8s.kube-apiserver+k8s.kubelet" {
		t.Fatalf("Key = %q", k)
	}
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	a, err := newBudget(t, cli, "node-a", 1).Acquire(ctx, key+".a+"+key+".b", nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan acquired, 1)
	waits := make(chan budget.Wait, 10)
	acquireAsync(ctx, newBudget(t, cli, "node-b", 1), "node-b", key+".b+"+key+".a+"+key+".b", out, waits)
	select {
	case w := <-waits:
		if w.Key != a.Key() {
			t.Fatalf("waits on %q, the holder has %q", w.Key, a.Key())
		}
	case r := <-out:
		t.Fatalf("%s acquired %q while node-a holds %q", r.name, r.slot.Key(), a.Key())
	}
	a.Release(ctx)
	r := <-out
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.slot.Release(ctx)
	if err := etcdbudget.CheckKey("k8s.b+k8s.a"); err != nil {
		t.Errorf("CheckKey: %v", err)
	}
	for _, bad := range []string{"", "+", "a/b", "a#b", "a b"} {
		if _, err := newBudget(t, cli, "x", 1).Acquire(ctx, bad, nil); !errors.Is(err, budget.ErrRefused) {
			t.Errorf("key %q: %v, want a refusal", bad, err)
		}
		if err := etcdbudget.CheckKey(bad); err == nil {
			t.Errorf("CheckKey(%q) = nil", bad)
		}
	}
}

// A waiter that queued before a compaction, and then holds, is still
// told when its entry is deleted (issue 19, defect 6): its watch starts
// after the read that found it holding, and a compacted watch is read
// again, never taken for "closing".
func TestCompactionLossStillReported(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	first, err := newBudget(t, cli, "node-a", 1).Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan acquired, 1)
	waits := make(chan budget.Wait, 10)
	acquireAsync(ctx, newBudget(t, cli, "node-b", 1), "node-b", key, out, waits)
	<-waits
	// Writes elsewhere, then a compaction past node-b's enqueue, as
	// kube-apiserver compacts every 5 minutes.
	var rev int64
	for range 5 {
		r, err := cli.Put(ctx, "/other/"+key, "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	first.Release(ctx)
	r := <-out
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.slot.Release(ctx)
	if _, err := cli.Delete(ctx, etcdbudget.DefaultPrefix+key+"/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.slot.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("node-b's entry was deleted after a compaction, and it was never told")
	}
	if !errors.Is(r.slot.Err(), budget.ErrSlotLost) {
		t.Fatalf("Err %v", r.slot.Err())
	}
	// A compaction while waiting: the waiter is still served.
	second, err := newBudget(t, cli, "node-c", 1).Acquire(ctx, key+"-2", nil)
	if err != nil {
		t.Fatal(err)
	}
	acquireAsync(ctx, newBudget(t, cli, "node-d", 1), "node-d", key+"-2", out, waits)
	<-waits
	for range 3 {
		r, err := cli.Put(ctx, "/other/"+key, "y")
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	if _, err := cli.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	second.Release(ctx)
	if r := <-out; r.err != nil {
		t.Fatal(r.err)
	} else {
		r.slot.Release(ctx)
	}
}

// Permanent errors are refusals, kept apart from unreachability, with
// their cause, returned at once, and never granted under FailOpen (issue
// 19, defect 4).
func TestRefusals(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	open := func(c *etcdbudget.Config) { c.FailOpen = true; c.Unreachable = 10 * time.Second }

	t.Run("too large", func(t *testing.T) {
		b := newBudget(t, cli, strings.Repeat("h", 1600<<10), 1, open)
		start := time.Now()
		_, err := b.Acquire(ctx, key, nil)
		if !errors.Is(err, budget.ErrRefused) || errors.Is(err, budget.ErrUnavailable) || !strings.Contains(err.Error(), "too large") {
			t.Fatalf("want a refusal naming the cause, got %.300v", err)
		}
		// A retried refusal would take the 10s Unreachable; a loaded
		// machine may take seconds to answer.
		if d := time.Since(start); d > 9*time.Second {
			t.Errorf("refused after %s: retried a permanent error", d)
		}
		if st := b.Stats(); st.FailOpenGrants != 0 {
			t.Errorf("fail-open grant on a refusal: %+v", st)
		}
	})

	// queuedBehind has node-a hold key's one slot and name wait behind
	// it (fail open); it returns name's budget, its result and its queue
	// entry as etcd has it.
	queuedBehind := func(t *testing.T, name string) (*etcdbudget.Budget, chan acquired, *mvccpb.KeyValue, func()) {
		a, err := newBudget(t, cli, "node-a", 1).Acquire(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		out := make(chan acquired, 1)
		waits := make(chan budget.Wait, 10)
		b := newBudget(t, cli, name, 1, open)
		acquireAsync(ctx, b, name, key, out, waits)
		<-waits
		resp, err := cli.Get(ctx, etcdbudget.DefaultPrefix+key+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatal(resp, err)
		}
		return b, out, resp.Kvs[0], func() { a.Release(ctx) }
	}

	t.Run("entry deleted by an operator", func(t *testing.T) {
		_, out, kv, release := queuedBehind(t, "node-b")
		defer release()
		if _, err := cli.Delete(ctx, string(kv.Key)); err != nil {
			t.Fatal(err)
		}
		r := <-out
		if !errors.Is(r.err, budget.ErrRefused) || errors.Is(r.err, budget.ErrUnavailable) || !strings.Contains(r.err.Error(), "deleted") {
			t.Fatalf("want a refusal, got slot %v, %v", r.slot, r.err)
		}
	})

	t.Run("own lease expired while queued", func(t *testing.T) {
		// Not a refusal: the waiter was cut off or paused past its TTL,
		// so its place is lost and a later Acquire may succeed. (Seen in
		// TestRolloutFaults: "lease not found" reached a machine as a
		// non-retryable error and ended its rollout.)
		b, out, kv, release := queuedBehind(t, "node-c")
		defer release()
		if _, err := cli.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
			t.Fatal(err)
		}
		r := <-out
		if !errors.Is(r.err, budget.ErrUnavailable) || errors.Is(r.err, budget.ErrRefused) || r.slot != nil {
			t.Fatalf("want a retryable ErrBudgetUnavailable, got slot %v, %v", r.slot, r.err)
		}
		if st := b.Stats(); st.FailOpenGrants != 0 {
			t.Errorf("fail-open grant on an expired lease: %+v", st)
		}
	})

	// TLS and authentication failures: TestIsRefusal (a TLS handshake
	// failure reaches the budget only as a timeout: etcd's client waits
	// for a ready connection, see README).
}

// One member hung (SIGSTOP: it keeps its connections open and answers
// nothing), a follower, while two keep a quorum, with long-lived clients (issue 19,
// defects 1, 2 and 7): no holder loses its slot, FailOpen grants nothing,
// every acquire of a free key succeeds, Release returns promptly. The
// client's balancer keeps sending the hung member its share of requests
// until gRPC's keep-alive closes its connection (13 s), retries included:
// a request that got no answer sends the client's next ones around it, so
// a 2 s Unreachable bound is never reached with a quorum up. Then
// every member hung: Fence cannot confirm in time, a cancelled Acquire and
// a Release return at once.
func TestHungMember(t *testing.T) {
	p := newCluster(t)
	checkLeaks(t)
	ctx := ctxT(t, 2*time.Minute)
	const ttl = 3 * time.Second
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	// An Unreachable bound well under the keep-alive's 13 s: a request
	// must not wait for the hung connection to be closed.
	mod := func(c *etcdbudget.Config) { c.FailOpen = true; c.Unreachable = 2 * time.Second; c.LockDelay = -1 }
	var budgets []*etcdbudget.Budget
	tracked := func(holder string, mod ...func(*etcdbudget.Config)) *etcdbudget.Budget {
		b := newBudget(t, cli, holder, 1, mod...)
		budgets = append(budgets, b)
		return b
	}

	// Nine holders of nine keys, and one holder of the contended key.
	var holders []budget.Slot
	for i := range 10 {
		b := tracked("holder", mod)
		s, err := b.Acquire(ctx, key+"-"+string(rune('a'+i)), nil)
		if err != nil {
			t.Fatal(err)
		}
		holders = append(holders, s)
	}
	contended := holders[0].Key()
	// A follower: a hung leader also costs an election (seconds without
	// a leader), a genuine outage the Unreachable bound is for.
	hungMember := -1
	for i := range 3 {
		st, err := cli.Status(ctx, p.Endpoint(i))
		if err != nil {
			t.Fatal(err)
		}
		if st.Leader != st.Header.MemberId {
			hungMember = i
			break
		}
	}
	if err := p.Pause(hungMember); err != nil {
		t.Fatal(err)
	}
	defer p.Resume(hungMember)
	hung := time.Now()

	// Eight machines want the contended key for 6 s: none may get a slot.
	res := make(chan acquired, 8)
	var waiters []*etcdbudget.Budget
	for range 8 {
		b := tracked("waiter", mod)
		waiters = append(waiters, b)
		wctx, cancel := context.WithTimeout(ctx, 6*time.Second)
		defer cancel()
		acquireAsync(wctx, b, "waiter", contended, res, nil)
	}
	// Ten acquires of free keys succeed meanwhile.
	for i := range 10 {
		b := tracked("free", mod)
		s, err := b.Acquire(ctx, key+"-free-"+string(rune('a'+i)), nil)
		if err != nil {
			t.Fatalf("acquire %d of a free key with one member hung: %v", i, err)
		}
		if strings.Contains(s.Holder(), "unbudgeted") || b.Stats().FailOpenGrants != 0 {
			t.Errorf("acquire %d of a free key failed open with a quorum up", i)
		}
		if err := s.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	granted := 0
	for range 8 {
		r := <-res
		if r.err == nil {
			granted++
			t.Errorf("a waiter got %q while %q holds the only slot", r.slot.Holder(), holders[0].Holder())
			r.slot.Release(ctx)
		} else if !errors.Is(r.err, context.DeadlineExceeded) {
			t.Errorf("waiter: %v, want it still waiting at its deadline", r.err)
		}
	}
	for _, b := range waiters {
		if n := b.Stats().FailOpenGrants; n != 0 {
			t.Errorf("%d fail-open grants with a quorum up", n)
		}
	}
	var detours uint64
	for _, b := range budgets {
		detours += b.Stats().Detours
	}
	// The eight waiters and ten free acquires send dozens of requests, a
	// third of them to the hung member while nothing goes around it.
	if detours == 0 {
		t.Errorf("no request went around the hung member")
	}
	lost := 0
	for _, s := range holders {
		if _, err := s.(budget.Fencer).Fence(ctx); err != nil || s.Err() != nil {
			lost++
			t.Errorf("holder of %s: fence %v, lost %v", s.Key(), err, s.Err())
		}
	}
	t.Logf("one member hung %s: %d of 8 waiters granted, %d of 10 holders lost, 10 of 10 free acquires, %d detours", time.Since(hung).Round(time.Millisecond), granted, lost, detours)

	// Releases return promptly, and the key's next waiter is served.
	for i, s := range holders[1:] {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := s.Release(rctx)
		cancel()
		// Promptly: a release stuck on the hung member would take its
		// 20s context; 15s is a loaded machine's margin.
		if d := time.Since(start); err != nil || d > 15*time.Second {
			t.Errorf("release %d with a hung member: %v after %s", i, err, d)
		}
	}

	// A waiter queued (its lease granted), then etcd unreachable: every
	// member hung (no answer, no reset).
	wb := newBudget(t, cli, "late", 1, func(c *etcdbudget.Config) { c.LockDelay = -1; c.Unreachable = 30 * time.Second })
	wctx, cancel := context.WithCancel(ctx)
	lateWaits := make(chan budget.Wait, 10)
	acquireAsync(wctx, wb, "late", contended, res, lateWaits)
	<-lateWaits
	for i := range 3 {
		if i == hungMember {
			continue
		}
		if err := p.Pause(i); err != nil {
			t.Fatal(err)
		}
		defer p.Resume(i)
	}
	cancelled := time.Now()
	cancel()
	r := <-res
	// At once; ignoring the cancel would wait out the 30s Unreachable.
	if d := time.Since(cancelled); !errors.Is(r.err, context.Canceled) || d > 10*time.Second {
		t.Errorf("cancelled Acquire with etcd unreachable: %v after %s, want context.Canceled at once", r.err, d)
	}
	start := time.Now()
	_, err := holders[0].(budget.Fencer).Fence(ctx)
	d := time.Since(start)
	if err == nil || !(errors.Is(err, budget.ErrUnavailable) || errors.Is(err, budget.ErrSlotLost)) || d > ttl+5*time.Second {
		t.Errorf("fence with etcd unreachable: %v after %s, want unavailable (or lost) within the TTL (and a loaded machine's margin)", err, d)
	}
	t.Logf("etcd unreachable: fence said %q after %s", err, d.Round(time.Millisecond))
	start = time.Now()
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	holders[0].Release(rctx)
	rcancel()
	// Its 2s context bounds it; one ignoring it would hang on the hung
	// members. 8s of margin for a loaded machine.
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("release with etcd unreachable took %s, past its 2s context", d)
	}
}

// Two names whose keys are two spellings of one combined key take one
// slot (issue 26, defect 4: the core took "x+y" and "y+x" as two slots of
// one etcd key and waited behind itself until MaxWait).
func TestCoreCanonicalKeysOnEtcd(t *testing.T) {
	p := cluster(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	x, y := fmt.Sprintf("x%d", time.Now().UnixNano()), "y"
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kube-apiserver", Daemon: "simple", Enabled: true, Active: true},
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
	}}))
	keys := map[string]string{"k8s.kube-apiserver": x + "+" + y, "k8s.kubelet": y + "+" + x}
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(newBudget(t, cli, "node-a", 1), snapsvc.BudgetOptions{Key: func(n string) string { return keys[n] }, MaxWait: 5 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Restart(ctx, []string{"k8s.kube-apiserver", "k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatalf("restart of two names keyed %q: %v", keys, err)
	}
}
