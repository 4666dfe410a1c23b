package snapsvc_test

// Tests of identical restarts merged across the processes of a machine
// (machineflight.go), with Clients that have lock registries of their own
// (procClient); machineproc_test.go runs them as real processes.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// restartsOf returns the changes made by requests restarting name alone.
func restartsOf(srv *fake.Server, name string) []string {
	var ids []string
	for _, r := range srv.Requests() {
		if g, ok := sigOfRequest(r); ok && r.Made != "" && g.action == "restart" && g.names == name {
			ids = append(ids, r.Made)
		}
	}
	return ids
}

// Eight processes restart kubelet while a foreign change holds the snap:
// one request reaches snapd once it is free, one change, and all eight
// report it.
func TestMachineIdenticalRestartsMerge(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(time.Millisecond)))
	ctx := ctxT(t)
	blk := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: "k8s"})
	const n = 8
	outs := make([]chan restartOutcome, n)
	for i := range n {
		// Each is under way before the next starts: it joined, or met
		// the blocker itself.
		onConflict, conflict := conflictsSeen()
		onJoin, joined := eventsSeen(snapsvc.EventJoined)
		c := procClient(t, srv, fmt.Sprintf("proc-%d", i), onJoin, onConflict)
		outs[i] = make(chan restartOutcome, 1)
		restartAsync(c, ctx, outs[i], "k8s.kubelet")
		select {
		case <-joined:
		case <-conflict:
		case o := <-outs[i]:
			t.Fatalf("process %d returned before the blocker ended: %+v %v", i, o.res, o.err)
		case <-ctx.Done():
			t.Fatalf("process %d neither joined nor met the blocker", i)
		}
	}
	for i := 1; i < n; i++ {
		if r := requestsOf(srv, fmt.Sprintf("proc-%d", i)); len(r) != 0 {
			t.Errorf("process %d, joined, sent %d requests", i, len(r))
		}
	}
	blk.Finish()
	var id string
	shared := 0
	for i := range n {
		o := awaitT(t, ctx, outs[i], fmt.Sprintf("process %d's restart", i))
		if o.err != nil || o.res.ChangeID == "" || o.res.Status != "Done" {
			t.Fatalf("process %d: %+v %v", i, o.res, o.err)
		}
		if id == "" {
			id = o.res.ChangeID
		}
		if o.res.ChangeID != id {
			t.Errorf("process %d reports change %s, process 0 %s", i, o.res.ChangeID, id)
		}
		if o.res.Shared {
			shared++
		}
	}
	if got := restartsOf(srv, "k8s.kubelet"); len(got) != 1 || got[0] != id || shared != n-1 {
		t.Errorf("kubelet restarted by changes %v, %d results shared; want once, by %s, shared by %d", got, shared, id, n-1)
	}
}

// A restart that comes once another process's identical restart was sent
// does not join it (the restart it asked for would have begun before its
// call): it makes its own, once the other's change is done.
func TestMachineLateRestartDoesNotJoinASentOne(t *testing.T) {
	checkLeaks(t)
	mc := fake.NewManualClock(stepT0)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	ctx := ctxT(t)
	first, second := make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	restartAsync(procClient(t, srv, "leader"), ctx, first, "k8s.kubelet")
	running := waitNewChange(ctx, t, srv)
	waiting := make(chan struct{}, 1)
	snapsvc.SetLockWaitHook(t, func(string) {
		select {
		case waiting <- struct{}{}:
		default:
		}
	})
	restartAsync(procClient(t, srv, "late"), ctx, second, "k8s.kubelet")
	// The late restart waits for the snap's lock: the leader, uncontended,
	// sent its request at once, and made no flight it could join.
	awaitT(t, ctx, waiting, "the late restart to wait for the snap's lock")
	if err := srv.AdvanceUntilReady(ctx, running); err != nil {
		t.Fatal(err)
	}
	if o := awaitT(t, ctx, first, "the leader's restart"); o.err != nil || o.res.ChangeID != running {
		t.Fatalf("leader: %+v %v", o.res, o.err)
	}
	own := waitNewChange(ctx, t, srv, running)
	if err := srv.AdvanceUntilReady(ctx, own); err != nil {
		t.Fatal(err)
	}
	if o := awaitT(t, ctx, second, "the late restart"); o.err != nil || o.res.Shared || o.res.ChangeID != own {
		t.Fatalf("late restart: %+v %v, want its own change %s", o.res, o.err, own)
	}
}

