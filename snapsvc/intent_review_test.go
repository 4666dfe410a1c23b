package snapsvc_test

import (
	"context"
	"errors"
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

// the background replay New starts races the Client's own first
// operation: a stale stop intent is carried out after the Client's later
// start, leaving the service stopped.
func TestIntentReplayRunsBeforeTheClientsOwnOperations(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	foreign := leaveIntent(t, srv, "stop")
	foreign.Finish()
	taken := make(chan struct{}, 1)
	release := make(chan struct{})
	var once sync.Once
	snapsvc.SetIntentPoint(func(p string) {
		if p == "replay-taken" {
			once.Do(func() { taken <- struct{}{}; <-release })
		}
	})
	t.Cleanup(func() { snapsvc.SetIntentPoint(nil) })
	c := newClient(t, srv, snapsvc.WithIntents())
	awaitT(t, ctxT(t), taken, "the replay taking the stop intent")
	// The daemon, started again, decides: kubelet runs. Its start waits
	// for the replay of the older stop.
	started := make(chan error, 1)
	go func() {
		_, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{})
		started <- err
	}()
	close(release)
	if err := recvT(t, started); err != nil {
		t.Fatal(err)
	}
	rs, err := c.Startup(ctxT(t))
	if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayActed {
		t.Fatalf("replayed %+v, %v; want the stop acted", rs, err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active {
		t.Fatal("kubelet stopped after the Client's own later start: the replay undid it")
	}
	if got := ownChanges(srv); len(got) != 2 || !strings.Contains(got[0].Tasks[0].Summary, `"stop"`) || !strings.Contains(got[1].Tasks[0].Summary, `"start"`) {
		t.Fatalf("changes %+v, want the replayed stop, then the start", got)
	}
}

// An intent that a later operation of another process decided over is
// superseded: the newer decision stands.
func TestIntentSupersededByALaterDecision(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	foreign := leaveIntent(t, srv, "stop")
	foreign.Finish()
	later, err := newClient(t, srv).Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := newClient(t, srv).Replay(ctxT(t), "k8s")
	if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplaySuperseded || rs[0].Result.ChangeID != later.ChangeID {
		t.Fatalf("replayed %+v, %v; want the stop superseded by change %s", rs, err, later.ChangeID)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active {
		t.Fatal("kubelet stopped: a stale stop undid a later restart")
	}
	if got := ownChanges(srv); len(got) != 1 {
		t.Fatalf("changes %+v, want the later restart only", got)
	}
}

// a replay that fails for a retryable reason (gave up on a conflict)
// removes the intent: the restart is lost.
func TestIntentKeptWhenItsReplayMayPass(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	foreign := leaveIntent(t, srv, "restart") // still holds the snap
	p := retry.DefaultPolicy()
	p.MaxAttempts = 1
	rs, err := newClient(t, srv, snapsvc.WithPolicy(p)).Replay(ctxT(t), "k8s")
	if err != nil || len(rs) != 1 {
		t.Fatalf("replay: %+v, %v", rs, err)
	}
	if rs[0].Decision != snapsvc.ReplayFailed || !rs[0].Kept || !errors.Is(rs[0].Err, snapsvc.ErrGaveUp) {
		t.Fatalf("replay %+v: want a give-up that keeps the intent", rs[0])
	}
	foreign.Finish()
	again, err := newClient(t, srv).Replay(ctxT(t), "k8s")
	if err != nil {
		t.Fatal(err)
	}
	if got := ownChanges(srv); len(got) != 1 {
		t.Fatalf("restarts done %d, want 1 (first replay %+v kept=%t; second replay %+v; records left %q)", len(got), rs[0].Err, rs[0].Kept, again, snapsvc.IntentFiles(lockDirOf(srv)))
	}
}

// a joiner of an identical restart keeps its intent when its call
// ends (a daemon shutting down); the leader's restart, made after the
// joiner's intent, carries it out. The replay restarts again.
func TestIntentOfAJoinerIsSupersededByItsLeader(t *testing.T) {
	checkLeaks(t)
	// snapd stamps its changes with the machine's wall clock: the fake's
	// manual one starts there, and moves on as the test advances it.
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	ctx := ctxT(t)
	c0 := newClient(t, srv)
	ca := newClient(t, srv)
	onJoin, joined := eventsSeen(snapsvc.EventJoined)
	cb := newClient(t, srv, snapsvc.WithIntents(), onJoin)
	first := make(chan restartOutcome, 1)
	restartAsync(c0, ctx, first, "k8s.kubelet") // holds the snap's lock
	running := waitNewChange(ctx, t, srv)
	leading := make(chan struct{}, 1)
	snapsvc.SetMergeHook(t, func(j bool) {
		if !j {
			select {
			case leading <- struct{}{}:
			default:
			}
		}
	})
	leader, joiner := make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	restartAsync(ca, ctx, leader, "k8s.kubelet")
	recvT(t, leading)
	jctx, cancel := context.WithCancel(ctx)
	restartAsync(cb, jctx, joiner, "k8s.kubelet")
	recvT(t, joined)
	cancel() // the joiner's daemon shuts down: its intent stays
	if o := recvT(t, joiner); !errors.Is(o.err, context.Canceled) {
		t.Fatalf("joiner: %v", o.err)
	}
	if got := snapsvc.IntentFiles(lockDirOf(srv)); len(got) != 1 {
		t.Fatalf("intents %q, want the joiner's", got)
	}
	if err := srv.AdvanceUntilReady(ctx, running); err != nil {
		t.Fatal(err)
	}
	recvT(t, first)
	lead := waitNewChange(ctx, t, srv, running)
	if err := srv.AdvanceUntilReady(ctx, lead); err != nil {
		t.Fatal(err)
	}
	if o := recvT(t, leader); o.err != nil {
		t.Fatal(o.err)
	}
	before := len(ownChanges(srv))
	done := make(chan []snapsvc.Replayed, 1)
	go func() {
		rs, _ := newClient(t, srv).Replay(ctx, "k8s")
		done <- rs
	}()
	// Let a change the replay makes finish.
	var rs []snapsvc.Replayed
	for rs == nil {
		select {
		case rs = <-done:
		default:
			if id := newestInProgress(srv, running, lead); id != "" {
				_ = srv.AdvanceUntilReady(ctx, id)
			}
		}
	}
	if after := len(ownChanges(srv)); after != before {
		t.Fatalf("the replay of the joiner's intent made %d restart(s) after the leader's restart (made after the joiner's intent): %+v", after-before, rs)
	}
}

func newestInProgress(srv *fake.Server, known ...string) string {
	for _, c := range srv.Changes() {
		if c.Kind == "service-control" && !c.Ready && !contains(known, c.ID) {
			return c.ID
		}
	}
	return ""
}

// an intent of an earlier boot whose change snapd made and finished
// in that boot is carried out again after the reboot.
func TestIntentOfAnEarlierBootWhoseChangeWasDone(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	srv.SetService("k8s", "kubelet", fake.AppState{Enabled: false, Active: false})
	spec := intentWorkerSpec{Socket: srv.SocketPath(), LockDir: filepath.Join(srv.Dir(), "locks"), Action: "start", Names: []string{"k8s.kubelet"}}
	act := spec
	act.Role, act.KillAt, act.Boot = "act", "accepted", "boot-1"
	if !runIntentProc(t, act) {
		t.Fatal("the worker was not killed")
	}
	if err := srv.WaitIdle(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := serviceChanges(srv); n != 1 {
		t.Fatalf("%d changes in boot 1", n)
	}
	// The reboot: a disabled service does not start.
	srv.SetService("k8s", "kubelet", fake.AppState{Enabled: false, Active: false})
	replay := spec
	replay.Role, replay.Boot = "replay", "boot-2"
	out := runIntentReplay(t, replay)
	if err := srv.WaitIdle(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := serviceChanges(srv); n != 1 {
		t.Fatalf("%d start changes: the start done (change Done) in boot 1 was done again after the reboot (%s)", n, out)
	}
}

// snapctl without change listing: a stop whose request never reached
// snapd (killed as it went out) is never carried out: the replay waits
// for the services to stop by themselves, gives up with ErrOutcomeUnknown
// and keeps the intent, at every start, forever.
func TestIntentReplayWithoutListingSettlesAStopByState(t *testing.T) {
	for _, opt := range []fake.Option{fake.WithoutRefreshObserve(), fake.WithSnapSocketObserveDenied()} {
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), opt)
		spec := intentWorkerSpec{Socket: srv.SocketPath(), SnapSocket: srv.SnapSocketPath(), Cookie: srv.Cookie("k8s"), LockDir: filepath.Join(srv.Dir(), "locks"), Action: "stop", Names: []string{"k8s.kubelet"}}
		act := spec
		act.Role, act.KillAt = "act", "request-out"
		if !runIntentProc(t, act) {
			t.Fatal("not killed")
		}
		p := retry.DefaultPolicy()
		p.MaxElapsedTime = 2 * time.Second
		c, err := snapsvc.New(snapsvc.WithSnapSocket(spec.SnapSocket), snapsvc.WithCookie(spec.Cookie), snapsvc.WithSnap("k8s"), snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithLockDir(spec.LockDir), snapsvc.WithPolicy(p))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		rs, err := c.Replay(ctxT(t), "k8s")
		if err != nil || len(rs) != 1 {
			t.Fatalf("%+v %v", rs, err)
		}
		st, _ := srv.Service("k8s", "kubelet")
		if st.Active || rs[0].Decision != snapsvc.ReplayActed || len(snapsvc.IntentFiles(spec.LockDir)) != 0 {
			t.Errorf("replay %+v, kubelet active=%t, records %q: want the stop acted", rs[0], st.Active, snapsvc.IntentFiles(spec.LockDir))
		}
	}
}

// Close while the start-up replay waits out a conflict.
func TestIntentKeptWhenCloseEndsItsReplay(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	foreign := leaveIntent(t, srv, "restart")
	seen, conflicts := conflictsSeen()
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithSnapSocket(srv.SnapSocketPath()), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithIntents(), seen)
	if err != nil {
		t.Fatal(err)
	}
	awaitT(t, ctxT(t), conflicts, "the replay's conflict")
	c.Close()
	rs, _ := c.Startup(ctxT(t))
	if len(rs) != 1 || !rs[0].Kept || len(snapsvc.IntentFiles(lockDirOf(srv))) != 1 {
		t.Errorf("the intent was not kept by a replay Close ended")
	}
	foreign.Finish()
	rs, _ = newClient(t, srv).Replay(ctxT(t), "k8s")
	if len(ownChanges(srv)) != 1 {
		t.Errorf("restarts %d after the next replay %+v", len(ownChanges(srv)), rs)
	}
}

// WithIntents with WithoutFileLock is accepted and does nothing.
func TestIntentsNeedALockDirectory(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	_, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithIntents(), snapsvc.WithoutFileLock())
	if err == nil {
		t.Errorf("New accepted WithIntents without a lock directory: no intent is ever recorded")
	}
}

// a snapctl-mode Client of another snap sharing the lock directory
// removes an intent it cannot act on.
func TestIntentOfAnotherSnapIsLeftToItsOwnClient(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0), fake.Snap{Name: "other", Apps: []fake.App{{Name: "d", Daemon: "simple", Enabled: true, Active: true}}}))
	foreign := leaveIntent(t, srv, "restart")
	foreign.Finish()
	c := newClient(t, srv, snapsvc.WithCookie(srv.Cookie("other")), snapsvc.WithSnap("other"), snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithIntents())
	rs, err := c.Startup(ctxT(t))
	if err != nil || len(rs) != 0 {
		t.Fatalf("a client of snap other replayed %+v, %v", rs, err)
	}
	if left := snapsvc.IntentFiles(lockDirOf(srv)); len(left) != 1 {
		t.Fatalf("k8s's intent removed by a client of snap other (%q left)", left)
	}
}

