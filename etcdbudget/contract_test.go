package etcdbudget_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/testsupport/budgetcontract"
)

// contractTTL is the lease TTL of the contract's participants (etcd's
// minimum with its default timing).
const contractTTL = 2 * time.Second

// etcdHarness runs the budget contract's participants on the package's
// real 3-member cluster, each with an etcd client of its own (one
// machine each) that reaches the members through a loopback proxy of its
// own (etcdtest.Proxy).
type etcdHarness struct {
	p   *etcdtest.Processes
	ctl *etcdbudget.Budget
}

// etcdParticipant is a Budget on a client of its own behind a proxy of
// its own. Vanish cuts the proxy for good: the process and its client
// stay up and keep trying, as on a machine partitioned from the cluster,
// while nothing they send reaches etcd (leases neither renewed nor
// revoked). Cut cuts it off for a while (budgetcontract.Cutter): a
// request sent meanwhile never reaches etcd, even after the cut ends
// (the proxy drops it rather than delivering it late), so a Release
// that failed during a cut did not release anything.
type etcdParticipant struct {
	*etcdbudget.Budget
	px *etcdtest.Proxy
}

var (
	_ budgetcontract.Cutter       = (*etcdParticipant)(nil)
	_ budgetcontract.Refuser      = (*etcdHarness)(nil)
	_ budgetcontract.Prober       = (*etcdHarness)(nil)
	_ budgetcontract.LossyResumer = (*etcdHarness)(nil)
)

func (p *etcdParticipant) Vanish()      { p.px.Cut(true) }
func (p *etcdParticipant) Cut(off bool) { p.px.Cut(off) }

func (h *etcdHarness) New(t *testing.T, o budgetcontract.Options) budgetcontract.Participant {
	t.Helper()
	return h.newParticipant(t, o, nil)
}

var _ budgetcontract.Unbudgeted = (*etcdHarness)(nil)

// NewWithoutCluster returns a participant told that no cluster exists
// yet (Config.ClusterExists false): it grants without etcd.
func (h *etcdHarness) NewWithoutCluster(t *testing.T, o budgetcontract.Options) budgetcontract.Participant {
	t.Helper()
	return h.newParticipant(t, o, func(c *etcdbudget.Config) { c.ClusterExists = func(context.Context) bool { return false } })
}

// NewFailingOpen returns a participant that fails open (Config.FailOpen),
// cut off from etcd from the start.
func (h *etcdHarness) NewFailingOpen(t *testing.T, o budgetcontract.Options) budgetcontract.Participant {
	t.Helper()
	p := h.newParticipant(t, o, func(c *etcdbudget.Config) { c.FailOpen, c.Unreachable = true, time.Second })
	p.Cut(true)
	return p
}

// NewRefused is a fail-open participant whose client the application
// closed: every request fails, for good.
func (h *etcdHarness) NewRefused(t *testing.T, o budgetcontract.Options) budgetcontract.Participant {
	t.Helper()
	return h.newParticipant(t, o, func(c *etcdbudget.Config) {
		c.FailOpen = true
		c.Client.Close()
	})
}

// NewProbing is a participant whose Config.HolderReady asks ready.
func (h *etcdHarness) NewProbing(t *testing.T, o budgetcontract.Options, ready func(ctx context.Context, holder string) bool) budgetcontract.Participant {
	t.Helper()
	return h.newParticipant(t, o, func(c *etcdbudget.Config) {
		c.HolderReady = func(ctx context.Context, v etcdbudget.VanishedHolder) bool { return ready(ctx, v.Holder) }
	})
}

// ResumeLosingAnswer resumes key through an operator's client whose first
// write (a KV transaction or deletion) reaches etcd, takes effect, and has
// its answer replaced by "unavailable", as a connection lost at that
// moment would: the budget tries again. meanwhile runs in between.
func (h *etcdHarness) ResumeLosingAnswer(t *testing.T, key string, meanwhile func()) {
	t.Helper()
	var once sync.Once
	lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err != nil || !(strings.HasSuffix(method, "KV/Txn") || strings.HasSuffix(method, "KV/DeleteRange")) {
			return err
		}
		lost := false
		once.Do(func() {
			lost = true
			meanwhile()
		})
		if lost {
			return status.Error(codes.Unavailable, "etcdtest: the answer was lost")
		}
		return nil
	}
	cfg := etcdbudget.ClientConfig(h.p.Endpoints())
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(lose))
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	op := newBudget(t, cli, "operator", 1)
	if _, err := op.Resume(context.Background(), key); err != nil {
		t.Fatal(err)
	}
}

func (h *etcdHarness) newParticipant(t *testing.T, o budgetcontract.Options, mod func(*etcdbudget.Config)) *etcdParticipant {
	t.Helper()
	px, err := etcdtest.NewProxy(h.p.Endpoints()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Close) // after the client's (cleanups run last first)
	cli, err := newClient(px.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ld := o.LockDelay
	if ld == 0 {
		ld = -1
	}
	cfg := etcdbudget.Config{Client: cli, Holder: o.Holder, Max: o.Max, TTL: contractTTL, LockDelay: ld, Unreachable: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	b, err := etcdbudget.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &etcdParticipant{Budget: b, px: px}
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
	cfg := budgetcontract.Config{TTL: contractTTL, Slack: 2 * time.Second,
		Key: func(t *testing.T) string { return uniqueKey(t) + ".svc" }}
	budgetcontract.Run(t, h, cfg)
	budgetcontract.RunWholePath(t, h, cfg)
}