// The leader's own bound ends while the blocker holds: that says nothing
// of its joiner's, which acts itself, within its own bounds.
func TestMachineJoinerActsWhenItsLeaderGivesUp(t *testing.T) {
	checkLeaks(t)
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	short := retry.DefaultPolicy()
	short.MaxElapsedTime = 300 * time.Millisecond
	leader := procClient(t, srv, "leader", snapsvc.WithPolicy(short))
	onConflict, refused := conflictsSeen()
	onJoin, joined := eventsSeen(snapsvc.EventJoined)
	joiner := procClient(t, srv, "joiner", onJoin, onConflict)
	first, second := make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	restartAsync(leader, ctx, first, "k8s.kubelet")
	awaitWatcher(t, ctx, srv, "k8s")
	restartAsync(joiner, ctx, second, "k8s.kubelet")
	awaitT(t, ctx, joined, "the joiner to join the leader's restart")
	if o := awaitT(t, ctx, first, "the leader's give-up"); !errors.Is(o.err, snapsvc.ErrGaveUp) {
		t.Fatalf("leader: %+v %v, want gave up", o.res, o.err)
	}
	awaitT(t, ctx, refused, "the joiner, now acting, to be refused in turn")
	blk.Finish()
	o := awaitT(t, ctx, second, "the joiner's restart")
	if o.err != nil || o.res.Shared || o.res.ChangeID == "" {
		t.Fatalf("joiner: %+v %v, want its own restart", o.res, o.err)
	}
	if got := restartsOf(srv, "k8s.kubelet"); len(got) != 1 || got[0] != o.res.ChangeID {
		t.Errorf("kubelet restarted by %v, want by %s alone", got, o.res.ChangeID)
	}
}

// A leader's change that fails is its joiners' outcome too: the same
// change, the same failure, not retryable.
func TestMachineJoinersShareAFailedChange(t *testing.T) {
	checkLeaks(t)
	snap := k8sSnap(time.Millisecond)
	snap.Apps[2].FailStart = fake.SystemctlJobFailed("k8s", "kubelet")
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(snap))
	first, second := leaderAndJoiner(t, ctx, srv, procClient, "k8s.kubelet")
	blk.Finish()
	var ids []string
	for _, ch := range []chan restartOutcome{first, second} {
		o := awaitT(t, ctx, ch, "a restart's failure")
		var ce *snapsvc.ChangeError
		var oe *snapsvc.OpError
		if !errors.As(o.err, &ce) || !errors.As(o.err, &oe) || oe.Retryable() || ce.Status != "Error" {
			t.Fatalf("%+v %v, want the change's failure", o.res, o.err)
		}
		ids = append(ids, ce.ID)
	}
	if ids[0] != ids[1] || len(restartsOf(srv, "k8s.kubelet")) != 1 {
		t.Errorf("failures name changes %v; kubelet restarted by %v", ids, restartsOf(srv, "k8s.kubelet"))
	}
}

// ctlProcClient is procClient inside the snap: snapctl on the snap
// socket, with the snap's cookie.
func ctlProcClient(t testing.TB, srv *fake.Server, ua string, opts ...snapsvc.Option) *snapsvc.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "snapd-snap.socket")
	if err := os.Symlink(srv.SnapSocketPath(), sock); err != nil {
		t.Fatal(err)
	}
	base := []snapsvc.Option{snapsvc.WithSnapSocket(sock), snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithCookie(srv.Cookie("k8s")),
		snapsvc.WithSnap("k8s"), snapsvc.WithLockDir(filepath.Join(srv.Dir(), ".snapsvc-lock")), snapsvc.WithTransport(userAgent(ua))}
	c, err := snapsvc.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A joiner's error is its leader's, as errors.Is and errors.As see it:
