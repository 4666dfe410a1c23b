package snapsvc_test

// Tests of identical restarts merging behind a snap's lock (processflight.go).

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Issue 18, defect 6: a joiner (5 min policy) got its leader's give-up
// (the leader's short policy) without sending a request. A joiner shares
// only the change's outcome; otherwise it acts itself, within its own
// bounds.
func TestCoalesceJoinerKeepsItsOwnPolicy(t *testing.T) {
	mc := fake.NewManualClock(stepT0)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	ctx := ctxT(t)
	short, long := retry.DefaultPolicy(), retry.DefaultPolicy()
	short.MaxElapsedTime = time.Second
	c0 := newClient(t, srv)
	ca := newClient(t, srv, snapsvc.WithPolicy(short))
	onConflict, refused := conflictsSeen()
	onJoin, joined := eventsSeen(snapsvc.EventJoined)
	cb := newClient(t, srv, snapsvc.WithPolicy(long), onConflict, onJoin)

	first := make(chan restartOutcome, 1)
	restartAsync(c0, ctx, first, "k8s.kubelet") // holds the snap's lock
	running := waitNewChange(ctx, t, srv)
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	leader, joiner := make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	leading := make(chan struct{}, 1)
	snapsvc.SetMergeHook(t, func(joined bool) {
		if !joined {
			select {
			case leading <- struct{}{}:
			default:
			}
		}
	})
	restartAsync(ca, ctx, leader, "k8s.kubelet")
	recvT(t, leading)
	restartAsync(cb, ctx, joiner, "k8s.kubelet")
	recvT(t, joined)
	if err := srv.AdvanceUntilReady(ctx, running); err != nil {
		t.Fatal(err)
	}
	recvT(t, first)
	// The leader acts, runs into the foreign change and gives up within
	// its own second.
	o := recvT(t, leader)
	var oe *snapsvc.OpError
	if !errors.Is(o.err, snapsvc.ErrGaveUp) || !errors.As(o.err, &oe) {
		t.Fatalf("leader: %+v, %v; want gave up", o.res, o.err)
	}
	select {
	case o := <-joiner:
		t.Fatalf("joiner ended with its leader: %+v, %v", o.res, o.err)
	default:
	}
	// The joiner acts itself: refused by the foreign change (it may have
	// been, already: it learns of its leader's end before this test
	// does), then, once that is done, it restarts.
	select {
	case <-refused:
	case <-ctx.Done():
		t.Fatal("the joiner never acted")
	}
	foreign.Finish()
	own := waitNewChange(ctx, t, srv, running, foreign.ID())
	if err := srv.AdvanceUntilReady(ctx, own); err != nil {
		t.Fatal(err)
	}
	o = recvT(t, joiner)
	if o.err != nil || o.res.Shared || o.res.Status != "Done" {
		t.Fatalf("joiner: %+v, %v; want its own restart, done", o.res, o.err)
	}
}

// doneProbe is a context that reports each call of Done. Coalescing calls
// Done only once a request is registered (as the leader waiting for the
// snap's lock, or as a joiner waiting for the leader), right before it
// blocks, so a test can tell that every request is queued without
// sleeping.
type doneProbe struct {
	context.Context
	calls chan struct{}
}

func newDoneProbe(ctx context.Context) *doneProbe {
	return &doneProbe{Context: ctx, calls: make(chan struct{}, 1000)}
}

func (c *doneProbe) Done() <-chan struct{} {
	select {
	case c.calls <- struct{}{}:
	default:
	}
	return c.Context.Done()
}

// waitCalls waits until Done was called n times.
func (c *doneProbe) waitCalls(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-c.calls:
		case <-time.After(10 * time.Second): // a hang guard, not synchronisation
			t.Fatal("request never queued")
		}
	}
}

func slowKubelet() fake.Snap {
	return fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true, StartDuration: time.Second, StopDuration: time.Second},
		{Name: "kube-proxy", Daemon: "simple", Enabled: true, Active: true},
	}}
}

type restartOutcome struct {
	res *snapsvc.Result
	err error
}

