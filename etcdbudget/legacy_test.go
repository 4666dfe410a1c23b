package etcdbudget_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
)

// v011 is a machine on etcdbudget v0.1.1 (git show v0.1.1's
// etcdbudget/budget.go: wait), as it queues and decides: an entry
// PREFIX/KEY/LEASE-SEQ on a lease of its own, valued {holder, max, since},
// holding a slot once fewer than max (the least of its own and the
// entries' ahead) entries created before it remain under PREFIX/KEY/.
type v011 struct {
	cli   *clientv3.Client
	key   string // as v0.1.1 was given it: a whole-snap restart's is the snap
	entry string
	lease clientv3.LeaseID
}

func queueV011(t *testing.T, ctx context.Context, cli *clientv3.Client, key, holder string) *v011 {
	t.Helper()
	l, err := cli.Grant(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	ka, err := cli.KeepAlive(ctx, l.ID)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range ka {
		}
	}()
	val, _ := json.Marshal(map[string]any{"holder": holder, "max": 1, "since": time.Now().UTC()})
	m := &v011{cli: cli, key: key, entry: fmt.Sprintf("%s%s/%016x-1", etcdbudget.DefaultPrefix, key, int64(l.ID)), lease: l.ID}
	if _, err := cli.Put(ctx, m.entry, string(val), clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.leave(context.Background()) })
	return m
}

// holds is v0.1.1's verdict: its entry among the first max of its key.
func (m *v011) holds(t *testing.T, ctx context.Context) bool {
	t.Helper()
	resp, err := m.cli.Get(ctx, etcdbudget.DefaultPrefix+m.key+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	idx := slices.IndexFunc(resp.Kvs, func(kv *mvccpb.KeyValue) bool { return string(kv.Key) == m.entry })
	if idx < 0 {
		t.Fatalf("v0.1.1 machine's entry %s is gone", m.entry)
	}
	limit := 1
	for _, kv := range resp.Kvs[:idx+1] {
		var e struct{ Max int }
		if json.Unmarshal(kv.Value, &e) == nil && e.Max > 0 {
			limit = min(limit, e.Max)
		}
	}
	return idx < limit
}

func (m *v011) leave(ctx context.Context) { m.cli.Revoke(ctx, m.lease) }

// Mixed versions: a fleet mid-upgrade from v0.1.1, Max 1. A v0.1.1
// machine restarting the whole snap holds its snap's key ("k8s"): a
// machine on this release restarting k8s.kubelet (its own key) waits for
// it, and takes the slot once it left. And the other way round: while
// this release holds k8s.kubelet, a v0.1.1 machine queued for "k8s"
// does not hold, by its own rule, until the slot is released. Issue 41,
// item 7: the two took different keys and restarted at once.
func TestLegacySnapKeyCountsBothWays(t *testing.T) {
	p := cluster(t)
	cli := client(t, p.Endpoints()...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	snap := fmt.Sprintf("legacy%d", time.Now().UnixNano())
	svc := snap + ".kubelet"
	b := newBudget(t, cli, "new-machine", 1)

	old := queueV011(t, ctx, cli, snap, "old-machine")
	if !old.holds(t, ctx) {
		t.Fatal("the v0.1.1 machine does not hold its key alone")
	}
	type got struct {
		s   budget.Slot
		err error
	}
	out := make(chan got, 1)
	waits := make(chan budget.Wait, 10)
	go func() {
		s, err := b.Acquire(ctx, svc, func(w budget.Wait) { waits <- w })
		out <- got{s, err}
	}()
	select {
	case w := <-waits:
		t.Logf("this release waits for %s behind %v", svc, w.Holders)
	case r := <-out:
		t.Fatalf("this release took %s (err %v) while a v0.1.1 machine restarts the whole snap under %q", svc, r.err, snap)
	}
	old.leave(ctx)
	r := <-out
	if r.err != nil {
		t.Fatal(r.err)
	}
	newer := queueV011(t, ctx, cli, snap, "old-machine-2")
	if newer.holds(t, ctx) {
		t.Errorf("a v0.1.1 machine holds %q by its own rule while this release holds %s", snap, svc)
	}
	if err := r.s.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !newer.holds(t, ctx) {
		t.Errorf("the v0.1.1 machine does not hold %q once this release released %s", snap, svc)
	}
	keys, err := b.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(keys, snap) {
		t.Errorf("Keys %v: want the v0.1.1 machine's key %q listed", keys, snap)
	}
}

// NoLegacyKeys counts no key of an earlier release (a fleet fully
// upgraded): a v0.1.1-style entry under the snap's key holds nothing
// back. Either way, two services of one snap restart on two machines at
// once: markers are not counted by this release.
func TestNoLegacyKeys(t *testing.T) {
	p := cluster(t)
	cli := client(t, p.Endpoints()...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	snap := fmt.Sprintf("nolegacy%d", time.Now().UnixNano())
	a := newBudget(t, cli, "a", 1, func(c *etcdbudget.Config) { c.LegacyKeys = etcdbudget.NoLegacyKeys })
	b := newBudget(t, cli, "b", 1, func(c *etcdbudget.Config) { c.LegacyKeys = etcdbudget.NoLegacyKeys })
	queueV011(t, ctx, cli, snap, "old-machine")
	sa, err := a.Acquire(ctx, snap+".kubelet", nil)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := b.Acquire(ctx, snap+".containerd", nil)
	if err != nil {
		t.Fatal(err)
	}
	sa.Release(ctx)
	sb.Release(ctx)
}