// in snapctl mode a failed change comes with snapd's refusal of the
// command (an *APIError) beside the *ChangeError, and a joiner in
// another process must find both, as an in-process joiner does.
func TestMachineSnapctlJoinersShareTheWholeFailure(t *testing.T) {
	checkLeaks(t)
	snap := k8sSnap(time.Millisecond)
	snap.Apps[2].FailStart = fake.SystemctlJobFailed("k8s", "kubelet")
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(snap))
	first, second := leaderAndJoiner(t, ctx, srv, ctlProcClient, "k8s.kubelet")
	blk.Finish()
	lead, join := awaitT(t, ctx, first, "the leader's failure"), awaitT(t, ctx, second, "the joiner's failure")
	if lead.err == nil || join.err == nil {
		t.Fatalf("leader %+v %v, joiner %+v %v: want the change's failure for both", lead.res, lead.err, join.res, join.err)
	}
	if len(requestsOf(srv, "joiner")) != 0 {
		t.Fatalf("the joiner sent requests: %+v", requestsOf(srv, "joiner"))
	}
	var lce, jce *snapsvc.ChangeError
	if !errors.As(lead.err, &lce) || !errors.As(join.err, &jce) || *lce != *jce {
		t.Errorf("change errors: leader %+v, joiner %+v", lce, jce)
	}
	var lapi, japi *snapsvc.APIError
	la, ja := errors.As(lead.err, &lapi), errors.As(join.err, &japi)
	if la != ja {
		t.Errorf("errors.As(*APIError): leader %v, joiner %v", la, ja)
	} else if la && (lapi.Message != japi.Message || lapi.StatusCode != japi.StatusCode || lapi.Kind != japi.Kind) {
		t.Errorf("snapd's answer: leader %+v, joiner %+v", lapi, japi)
	}
	var loe, joe *snapsvc.OpError
	if !errors.As(lead.err, &loe) || !errors.As(join.err, &joe) || loe.Retryable() != joe.Retryable() || loe.ChangeID != joe.ChangeID {
		t.Errorf("op errors: leader %#v, joiner %#v", loe, joe)
	}
	if lead.err.Error() != join.err.Error() {
		t.Errorf("errors differ:\nleader %v\njoiner %v", lead.err, join.err)
	}
}

// A restart of this process may join another restart of this process
// only while that one's request, and the request of any other process's
// restart it joins, has not been sent: here this process's first restart
// reads another process's flight open, that flight's request is sent and
// its change made, and only then does a second restart of this process
// come. The change was made before the second call began: it must not
// be reported as that call's restart.
func TestMachineInProcessJoinerNeverTakesARestartSentBeforeItsCall(t *testing.T) {
	checkLeaks(t)
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	first := make(chan restartOutcome, 1)
	restartAsync(procClient(t, srv, "A"), ctx, first, "k8s.kubelet")
	awaitWatcher(t, ctx, srv, "k8s") // A's flight is open: its request was refused

	// Process B's first restart reads A's flight open, and is held there.
	readOpen, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	snapsvc.SetFlightReadHook(t, func(phase string) {
		if phase == "open" {
			once.Do(func() {
				close(readOpen)
				<-release
			})
		}
	})
	b := procClient(t, srv, "B")
	second := make(chan restartOutcome, 1)
	restartAsync(b, ctx, second, "k8s.kubelet")
	awaitT(t, ctx, readOpen, "B's first restart to read A's flight open")
	// A's request goes out and makes its change, which ends.
	blk.Finish()
	o := awaitT(t, ctx, first, "A's restart")
	if o.err != nil || o.res.ChangeID == "" {
		t.Fatalf("A: %+v %v", o.res, o.err)
	}
	sent := o.res.ChangeID
	// Only now does B's second restart begin.
	decided := make(chan struct{}, 2)
	snapsvc.SetMergeHook(t, func(bool) {
		select {
		case decided <- struct{}{}:
		default:
		}
	})
	third := make(chan restartOutcome, 1)
	restartAsync(b, ctx, third, "k8s.kubelet")
	awaitT(t, ctx, decided, "B's second restart to join B's first or lead its own")
	close(release)
	// B's first restart began before A's request was sent: A's change,
	// or a change of its own, is its restart.
	if o := awaitT(t, ctx, second, "B's first restart"); o.err != nil || o.res.ChangeID == "" {
		t.Fatalf("B's first restart: %+v %v", o.res, o.err)
	}
	o = awaitT(t, ctx, third, "B's second restart")
	if o.err != nil || o.res.ChangeID == "" {
		t.Fatalf("B's second restart: %+v %v", o.res, o.err)
	}
	if o.res.ChangeID == sent {
		t.Fatalf("B's second restart reports change %s, requested before the call began (result %+v)", sent, o.res)
	}
}