// ReplayReached reports Done, with no change: none was made.
func TestIntentReachedResult(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	leaveEarlierBootIntent(t, srv, "restart")
	rs, err := newClient(t, srv).Replay(ctxT(t), "k8s")
	if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayReached {
		t.Fatalf("%+v %v", rs, err)
	}
	if r := rs[0].Result; r == nil || r.Status != "Done" || r.ChangeID != "" {
		t.Errorf("ReplayReached with Result %+v; the doc says Done and no change", r)
	}
}

// An earlier boot's restart intent takes no budget slot: it never acts.
func TestIntentOfAnEarlierBootRestartTakesNoSlot(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	leaveEarlierBootIntent(t, srv, "restart")
	b := newMemBudget(1)
	rs, err := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{})).Replay(ctxT(t), "k8s")
	if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayReached {
		t.Fatalf("%+v %v", rs, err)
	}
	if steps := b.steps(); len(steps) != 0 {
		t.Errorf("budget steps %q for a replay that never acts", steps)
	}
}

// an earlier boot's stop, reached (nothing sent), keeps a budget slot.
func TestIntentReachedStopKeepsNoSlot(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	leaveEarlierBootIntent(t, srv, "stop")
	srv.SetService("k8s", "kubelet", fake.AppState{Enabled: false, Active: false})
	b := newMemBudget(1)
	rs, err := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{})).Replay(ctxT(t), "k8s")
	if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayReached {
		t.Fatalf("%+v %v", rs, err)
	}
	if b.heldTotal() != 0 {
		t.Errorf("a replayed stop that sent nothing keeps %d slot(s)", b.heldTotal())
	}
}

