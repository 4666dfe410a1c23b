package snapsvc_test

// Tests of one watcher per machine (machinewait.go): Clients with lock
// registries of their own, as separate processes have, sharing one lock
// directory. machineproc_test.go runs the same with real processes.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// procClient builds a REST Client as another process of the machine runs
// it: its own path to srv's socket (so a lock registry of its own), the
// lock directory every process shares, its requests sent as ua.
func procClient(t testing.TB, srv *fake.Server, ua string, opts ...snapsvc.Option) *snapsvc.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "snapd.socket")
	if err := os.Symlink(srv.SocketPath(), sock); err != nil {
		t.Fatal(err)
	}
	base := []snapsvc.Option{snapsvc.WithSocket(sock), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithLockDir(filepath.Join(srv.Dir(), ".snapsvc-lock")), snapsvc.WithTransport(userAgent(ua))}
	c, err := snapsvc.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// requestsOf returns the requests srv got from ua.
func requestsOf(srv *fake.Server, ua string) []fake.Request {
	var out []fake.Request
	for _, r := range srv.Requests() {
		if r.UserAgent == ua {
			out = append(out, r)
		}
	}
	return out
}

// refusedPosts counts ua's requests to act that snapd refused.
func refusedPosts(srv *fake.Server, ua string) int {
	n := 0
	for _, r := range requestsOf(srv, ua) {
		if r.Method == "POST" && r.Status >= 400 {
			n++
		}
	}
	return n
}

// Four processes restart four services while a foreign change holds the
// snap, on a snapd that can only be polled (2.57, no state file): one of
// them waits the blocker out, the three others send snapd nothing until
// it is done, then each makes its change.
func TestMachineProcessesShareOneWatcher(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(fake.Version257), fake.WithSnaps(k8sSnap(time.Millisecond)))
	ctx := ctxT(t)
	blk := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: "k8s"})
	services := []string{"kubelet", "containerd", "kube-proxy", "kube-apiserver"}
	outs := make([]chan restartOutcome, len(services))
	for i, s := range services {
		// Each has met the snap busy (refused, or told by the facts)
		// before the next one starts.
		onConflict, conflict := conflictsSeen()
		c := procClient(t, srv, "proc-"+s, onConflict)
		outs[i] = make(chan restartOutcome, 1)
		restartAsync(c, ctx, outs[i], "k8s."+s)
		select {
		case <-conflict:
		case o := <-outs[i]:
			t.Fatalf("%s returned before it met the blocker: %+v %v", s, o.res, o.err)
		case <-ctx.Done():
			t.Fatalf("%s never met the blocker", s)
		}
		awaitWatcher(t, ctx, srv, "k8s")
	}
	// The watcher polls the blocker; the others are silent.
	before, all := len(requestsOf(srv, "proc-kubelet")), len(srv.Requests())
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Requests() >= all+5 }); err != nil {
		t.Fatal(err)
	}
	for _, s := range services[1:] {
		if n := len(requestsOf(srv, "proc-"+s)); n != 0 {
			t.Errorf("%s sent %d requests while another process waited the blocker out, want 0", s, n)
		}
	}
	if n := len(requestsOf(srv, "proc-kubelet")); n < before+5 {
		t.Fatalf("the watcher made %d requests while waiting, want it to poll", n-before)
	}
	blk.Finish()
	ids := map[string]bool{}
	for i, s := range services {
		o := awaitT(t, ctx, outs[i], s+"'s restart")
		if o.err != nil {
			t.Fatalf("%s: %v", s, o.err)
		}
		if o.res.ChangeID == "" || ids[o.res.ChangeID] || o.res.Shared {
			t.Errorf("%s: result %+v, want a change of its own", s, o.res)
		}
		ids[o.res.ChangeID] = true
		if chg, _ := srv.ChangeByID(o.res.ChangeID); chg.Status != "Done" || bodyOf(srv, o.res.ChangeID) == "" {
			t.Errorf("%s: change %s %+v", s, o.res.ChangeID, chg)
		}
		if i > 0 && (refusedPosts(srv, "proc-"+s) != 0 || o.res.Attempts != 1 || o.res.Conflicts != 1) {
			t.Errorf("%s: %d requests refused, result %+v; want one request, accepted, after one conflict waited out", s, refusedPosts(srv, "proc-"+s), o.res)
		}
	}
}