func restartAsync(c *snapsvc.Client, ctx context.Context, out chan<- restartOutcome, names ...string) {
	go func() {
		res, err := c.Restart(ctx, names, snapsvc.RestartOptions{})
		out <- restartOutcome{res, err}
	}()
}

// waitNewChange waits until a change other than the known ones is in
// progress and returns its id.
func waitNewChange(ctx context.Context, t *testing.T, srv *fake.Server, known ...string) string {
	t.Helper()
	var id string
	err := srv.WaitFor(ctx, func(v fake.View) bool {
		for _, ci := range v.InProgress() {
			if !contains(known, ci.ID) {
				id = ci.ID
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("waiting for a new change: %v", err)
	}
	return id
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Ten identical restarts queued behind a running restart of the same
// service merge into one: snapd sees two changes in all.
func TestCoalesceTenRestartsBehindRunningChange(t *testing.T) {
	checkLeaks(t)
	mc := fake.NewManualClock(stepT0)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	c := newClient(t, srv)
	ctx := ctxT(t)

	first := make(chan restartOutcome, 1)
	restartAsync(c, ctx, first, "k8s.kubelet")
	running := waitNewChange(ctx, t, srv)

	queued := make(chan restartOutcome, 10)
	for i := 0; i < 10; i++ {
		dp := newDoneProbe(ctx)
		restartAsync(c, dp, queued, "k8s.kubelet")
		dp.waitCalls(t, 1)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 {
		t.Fatalf("%d POST /v2/apps while the first change runs, want 1", n)
	}

	if err := srv.AdvanceUntilReady(ctx, running); err != nil {
		t.Fatal(err)
	}
	if o := recvT(t, first); o.err != nil || o.res.ChangeID != running || o.res.Shared {
		t.Fatalf("first restart: %+v, %v", o.res, o.err)
	}
	second := waitNewChange(ctx, t, srv, running)
	if err := srv.AdvanceUntilReady(ctx, second); err != nil {
		t.Fatal(err)
	}
	shared := 0
	for i := 0; i < 10; i++ {
		o := recvT(t, queued)
		if o.err != nil {
			t.Fatalf("queued restart: %v", o.err)
		}
		if o.res.ChangeID != second || o.res.Status != "Done" {
			t.Errorf("queued restart reports change %s (%s), want %s", o.res.ChangeID, o.res.Status, second)
		}
		if o.res.Shared {
			shared++
		}
	}
	if shared != 9 {
		t.Errorf("%d results marked Shared, want 9 (one leader)", shared)
	}
	cn := srv.Counters()
	if cn.ChangesCreated != 2 || cn.Requests["POST /v2/apps"] != 2 || cn.Conflicts != 0 {
		t.Errorf("counters %+v: want 2 changes, 2 POST /v2/apps, no conflict", cn)
	}
}

// The same behind a foreign change (a configure hook's) that blocks the
// snap: the first restart runs into the conflict and waits; the others
// queue; at most two service-control changes result.
func TestCoalesceTenRestartsBehindForeignChange(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(slowKubelet()))
	srv.SetDurations("k8s", "kubelet", 0, 0)
	c := newClient(t, srv)
	ctx := ctxT(t)
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})

	out := make(chan restartOutcome, 10)
	for i := 0; i < 10; i++ {
		dp := newDoneProbe(ctx)
		restartAsync(c, dp, out, "k8s.kubelet")
		dp.waitCalls(t, 1)
	}
	foreign.Finish()
	ids := map[string]int{}
	for i := 0; i < 10; i++ {
		o := recvT(t, out)
		if o.err != nil {
			t.Fatalf("restart: %v", o.err)
		}
		ids[o.res.ChangeID]++
	}
	if len(ids) > 2 {
		t.Errorf("restarts report %d changes, want at most 2: %v", len(ids), ids)
	}
	cn := srv.Counters()
	if cn.ChangesCreated > 3 { // the foreign change + at most two restarts
		t.Errorf("%d changes created, want at most 3 (1 foreign + 2 restarts)", cn.ChangesCreated)
	}
	var restarts int
	for _, ci := range srv.Changes() {
		if ci.Kind == "service-control" {
			restarts++
		}
	}
	if restarts < 1 || restarts > 2 {
		t.Errorf("%d service-control changes, want 1 or 2", restarts)
	}
}

// A queued leader whose caller gives up before it acts hands over to the
// requests that joined it: they still restart, in one change.
func TestCoalesceLeaderGivesUpBeforeActing(t *testing.T) {
	q := queueRestarts(t, 3)
	srv, ctx, running, joiners, out := q.srv, q.ctx, q.running, q.joiners, q.out
	q.cancelLeader()
	if o := recvT(t, q.leader); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("cancelled leader: %+v, %v", o.res, o.err)
	}
	for _, dp := range joiners { // each queues again (a new leader or its joiner)
		dp.waitCalls(t, 1)
	}
	if err := srv.AdvanceUntilReady(ctx, running); err != nil {
		t.Fatal(err)
	}
	recvT(t, q.first)
	second := waitNewChange(ctx, t, srv, running)
	if err := srv.AdvanceUntilReady(ctx, second); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if o := recvT(t, out); o.err != nil || o.res.ChangeID != second {
			t.Errorf("joiner: %+v, %v; want change %s", o.res, o.err, second)
		}
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 2 {
		t.Errorf("%d POST /v2/apps, want 2", n)
	}
}

// A joiner's outcome does not depend on the leader's context: when the
// leader's caller gives up after its change started, the callers that
// merged into it do not inherit its context error; they restart
// themselves (in a change made after their call).
func TestCoalesceJoinerOutlivesLeaderCancel(t *testing.T) {
	q := queueRestarts(t, 2)
	srv, ctx, running, out := q.srv, q.ctx, q.running, q.out
	if err := srv.AdvanceUntilReady(ctx, running); err != nil {
		t.Fatal(err)
	}
	recvT(t, q.first)
	second := waitNewChange(ctx, t, srv, running)
	q.cancelLeader()
	if o := recvT(t, q.leader); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("leader: %+v, %v", o.res, o.err)
	}
	// Later restarts are instant; the one that ran stays slow.
	srv.SetDurations("k8s", "kubelet", 0, 0)
	if err := srv.AdvanceUntilReady(ctx, second); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		o := recvT(t, out)
		if o.err != nil || o.res.Status != "Done" || o.res.ChangeID == running || o.res.ChangeID == second {
			t.Errorf("joiner: %+v, %v; want a restart of its own, done", o.res, o.err)
		}
	}
}

