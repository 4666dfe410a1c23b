package snapsvc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Two clients built separately (a hook and a controller, say) fire 20
// concurrent starts and restarts at one snap whose changes take time. The
// shared per-snap lock means snapd never sees two of them at once.
func TestConcurrentClientsNeverConflict(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(2*time.Millisecond)))
	hook := newClient(t, srv)
	controller := newClient(t, srv)
	ctx := ctxT(t)

	names := []string{"k8s.kubelet", "k8s.containerd", "k8s.kube-proxy", "k8s"}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	ids := make(chan string, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := hook
			if i%2 == 1 {
				c = controller
			}
			name := []string{names[i%len(names)]}
			var res *snapsvc.Result
			var err error
			if i%3 == 0 {
				res, err = c.Start(ctx, name, snapsvc.StartOptions{Enable: true})
			} else {
				res, err = c.Restart(ctx, name, snapsvc.RestartOptions{})
			}
			if err != nil {
				errs <- err
				return
			}
			if res.Status != "Done" || res.ChangeID == "" || res.Conflicts != 0 {
				errs <- fmt.Errorf("call %d: unexpected result %+v", i, res)
			}
			ids <- res.ChangeID
		}()
	}
	wg.Wait()
	close(errs)
	close(ids)
	for err := range errs {
		t.Error(err)
	}
	cnt := srv.Counters()
	if cnt.Conflicts != 0 {
		t.Errorf("snapd answered %d conflicts, want 0", cnt.Conflicts)
	}
	if got := cnt.Requests["POST /v2/apps"]; got+0 < 1 || got > 20 {
		t.Errorf("POST /v2/apps sent %d times, want between 1 and 20", got)
	}
	seen := map[string]bool{}
	for id := range ids {
		seen[id] = true
		chg, ok := srv.ChangeByID(id)
		if !ok || chg.Status != "Done" {
			t.Errorf("change %s: %+v (found %v)", id, chg, ok)
		}
	}
	// Identical restarts that waited together may share one change; every
	// other call made its own.
	if len(seen) < 8 {
		t.Errorf("only %d distinct changes for 20 calls", len(seen))
	}
	for _, n := range []string{"kubelet", "containerd", "kube-proxy", "kube-apiserver"} {
		if st, _ := srv.Service("k8s", n); !st.Active {
			t.Errorf("k8s.%s not active after the run", n)
		}
	}
}

// A foreign change (a configure hook run by "snap set") holds the snap.
// Restart waits it out and its retry reaches snapd within 20ms of the
// change becoming ready, by the fake's own clock.
func TestRestartWaitsOutForeignChange(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	logs := newLogWatch()
	c := newClient(t, srv, snapsvc.WithLogger(logs.logger()))
	ctx := ctxT(t)

	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	res, err := whenBlocked(t, logs, func() (*snapsvc.Result, error) {
		return c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	}, foreign.Finish)
	if err != nil {
		t.Fatal(err)
	}
	if res.Conflicts != 1 || res.Attempts != 2 || len(res.WaitedFor) != 1 || res.WaitedFor[0] != foreign.ID() {
		t.Errorf("result %+v, want 1 conflict, 2 attempts, waited for %s", res, foreign.ID())
	}
	readyAt := foreign.ReadyTime()
	var retryAt time.Time
	for _, r := range srv.Requests() {
		if r.Method == "POST" && r.Path == "/v2/apps" && r.Status == 202 {
			retryAt = r.Time
		}
	}
	lag := retryAt.Sub(readyAt)
	t.Logf("retry reached snapd %v after the foreign change was ready", lag)
	if retryAt.IsZero() || lag < 0 || lag > 20*time.Millisecond {
		t.Errorf("retry at %v, foreign change ready at %v (lag %v), want within 20ms", retryAt, readyAt, lag)
	}
	if srv.Counters().Conflicts != 1 {
		t.Errorf("conflicts %d, want 1", srv.Counters().Conflicts)
	}
}

func TestUnknownServiceFailsAfterOneRequest(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	_, err := c.Restart(ctxT(t), []string{"k8s.nosuch"}, snapsvc.RestartOptions{})
	if err == nil {
		t.Fatal("restart of an unknown service succeeded")
	}
	var opErr *snapsvc.OpError
	var apiErr *snapsvc.APIError
	if !errors.As(err, &opErr) || !errors.As(err, &apiErr) || !errors.Is(err, snapsvc.ErrNotFound) {
		t.Fatalf("error %v (%T) is not an OpError wrapping a not-found APIError", err, err)
	}
	if opErr.Retryable() || retry.IsRetryable(err) || apiErr.Kind != "app-not-found" {
		t.Errorf("unknown service: retryable=%v kind=%q", opErr.Retryable(), apiErr.Kind)
	}
	if !strings.Contains(err.Error(), `k8s.nosuch`) || !strings.Contains(err.Error(), "not retryable") {
		t.Errorf("message does not name the service: %v", err)
	}
	total := 0
	for _, n := range srv.Counters().Requests {
		total += n
	}
	if total != 1 {
		t.Errorf("%d requests sent, want 1: %v", total, srv.Counters().Requests)
	}
}