// The watcher's call ends (its own policy's time) while the blocker
// holds: a follower takes over, waits the blocker out itself, and acts.
func TestMachineFollowerTakesOverFromAWatcherThatGaveUp(t *testing.T) {
	checkLeaks(t)
	srv, ctx, blk := blockedServer(t, fake.WithVersion(fake.Version257), fake.WithSnaps(k8sSnap(time.Millisecond)))
	short := retry.DefaultPolicy()
	short.MaxElapsedTime = 300 * time.Millisecond
	obs := procClient(t, srv, "watcher", snapsvc.WithPolicy(short))
	onConflict, conflicts := conflictsSeen()
	fol := procClient(t, srv, "follower", onConflict)
	first, second := make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	restartAsync(obs, ctx, first, "k8s.kubelet")
	awaitWatcher(t, ctx, srv, "k8s")
	restartAsync(fol, ctx, second, "k8s.containerd")
	awaitT(t, ctx, conflicts, "the follower to meet the snap busy")
	if n := len(requestsOf(srv, "follower")); n != 0 {
		t.Fatalf("the follower sent %d requests while the watcher watched", n)
	}
	if o := awaitT(t, ctx, first, "the watcher's give-up"); !errors.Is(o.err, snapsvc.ErrGaveUp) {
		t.Fatalf("watcher: %+v %v, want gave up", o.res, o.err)
	}
	// It takes over: refused, it waits the blocker out as the new watcher
	// (its first conflict was the one it followed).
	awaitT(t, ctx, conflicts, "the follower, now the watcher, to be refused")
	if refusedPosts(srv, "follower") < 1 {
		t.Fatalf("the follower's requests: %+v", requestsOf(srv, "follower"))
	}
	awaitWatcher(t, ctx, srv, "k8s")
	blk.Finish()
	o := awaitT(t, ctx, second, "the follower's restart")
	if o.err != nil || o.res.ChangeID == "" {
		t.Fatalf("follower: %+v %v", o.res, o.err)
	}
}

// A follower keeps its own bounds: its policy's time ends while the
// observer (a long policy) still waits, and it gives up, retryable,
// having sent nothing.
func TestMachineFollowerKeepsItsOwnBound(t *testing.T) {
	checkLeaks(t)
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	short := retry.DefaultPolicy()
	short.MaxElapsedTime = 200 * time.Millisecond
	obs := procClient(t, srv, "watcher")
	fol := procClient(t, srv, "follower", snapsvc.WithPolicy(short))
	first := make(chan restartOutcome, 1)
	restartAsync(obs, ctx, first, "k8s.kubelet")
	awaitWatcher(t, ctx, srv, "k8s")
	start := time.Now()
	_, err := fol.Restart(ctx, []string{"k8s.containerd"}, snapsvc.RestartOptions{})
	took := time.Since(start)
	var oe *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrGaveUp) || !errors.As(err, &oe) || !oe.Retryable() || oe.Attempts != 0 || !retry.IsConflict(err) {
		t.Fatalf("follower: %v, want a retryable give-up after a conflict, with no attempt", err)
	}
	if n := len(requestsOf(srv, "follower")); n != 0 {
		t.Errorf("the follower sent %d requests", n)
	}
	t.Logf("the follower gave up after %v (its policy: %v)", took, short.MaxElapsedTime)
	blk.Finish()
	if o := awaitT(t, ctx, first, "the watcher's restart"); o.err != nil {
		t.Fatalf("watcher: %v", o.err)
	}
}

// What the observer sees of snapd's reachability is each follower's to
// judge by its own MaxUnreachable: snapd goes away while the observer
// waits; a follower with a short MaxUnreachable gives up, the observer
// (a long one) rides it out.
func TestMachineFollowerJudgesUnreachabilityByItsOwnPolicy(t *testing.T) {
	checkLeaks(t)
	srv, ctx, blk := blockedServer(t, fake.WithVersion(fake.Version257), fake.WithSnaps(k8sSnap(time.Millisecond)))
	quick := retry.DefaultPolicy()
	quick.MaxUnreachable = 100 * time.Millisecond
	onConflict, following := conflictsSeen()
	obs := procClient(t, srv, "watcher")
	fol := procClient(t, srv, "follower", snapsvc.WithPolicy(quick), onConflict)
	first, second := make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	restartAsync(obs, ctx, first, "k8s.kubelet")
	awaitWatcher(t, ctx, srv, "k8s")
	restartAsync(fol, ctx, second, "k8s.containerd")
	awaitT(t, ctx, following, "the follower to follow the watcher")
	srv.StopListening()
	o := awaitT(t, ctx, second, "the follower's give-up")
	if !errors.Is(o.err, snapsvc.ErrGaveUp) || len(requestsOf(srv, "follower")) != 0 {
		t.Fatalf("follower: %+v %v, want a give-up on snapd unreachable, without a request", o.res, o.err)
	}
	var ce *snapsvc.ConnectionError
	if !errors.As(o.err, &ce) {
		t.Errorf("follower's error %v does not say snapd was unreachable", o.err)
	}
	if err := srv.StartListening(); err != nil {
		t.Fatal(err)
	}
	blk.Finish()
	if o := awaitT(t, ctx, first, "the watcher's restart"); o.err != nil {
		t.Fatalf("watcher: %v", o.err)
	}
}