// queuedRestarts is a kubelet restart running on a manual clock, with a
// leader restart queued behind it (whose context the test can cancel)
// and joiners queued behind the leader.
type queuedRestarts struct {
	srv          *fake.Server
	ctx          context.Context
	running      string
	first        chan restartOutcome
	leader       chan restartOutcome
	cancelLeader context.CancelFunc
	joiners      []*doneProbe
	out          chan restartOutcome
}

func queueRestarts(t *testing.T, joiners int) *queuedRestarts {
	checkLeaks(t)
	mc := fake.NewManualClock(stepT0)
	q := &queuedRestarts{srv: fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet())), ctx: ctxT(t)}
	c := newClient(t, q.srv)
	q.first = make(chan restartOutcome, 1)
	restartAsync(c, q.ctx, q.first, "k8s.kubelet")
	q.running = waitNewChange(q.ctx, t, q.srv)
	var lctx context.Context
	lctx, q.cancelLeader = context.WithCancel(q.ctx)
	ldp := newDoneProbe(lctx)
	q.leader = make(chan restartOutcome, 1)
	restartAsync(c, ldp, q.leader, "k8s.kubelet")
	ldp.waitCalls(t, 1)
	q.out = make(chan restartOutcome, joiners)
	for i := 0; i < joiners; i++ {
		dp := newDoneProbe(q.ctx)
		restartAsync(c, dp, q.out, "k8s.kubelet")
		dp.waitCalls(t, 1)
		q.joiners = append(q.joiners, dp)
	}
	return q
}