func TestFailedChangeIsAnError(t *testing.T) {
	snap := k8sSnap(0)
	snap.Apps = append(snap.Apps, fake.App{Name: "broken", Daemon: "oneshot", FailStart: fake.SystemctlJobFailed("k8s", "broken")})
	srv := fake.NewServer(t, fake.WithSnaps(snap))
	c := newClient(t, srv)
	res, err := c.Start(ctxT(t), []string{"k8s.broken"}, snapsvc.StartOptions{})
	if err == nil {
		t.Fatalf("start of a failing service reported success: %+v", res)
	}
	var ce *snapsvc.ChangeError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v is not a ChangeError", err)
	}
	chg, ok := srv.ChangeByID(ce.ID)
	if !ok || ce.Status != "Error" || ce.Err != chg.Err || !strings.Contains(ce.Err, "cannot perform the following tasks") {
		t.Errorf("change error %+v, fake change %+v", ce, chg)
	}
	msg := err.Error()
	if !strings.Contains(msg, "change "+ce.ID) || !strings.Contains(msg, "systemctl") {
		t.Errorf("message lacks change id or snapd's text: %v", msg)
	}
	var opErr *snapsvc.OpError
	if !errors.As(err, &opErr) || opErr.ChangeID != ce.ID || opErr.Retryable() {
		t.Errorf("op error %+v", opErr)
	}
}

func TestBadInputFailsBeforeAnyRequest(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	ctx := ctxT(t)
	for _, names := range [][]string{nil, {"K8s"}, {"k8s."}, {"k"}, {"k8s.kube_let"}, {"-k8s"}, {"k8s_TOOLONGKEYXX"}} {
		_, err := c.Start(ctx, names, snapsvc.StartOptions{})
		if !errors.Is(err, snapsvc.ErrInvalidName) && !errors.Is(err, snapsvc.ErrNoNames) {
			t.Errorf("%q: error %v, want invalid name", names, err)
		}
	}
	if n := len(srv.Requests()); n != 0 {
		t.Errorf("%d requests sent for bad input", n)
	}
	for _, ok := range []string{"k8s", "k8s.kubelet", "k8s_dev.kube-proxy", "0ad", "a1.B2"} {
		if _, _, err := snapsvc.ValidateName(ok); err != nil {
			t.Errorf("%s rejected: %v", ok, err)
		}
	}
}

// A POST whose answer is lost after snapd made the change is not sent
// again: the client finds the change and waits for it.
func TestLostResponseAdoptsChange(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	c := newClient(t, srv)
	srv.DropNextResponse("POST", "/v2/apps")
	res, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cnt := srv.Counters()
	if cnt.Requests["POST /v2/apps"] != 1 || cnt.ChangesCreated != 1 {
		t.Errorf("POSTs %d, changes %d; want 1 and 1", cnt.Requests["POST /v2/apps"], cnt.ChangesCreated)
	}
	if res.ChangeID == "" || res.Status != "Done" {
		t.Errorf("result %+v", res)
	}
}

// snapd unreachable: the client backs off (on the injected clock) and
// succeeds once the socket appears.
func TestLateSocketIsRetried(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	clock := &instantClock{}
	clock.onPause = func(n int) {
		if n == 3 {
			if err := srv.StartListening(); err != nil {
				t.Error(err)
			}
		}
	}
	c := newClient(t, srv, snapsvc.WithClock(clock))
	res, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Attempts != 4 {
		t.Errorf("attempts %d, want 4 (3 refused, then success)", res.Attempts)
	}
}

func TestGivesUpWithinPolicy(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	clock := &instantClock{}
	c := newClient(t, srv, snapsvc.WithPolicy(retry.Policy{MaxAttempts: 3, Clock: clock}))
	_, err := c.Stop(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StopOptions{})
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrGaveUp) || !errors.As(err, &opErr) || opErr.Attempts != 3 || !opErr.Retryable() {
		t.Fatalf("error %v, want a retryable give-up after 3 attempts", err)
	}
	var connErr *snapsvc.ConnectionError
	if !errors.As(err, &connErr) {
		t.Errorf("error does not wrap the connection failure: %v", err)
	}
	if clock.count() != 2 {
		t.Errorf("%d pauses, want 2", clock.count())
	}
}