// A call from a hook never follows another process's observer: the
// blocker may be its own hook's change. It waits the conflict out itself.
func TestMachineHookNeverFollows(t *testing.T) {
	checkLeaks(t)
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	obs := procClient(t, srv, "watcher")
	hook := procClient(t, srv, "hook", snapsvc.WithHook("post-refresh"))
	first, second := make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	restartAsync(obs, ctx, first, "k8s.kubelet")
	awaitWatcher(t, ctx, srv, "k8s")
	restartAsync(hook, ctx, second, "k8s.containerd")
	// The hook sends its own request, refused by the blocker, and waits
	// it out itself, sending snapd requests of its own.
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Conflicts() >= 2 }); err != nil {
		t.Fatalf("the hook never met the blocker itself: %v", err)
	}
	blk.Finish()
	for _, ch := range []chan restartOutcome{first, second} {
		if o := awaitT(t, ctx, ch, "a restart"); o.err != nil {
			t.Fatal(o.err)
		}
	}
	if refusedPosts(srv, "hook") == 0 {
		t.Error("the hook sent no request of its own while the blocker held")
	}
}

// What a watcher published of snapd's reachability is that watcher's.
// One that ends while snapd is away (its own MaxUnreachable ran out)
// leaves it in its last facts; the follower that takes its place judges
// snapd by what its own requests meet, never by the facts of a watcher
// that is gone: here it learns that snapd is away from the first watcher
// (EventUnreachable), takes over once that one gave up, and, with a long
// MaxUnreachable of its own, makes its change once snapd is back and the
// blocker done (EventReachable), rather than give up on the old facts.
func TestMachineStaleReachabilityIsNotANewWatchersFact(t *testing.T) {
	checkLeaks(t)
	srv, ctx, blk := blockedServer(t, fake.WithVersion(fake.Version257), fake.WithSnaps(k8sSnap(time.Millisecond)))
	quick := retry.DefaultPolicy()
	quick.MaxUnreachable = 100 * time.Millisecond
	first := make(chan restartOutcome, 1)
	obs := procClient(t, srv, "first", snapsvc.WithPolicy(quick))
	go func() {
		res, err := obs.Start(ctx, []string{"k8s.kube-proxy"}, snapsvc.StartOptions{})
		first <- restartOutcome{res, err}
	}()
	awaitWatcher(t, ctx, srv, "k8s")
	patient := retry.DefaultPolicy()
	patient.MaxUnreachable = 5 * time.Second
	down, up := make(chan struct{}), make(chan struct{})
	var downOnce, upOnce sync.Once
	onConflict, conflicts := conflictsSeen()
	third := make(chan restartOutcome, 1)
	fol := procClient(t, srv, "follower", snapsvc.WithPolicy(patient), onConflict,
		snapsvc.WithObserver(func(ev snapsvc.Event) {
			switch ev.Kind {
			case snapsvc.EventUnreachable:
				downOnce.Do(func() { close(down) })
			case snapsvc.EventReachable:
				upOnce.Do(func() { close(up) })
			}
		}))
	restartAsync(fol, ctx, third, "k8s.containerd")
	awaitT(t, ctx, conflicts, "the follower to meet the snap busy")
	srv.StopListening()
	awaitT(t, ctx, down, "the follower to learn from the watcher's facts that snapd is away")
	if o := awaitT(t, ctx, first, "the first watcher to give up"); !errors.Is(o.err, snapsvc.ErrGaveUp) {
		t.Fatalf("first watcher: %+v %v, want a give-up on snapd unreachable", o.res, o.err)
	}
	if err := srv.StartListening(); err != nil {
		t.Fatal(err)
	}
	awaitT(t, ctx, up, "the follower, now the watcher, to reach snapd itself")
	blk.Finish()
	if o := awaitT(t, ctx, third, "the follower's restart"); o.err != nil || o.res.ChangeID == "" {
		t.Fatalf("follower: %+v %v; want its restart once snapd was back and the blocker done", o.res, o.err)
	}
}

// blockedServer is a fake snapd made with opts whose k8s snap a foreign
// configure-snap change holds (blk), and the test's context.
func blockedServer(t *testing.T, opts ...fake.Option) (srv *fake.Server, ctx context.Context, blk *fake.Change) {
	t.Helper()
	srv = fake.NewServer(t, append([]fake.Option{fake.AllowNonRoot()}, opts...)...)
	return srv, ctxT(t), srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
}