// an intent record Replay may not take (another user's) is skipped
// without a word: Replay reports nothing and no error.
func TestIntentReplayReportsARecordItCannotTake(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	foreign := leaveIntent(t, srv, "restart")
	foreign.Finish()
	recs := snapsvc.IntentFiles(lockDirOf(srv))
	if err := os.Chown(filepath.Join(lockDirOf(srv), recs[0]), 1234, 1234); err != nil {
		t.Skip(err)
	}
	rs, err := newClient(t, srv).Replay(ctxT(t), "k8s")
	if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayFailed || !rs[0].Kept || rs[0].Err == nil {
		t.Errorf("replay of a record of another user: %+v, %v; want it reported, kept", rs, err)
	}
}

func fdCount() int { es, _ := os.ReadDir("/proc/self/fd"); return len(es) }

// descriptors across intents: calls, kept intents, replays.
func TestIntentsLeakNoDescriptors(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv, snapsvc.WithIntents())
	if _, err := c.Startup(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	_, _ = c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	before := fdCount()
	for range 50 {
		if _, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if after := fdCount(); after > before {
		t.Errorf("descriptors after 50 restarts: %d -> %d", before, after)
	}
	for range 10 {
		foreign := leaveIntent(t, srv, "restart")
		foreign.Finish()
		b := fdCount()
		if _, err := c.Replay(ctxT(t), "k8s"); err != nil {
			t.Fatal(err)
		}
		if after := fdCount(); after > b {
			t.Errorf("descriptors across a replay: %d -> %d", b, after)
		}
	}
}

// A restart whose request may have reached snapd, replayed where snapd lets
// the snap list no change: its outcome is reported unknown once, and the
// record goes (no later replay can learn more, and none may restart
// twice).
func TestIntentOfARestartUnknownWithoutListingIsReportedOnce(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithoutRefreshObserve())
	spec := intentWorkerSpec{Socket: srv.SocketPath(), SnapSocket: srv.SnapSocketPath(), Cookie: srv.Cookie("k8s"), LockDir: filepath.Join(srv.Dir(), "locks"), Action: "restart", Names: []string{"k8s.kubelet"}}
	act := spec
	act.Role, act.KillAt = "act", "answered"
	if killed := runIntentProc(t, act); !killed {
		t.Fatal("not killed")
	}
	replay := func() []snapsvc.Replayed {
		c, err := snapsvc.New(snapsvc.WithSnapSocket(spec.SnapSocket), snapsvc.WithCookie(spec.Cookie), snapsvc.WithSnap("k8s"), snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithLockDir(spec.LockDir))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rs, err := c.Replay(ctxT(t), "k8s")
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	rs := replay()
	if len(rs) != 1 || rs[0].Kept || !errors.Is(rs[0].Err, snapsvc.ErrOutcomeUnknown) {
		t.Fatalf("first replay %+v: want the restart's outcome unknown, the record removed", rs)
	}
	if again := replay(); len(again) != 0 {
		t.Fatalf("second replay %+v: the unknown restart reported again", again)
	}
	if n := serviceChanges(srv); n != 1 {
		t.Fatalf("%d restarts, want the killed process's one", n)
	}
}

// A restart killed while it waits out a blocker, where snapd lets the snap
// list no change: snapd's conflict refusal said its request made none, so
// the replay restarts once the blocker is done, rather than report the
// outcome unknown.
func TestIntentRefusedForAConflictIsCarriedOutWithoutListing(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithoutRefreshObserve())
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	seen, conflicts := conflictsSeen()
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"), snapsvc.WithIntents(), snapsvc.WithLockDir(lockDirOf(srv)), seen)
	ctx, cancel := context.WithCancel(ctxT(t))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		errc <- err
	}()
	awaitT(t, ctxT(t), conflicts, "the conflict")
	cancel()
	if err := recvT(t, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("the restart ended with %v", err)
	}
	foreign.Finish()
	rs, err := newSnapctlClient(t, srv, srv.Cookie("k8s"), snapsvc.WithLockDir(lockDirOf(srv))).Replay(ctxT(t), "k8s")
	if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayActed {
		t.Fatalf("replayed %+v, %v; want the restart acted", rs, err)
	}
	if n := serviceChanges(srv); n != 1 {
		t.Fatalf("%d restarts, want 1", n)
	}
}