func TestAsyncThenNextOperationDoesNotConflict(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(5*time.Millisecond)))
	c := newClient(t, srv)
	ctx := ctxT(t)
	op, err := c.StopAsync(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{Disable: true})
	if err != nil {
		t.Fatal(err)
	}
	if op.ChangeID() == "" {
		t.Fatal("no change id")
	}
	// Another client of the same process acts before anyone waited.
	other := newClient(t, srv)
	if _, err := other.Start(ctx, []string{"k8s.kube-proxy"}, snapsvc.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := op.Wait(ctx)
	if err != nil || res.Status != "Done" {
		t.Fatalf("wait: %+v %v", res, err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); st.Active || st.Enabled {
		t.Errorf("kubelet %+v after stop --disable", st)
	}
	if srv.Counters().Conflicts != 0 {
		t.Errorf("%d conflicts", srv.Counters().Conflicts)
	}
}

// snapd < 2.62 has no notices: waits fall back to polling the change.
func TestWaitWithoutNotices(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(3*time.Millisecond)), fake.WithVersion(fake.Version257))
	c := newClient(t, srv, snapsvc.WithPollInterval(time.Millisecond))
	res, err := c.Restart(ctxT(t), []string{"k8s"}, snapsvc.RestartOptions{})
	if err != nil || res.Status != "Done" {
		t.Fatalf("%+v %v", res, err)
	}
	if n := srv.Counters().Requests["GET /v2/notices"]; n != 1 {
		t.Errorf("notices asked %d times on 2.57, want 1 (then remembered as missing)", n)
	}
}

func TestServicesAndWaitIdle(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	ctx := ctxT(t)
	svcs, err := c.Services(ctx, "k8s")
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) != 5 || svcs[0].FullName() != "k8s.containerd" || !svcs[0].Active {
		t.Errorf("services %+v", svcs)
	}
	if _, err := c.Services(ctx, "nosuch"); !errors.Is(err, snapsvc.ErrNotFound) {
		t.Errorf("unknown snap: %v", err)
	}
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "auto-refresh", Snap: "k8s"})
	idle := make(chan error, 1)
	go func() { idle <- c.WaitIdle(ctx, "k8s") }()
	chgs, err := c.Changes(ctx, snapsvc.ChangesOptions{Snap: "k8s"})
	if err != nil || len(chgs) != 1 || chgs[0].ID != foreign.ID() {
		t.Fatalf("changes %+v %v", chgs, err)
	}
	select {
	case err := <-idle:
		t.Fatalf("WaitIdle returned while a change holds the snap: %v", err)
	default:
	}
	foreign.Finish()
	if err := <-idle; err != nil {
		t.Fatal(err)
	}
}

// When the caller's context ends while snapd is away, the error keeps
// the reason the client was retrying.
func TestContextEndKeepsLastError(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	ctx, cancel := context.WithCancel(context.Background())
	clock := &instantClock{}
	clock.onPause = func(n int) {
		if n == 2 {
			cancel()
		}
	}
	c := newClient(t, srv, snapsvc.WithClock(clock))
	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var connErr *snapsvc.ConnectionError
	var opErr *snapsvc.OpError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &connErr) || !errors.As(err, &opErr) || !opErr.Retryable() {
		t.Fatalf("error %v: want cancelled, wrapping the connection failure, retryable", err)
	}
}

// Operations that span two snaps take both snaps' locks in one order, so
// they neither deadlock against single-snap operations nor conflict.
func TestMultiSnapOperationsNeitherDeadlockNorConflict(t *testing.T) {
	etcd := fake.Snap{Name: "etcd", Apps: []fake.App{{Name: "etcd", Daemon: "simple", Enabled: true, Active: true,
		StartDuration: time.Millisecond, StopDuration: time.Millisecond}}}
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(time.Millisecond), etcd))
	c1, c2 := newClient(t, srv), newClient(t, srv)
	ctx := ctxT(t)
	targets := [][]string{{"k8s.kubelet", "etcd.etcd"}, {"etcd.etcd", "k8s.kube-proxy"}, {"etcd"}, {"k8s.kubelet"}}
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := c1
			if i%2 == 1 {
				c = c2
			}
			if _, err := c.Restart(ctx, targets[i%len(targets)], snapsvc.RestartOptions{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if n := srv.Counters().Conflicts; n != 0 {
		t.Errorf("%d conflicts answered", n)
	}
	// A two-snap request is one change with one task per snap.
	twoSnap := 0
	for _, chg := range srv.Changes() {
		if len(chg.Tasks) == 2 {
			twoSnap++
			if !strings.HasSuffix(chg.Tasks[0].Summary, `of snap "etcd"`) && !strings.HasSuffix(chg.Tasks[0].Summary, `of snap "k8s"`) {
				t.Errorf("two-snap change tasks: %+v", chg.Tasks)
			}
		}
	}
	if twoSnap == 0 {
		t.Error("no change covered two snaps")
	}
}