// A file system that stalls (a rename waiting for a journal busy with
// fsyncs) never holds a call past its bound: the observer's facts are
// written beside the call. Here every write stalls until the test ends;
// the observer's call still returns at its deadline (a schedule run's
// call returned 140 ms past an 8 ms bound, in renameat, before).
func TestMachineStalledFactsWriteDoesNotHoldTheCall(t *testing.T) {
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	stall := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(stall) }) }
	defer release()
	snapsvc.SetFactsWriteHook(t, func() { <-stall })
	obs := procClient(t, srv, "observer")
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := obs.Restart(cctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !retry.IsConflict(err) {
			t.Fatalf("%v, want the deadline while a conflict held the snap", err)
		}
	case <-ctx.Done():
		t.Fatal("the call waited for a stalled write of the machine's facts")
	}
	release()
	blk.Finish()
}

// A wait record an earlier boot left in the lock directory (under
// $SNAP_COMMON it survives a reboot) says nothing: its times are another
// boot's monotonic clock, which restarts near zero. It said the snap was
// free "later" than anything this boot can see, and every follower took
// that for the blocker's end: one follower sent 1,240-4,513 refused
// requests a second until its policy's time ran out. Here two processes
// meet a blocker with such a record there: one watches, the other
// follows, and neither sends more than its first request while it holds.
func TestMachineAnEarlierBootsRecordSaysNothing(t *testing.T) {
	checkLeaks(t)
	// 2.57: the watcher polls the blocker, so requests come while it holds.
	srv, ctx, blk := blockedServer(t, fake.WithVersion(fake.Version257), fake.WithSnaps(k8sSnap(time.Millisecond)))
	if err := snapsvc.WritePreviousBoot(lockDirOf(srv), "k8s"); err != nil {
		t.Fatal(err)
	}
	services := []string{"kubelet", "containerd"}
	outs := make([]chan restartOutcome, len(services))
	for i, s := range services {
		onConflict, conflict := conflictsSeen()
		outs[i] = make(chan restartOutcome, 1)
		restartAsync(procClient(t, srv, "proc-"+s, onConflict), ctx, outs[i], "k8s."+s)
		awaitT(t, ctx, conflict, s+" to meet the blocker")
	}
	// A while with the blocker holding: the follower would spin now.
	awaitWatcher(t, ctx, srv, "k8s")
	before := len(srv.Requests())
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Requests() >= before+5 }); err != nil {
		t.Fatal(err)
	}
	for _, s := range services {
		if n := refusedPosts(srv, "proc-"+s); n > 1 {
			t.Errorf("%s sent %d requests to act that snapd refused while the blocker held, want at most 1", s, n)
		}
	}
	blk.Finish()
	for i, s := range services {
		if o := awaitT(t, ctx, outs[i], s+"'s restart"); o.err != nil || o.res.ChangeID == "" {
			t.Fatalf("%s: %+v %v", s, o.res, o.err)
		}
	}
}

// Processes that meet a blocker at the same moment: the first refused
// makes the snap's wait record before it lets go of the snap's lock, so
// the others, which take the lock after it, follow it at once instead of
// each having a request refused first (which kept the bench's P = 8
// target out of reach behind a 1 s blocker).
func TestMachineSimultaneousArrivalsSendOneRequest(t *testing.T) {
	checkLeaks(t)
	srv, ctx, blk := blockedServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	services := []string{"kubelet", "containerd", "kube-proxy", "kube-apiserver"}
	outs := make([]chan restartOutcome, len(services))
	conflicts := make([]<-chan struct{}, len(services))
	clients := make([]*snapsvc.Client, len(services))
	for i, s := range services {
		var onConflict snapsvc.Option
		onConflict, conflicts[i] = conflictsSeen()
		clients[i] = procClient(t, srv, "proc-"+s, onConflict)
	}
	for i, s := range services {
		outs[i] = make(chan restartOutcome, 1)
		restartAsync(clients[i], ctx, outs[i], "k8s."+s)
	}
	for i, s := range services {
		awaitT(t, ctx, conflicts[i], s+" to meet the blocker")
	}
	refused := 0
	for _, s := range services {
		refused += refusedPosts(srv, "proc-"+s)
	}
	if refused != 1 {
		t.Errorf("%d requests to act refused among 4 processes arriving at once, want 1 (the watcher's)", refused)
	}
	blk.Finish()
	for i, s := range services {
		if o := awaitT(t, ctx, outs[i], s+"'s restart"); o.err != nil || o.res.ChangeID == "" {
			t.Fatalf("%s: %+v %v", s, o.res, o.err)
		}
	}
}
