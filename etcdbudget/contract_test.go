package etcdbudget_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/testsupport/budgetcontract"
)

// contractTTL is the lease TTL of the contract's participants (etcd's
// minimum with its default timing).
const contractTTL = 2 * time.Second

// etcdHarness runs the budget contract's participants on the package's
// real 3-member cluster, each with an etcd client of its own (one
// machine each).
type etcdHarness struct {
	p   *etcdtest.Processes
	ctl *etcdbudget.Budget
}

// etcdParticipant is a Budget on a client of its own; Vanish closes the
// client, so its leases are neither renewed nor revoked (a crash).
type etcdParticipant struct {
	*etcdbudget.Budget
	cli *clientv3.Client
}

func (p *etcdParticipant) Vanish() { p.cli.Close() }

func (h *etcdHarness) New(t *testing.T, o budgetcontract.Options) budgetcontract.Participant {
	t.Helper()
	cli, err := newClient(h.p.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ld := o.LockDelay
	if ld == 0 {
		ld = -1
	}
	b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Holder: o.Holder, Max: o.Max, TTL: contractTTL, LockDelay: ld, Unreachable: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return &etcdParticipant{Budget: b, cli: cli}
}

func (h *etcdHarness) Pause(t *testing.T, key string) {
	t.Helper()
	if _, err := h.ctl.Pause(context.Background(), key, "contract"); err != nil {
		t.Fatal(err)
	}
}

func (h *etcdHarness) Resume(t *testing.T, key string) {
	t.Helper()
	if _, err := h.ctl.Resume(context.Background(), key); err != nil {
		t.Fatal(err)
	}
}

// The backend-agnostic budget contract (testsupport/budgetcontract), on
// real etcd: the same cases sqlbudget passes on SQLite and dqlite.
func TestContract(t *testing.T) {
	p := cluster(t)
	h := &etcdHarness{p: p, ctl: newBudget(t, client(t, p.Endpoints()...), "operator", 1)}
	budgetcontract.Run(t, h, budgetcontract.Config{TTL: contractTTL, Slack: 2 * time.Second,
		Key: func(t *testing.T) string { return uniqueKey(t) }})
}