// A joiner keeps its own bound, and its end says what it is: its policy's
// time ends while its leader (a long policy) still waits the blocker out,
// and it gives up, having sent nothing, with an error that invites a
// retry, as a follower's in its place does (TestMachineFollowerKeepsItsOwnBound).
func TestMachineJoinerGivesUpRetryable(t *testing.T) {
	checkLeaks(t)
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	short := retry.DefaultPolicy()
	short.MaxElapsedTime = 200 * time.Millisecond
	first := make(chan restartOutcome, 1)
	restartAsync(procClient(t, srv, "leader"), ctx, first, "k8s.kubelet")
	awaitWatcher(t, ctx, srv, "k8s")
	onJoin, joined := eventsSeen(snapsvc.EventJoined)
	_, err := procClient(t, srv, "joiner", snapsvc.WithPolicy(short), onJoin).Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	select {
	case <-joined:
	default:
		t.Fatalf("the joiner never joined: %v", err)
	}
	var oe *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrGaveUp) || !errors.As(err, &oe) || !oe.Retryable() || oe.Attempts != 0 || oe.ChangeID != "" {
		t.Fatalf("joiner: %v, want a retryable give-up, with no attempt", err)
	}
	if n := len(requestsOf(srv, "joiner")); n != 0 {
		t.Errorf("the joiner sent %d requests", n)
	}
	blk.Finish()
	if o := awaitT(t, ctx, first, "the leader's restart"); o.err != nil {
		t.Fatalf("leader: %v", o.err)
	}
}

// leaderAndJoiner restarts svc from a leader process, made by mk, and once
// it observes the blocker, from a joiner process, until it joined the
// leader's restart: their outcomes come on the channels.
func leaderAndJoiner(t *testing.T, ctx context.Context, srv *fake.Server, mk func(testing.TB, *fake.Server, string, ...snapsvc.Option) *snapsvc.Client, svc string) (lead, join chan restartOutcome) {
	t.Helper()
	onJoin, joined := eventsSeen(snapsvc.EventJoined)
	lead, join = make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	restartAsync(mk(t, srv, "leader"), ctx, lead, svc)
	awaitWatcher(t, ctx, srv, strings.Split(svc, ".")[0])
	restartAsync(mk(t, srv, "joiner", onJoin), ctx, join, svc)
	awaitT(t, ctx, joined, "the joiner to join the leader's restart")
	return lead, join
}

// A restart merged into another process's restart counts for the
// joiner's WithMinRestartInterval: the joiner's next restart of the
// service keeps its distance from the change it shared (kubelet restarted
// twice 4-8 ms apart for a process set to 2 s). And a restart paces before
// it merges: the one it joins must come no sooner than its interval.
func TestMachineJoinedRestartIsPaced(t *testing.T) {
	checkLeaks(t)
	const gap = 300 * time.Millisecond
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	onJoin, joined := eventsSeen(snapsvc.EventJoined)
	leader := procClient(t, srv, "leader")
	joiner := procClient(t, srv, "joiner", snapsvc.WithMinRestartInterval(gap), onJoin)
	lead, join := make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	restartAsync(leader, ctx, lead, "k8s.kubelet")
	awaitWatcher(t, ctx, srv, "k8s")
	restartAsync(joiner, ctx, join, "k8s.kubelet")
	awaitT(t, ctx, joined, "the joiner to join the leader's restart")
	blk.Finish()
	l, j := awaitT(t, ctx, lead, "the leader's restart"), awaitT(t, ctx, join, "the joiner's restart")
	if l.err != nil || j.err != nil || !j.res.Shared || j.res.ChangeID != l.res.ChangeID {
		t.Fatalf("leader %+v %v, joiner %+v %v: want one change, shared", l.res, l.err, j.res, j.err)
	}
	res, err := joiner.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := srv.ChangeByID(l.res.ChangeID)
	second, _ := srv.ChangeByID(res.ChangeID)
	if d := second.SpawnTime.Sub(first.SpawnTime); d < gap {
		t.Errorf("the joiner's next restart came %v after the one it shared, want at least its interval, %v", d, gap)
	}

	// Another process's restart is open for joining now; the joiner,
	// whose last restart was just now, paces before it joins.
	blk = srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	lead2 := make(chan restartOutcome, 1)
	restartAsync(procClient(t, srv, "leader2"), ctx, lead2, "k8s.kubelet")
	awaitWatcher(t, ctx, srv, "k8s")
	join2 := make(chan restartOutcome, 1)
	restartAsync(joiner, ctx, join2, "k8s.kubelet")
	blk.Finish()
	l2, j2 := awaitT(t, ctx, lead2, "the second leader's restart"), awaitT(t, ctx, join2, "the joiner's paced restart")
	if l2.err != nil || j2.err != nil {
		t.Fatalf("second leader %+v %v, joiner %+v %v", l2.res, l2.err, j2.res, j2.err)
	}
	third, _ := srv.ChangeByID(j2.res.ChangeID)
	if d := third.SpawnTime.Sub(second.SpawnTime); d < gap {
		t.Errorf("the joiner's restart (change %s, shared %v) came %v after its last, want at least %v", j2.res.ChangeID, j2.res.Shared, d, gap)
	}
}
