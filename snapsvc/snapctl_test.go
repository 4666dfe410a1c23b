package snapsvc_test

// Tests of snapctl mode: inside a snap, in and out of hooks.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
	"go.uber.org/goleak"
)

// newSnapctlClient builds a client as a daemon of the k8s snap sees it:
// snapctl over the snap socket with the snap's cookie.
func newSnapctlClient(t *testing.T, srv *fake.Server, cookie string, opts ...snapsvc.Option) *snapsvc.Client {
	t.Helper()
	base := []snapsvc.Option{snapsvc.WithSnapSocket(srv.SnapSocketPath()), snapsvc.WithCookie(cookie), snapsvc.WithSnap("k8s")}
	c, err := snapsvc.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if c.Mode() != snapsvc.ModeSnapctl {
		t.Fatalf("mode %v with a cookie, want snapctl", c.Mode())
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A snapctl conflict, in both wordings snapd has used, is waited out and
// retried to success.
func TestSnapctlConflictEachPrefix(t *testing.T) {
	for _, tc := range []struct {
		version fake.Version
		prefix  string
	}{
		{fake.Version257, "error running snapctl: "},
		{fake.Version270, "snapctl: "},
	} {
		t.Run(string(tc.version), func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithVersion(tc.version))
			logs := newLogWatch()
			c := newSnapctlClient(t, srv, srv.Cookie("k8s"), snapsvc.WithLogger(logs.logger()), snapsvc.WithPollInterval(time.Millisecond))
			ctx := ctxT(t)
			foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
			res, err := whenBlocked(t, logs, func() (*snapsvc.Result, error) {
				return c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			}, foreign.Finish)
			if err != nil {
				t.Fatal(err)
			}
			if res.Conflicts != 1 || res.Status != "Done" {
				t.Errorf("result %+v", res)
			}
			var conflictMsg string
			for _, r := range srv.Requests() {
				if r.Path == "/v2/snapctl" && r.Status == 400 {
					conflictMsg = r.Message
				}
			}
			want := tc.prefix + `snap "k8s" has "configure-snap" change in progress`
			if conflictMsg != want {
				t.Errorf("fake answered %q, want %q", conflictMsg, want)
			}
		})
	}
}

// In a configure hook snapd only queues service commands until the hook
// ends; the client reports that at once instead of waiting (which would
// deadlock: the services start only after the hook returns).
func TestSnapctlConfigureHookQueues(t *testing.T) {
	snap := k8sSnap(0)
	snap.Apps[2].Active = false // kubelet
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(snap))
	hook := srv.StartHook("k8s", "configure")
	c := newSnapctlClient(t, srv, hook.Cookie(), snapsvc.WithHook("configure"))
	ctx := ctxT(t)
	res, err := c.Start(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Queued || res.Status != "" {
		t.Errorf("result %+v, want queued", res)
	}
	if st, _ := srv.Service("k8s", "kubelet"); st.Active {
		t.Error("kubelet started while the configure hook still runs")
	}
	hook.Finish()
	obs := newClient(t, srv)
	if err := obs.WaitIdle(ctx, "k8s"); err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active {
		t.Error("kubelet not started after the hook ended")
	}
}

// From a daemon (ephemeral context) snapctl answers once the change is
// ready, so the services are in their new state when the call returns.
func TestSnapctlDaemonWaitsForChange(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(5*time.Millisecond)))
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	res, err := c.Stop(ctxT(t), []string{"k8s.kubelet", "k8s.kube-proxy"}, snapsvc.StopOptions{Disable: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != "Done" || res.Queued {
		t.Errorf("result %+v", res)
	}
	for _, n := range []string{"kubelet", "kube-proxy"} {
		if st, _ := srv.Service("k8s", n); st.Active || st.Enabled {
			t.Errorf("%s %+v when Stop returned", n, st)
		}
	}
}

// snapctl gives up waiting ("taking too long") while the change carries
// on: the client finds that change and reports its real outcome without
// sending the command again.
func TestSnapctlTakingTooLong(t *testing.T) {
	// The client reads the fake's clock, as it reads the clock of a snapd
	// on the same machine: it tells the change its lost request made by
	// its spawn time.
	clock := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(time.Minute)), fake.WithClock(clock), fake.WithSnapctlTimeout(30*time.Second))
	logs := newLogWatch()
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"), snapsvc.WithLogger(logs.logger()), snapsvc.WithClock(testclock.Of(clock)))
	adopted := logs.seen("adopting the change")
	done := make(chan error, 1)
	var res *snapsvc.Result
	go func() {
		var err error
		res, err = c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- err
	}()
	// Drive the fake's clock: past snapctl's timeout, then past the
	// service's stop and start.
	for i := 0; ; i++ {
		added := clock.TimerAdded()
		if clock.Pending() > 0 {
			clock.AdvanceToNext()
			continue
		}
		select {
		case <-adopted:
		case err := <-done:
			t.Fatalf("returned before adopting: %v", err)
		case <-added:
			continue
		}
		break
	}
	for {
		added := clock.TimerAdded()
		if clock.Pending() > 0 {
			clock.AdvanceToNext()
			continue
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			if res.ChangeID == "" || res.Status != "Done" {
				t.Errorf("result %+v", res)
			}
			if n := srv.Counters().Requests["POST /v2/snapctl"]; n != 1 {
				t.Errorf("snapctl sent %d times, want 1", n)
			}
			return
		case <-added:
		}
	}
}

func TestSnapctlBadInputFailsFast(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	ctx := ctxT(t)
	c := newSnapctlClient(t, srv, "bogus-cookie")
	_, err := c.Start(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{})
	var apiErr *snapsvc.APIError
	if err == nil || !errors.As(err, &apiErr) || retry.IsRetryable(err) || !strings.Contains(err.Error(), "outside of a snap") {
		t.Errorf("bad cookie: %v", err)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("bad cookie: %d requests, want 1", n)
	}
	good := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	_, err = good.Restart(ctx, []string{"other.svc"}, snapsvc.RestartOptions{})
	if !errors.Is(err, snapsvc.ErrWrongSnap) {
		t.Errorf("other snap's service: %v", err)
	}
	if n := len(srv.Requests()); n != 1 {
		t.Errorf("wrong snap sent a request (%d in all)", n)
	}
}

// Four processes restart the same snap's services ten times each, at the
// same time. The file lock serialises them: snapd answers no conflict.
// Identical restarts of two processes may merge (machineflight.go): every
// restart is a request of its own or merged into another's.
func TestMultiProcessRestartsNeverConflict(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(time.Millisecond)))
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outs := make([][]byte, 4)
	errs := make([]error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctxT(t), exe, "-test.run=^$")
			cmd.Env = append(os.Environ(), workerEnv+"="+srv.SocketPath(), fmt.Sprintf("SNAPSVC_WORKER_ID=%d", i))
			outs[i], errs[i] = cmd.CombinedOutput()
		}()
	}
	wg.Wait()
	for i := range 4 {
		if errs[i] != nil {
			t.Errorf("worker %d: %v\n%s", i, errs[i], outs[i])
		}
	}
	shared := 0
	for i := range 4 {
		var n int
		if _, err := fmt.Sscanf(string(outs[i]), "shared %d", &n); err != nil {
			t.Errorf("worker %d's output %q: %v", i, outs[i], err)
		}
		shared += n
	}
	cnt := srv.Counters()
	if cnt.Conflicts != 0 {
		t.Errorf("fake answered %d conflicts, want 0", cnt.Conflicts)
	}
	if want := 40 - shared; cnt.Requests["POST /v2/apps"] != want || cnt.ChangesCreated != want {
		t.Errorf("POSTs %d changes %d, want %d and %d (40 restarts, %d of them merged)", cnt.Requests["POST /v2/apps"], cnt.ChangesCreated, want, want, shared)
	}
	t.Logf("%d of 40 restarts merged into another process's", shared)
}

const workerEnv = "SNAPSVC_TEST_WORKER_SOCKET"

// runWorker runs the body of one worker process of
// TestMultiProcessRestartsNeverConflict when the test binary was started
// as one; it reports whether it did.
func runWorker() bool {
	sock := os.Getenv(workerEnv)
	if sock == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := snapsvc.New(snapsvc.WithSocket(sock), snapsvc.WithMode(snapsvc.ModeREST))
	shared := 0
	if err == nil {
		names := [][]string{{"k8s.kubelet"}, {"k8s.kube-proxy", "k8s.kubelet"}, {"k8s"}}
		for i := 0; i < 10 && err == nil; i++ {
			var res *snapsvc.Result
			res, err = c.Restart(ctx, names[i%len(names)], snapsvc.RestartOptions{})
			if err == nil && res.Conflicts != 0 {
				err = fmt.Errorf("restart %d met %d conflicts", i, res.Conflicts)
			}
			if err == nil && res.Shared {
				shared++
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	fmt.Printf("shared %d\n", shared)
	os.Exit(0)
	return true
}

func TestServicesInSnapctlMode(t *testing.T) {
	snap := k8sSnap(0)
	snap.Apps[2].Enabled, snap.Apps[2].Active = false, false // kubelet
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(snap))
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	ctx := ctxT(t)
	svcs, err := c.Services(ctx, "k8s.kubelet", "k8s.containerd")
	if err != nil || len(svcs) != 2 {
		t.Fatalf("services: %+v %v", svcs, err)
	}
	for _, s := range svcs {
		if want := s.Name == "containerd"; s.Active != want || s.Enabled != want {
			t.Errorf("%+v", s)
		}
	}
	res, err := c.EnsureRunning(ctx, []string{"k8s.kubelet", "k8s.containerd"})
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active || !st.Enabled || len(res.Changed) != 1 {
		t.Errorf("kubelet %+v after EnsureRunning %+v", st, res)
	}
}

// A configure hook snapsvc did not identify: the command is found queued
// in the hook's change and reported as such, not as done.
func TestUnidentifiedHookQueueReported(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	srv.SetService("k8s", "kubelet", fake.AppState{Enabled: true})
	hook := srv.StartHook("k8s", "configure")
	defer hook.Finish()
	hc := newSnapctlClient(t, srv, hook.Cookie())
	if hc.Hook() != "" {
		t.Fatalf("hook %q detected", hc.Hook())
	}
	res, err := hc.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{})
	if err != nil || !res.Queued || res.Status == "Done" || res.ChangeID != hook.ChangeID() {
		t.Errorf("result %+v %v, want queued in change %s", res, err, hook.ChangeID())
	}
}

// Defect 5: in snapctl mode Services failed 1-3 ms into a 500 ms snapd
// restart (one request, no retry), where REST rode it out.
func TestSnapctlServicesRideOutRestart(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	if _, err := c.Services(context.Background(), "k8s.kubelet"); err != nil {
		t.Fatal(err) // a kept-alive connection, as a daemon has
	}
	back := srv.RestartDaemon(500 * time.Millisecond)
	svcs, err := c.Services(ctxT(t), "k8s.kubelet")
	select {
	case <-back:
	default:
		t.Errorf("Services returned before snapd was back: %+v %v", svcs, err)
	}
	if err != nil || len(svcs) != 1 || !svcs[0].Active {
		t.Fatalf("Services across a snapd restart: %+v %v", svcs, err)
	}
}

// A daemon's snapctl restart that snapd carried out is not reported as
// Queued (nor given another change's id) when a configure hook that queued
// the same command starts between snapctl's answer and the listing.
func TestDoneRestartNotReportedQueuedIntoLaterHook(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithClock(mc))
	srv.SetLatency(7 * time.Second)
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	type outcome struct {
		res *snapsvc.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- outcome{res, err}
	}()
	ctx := ctxT(t)
	testclock.WaitTimerAt(ctx, t, mc, mc.Now().Add(7*time.Second)) // POST /v2/snapctl held
	mc.AdvanceToNext()
	for { // the listing that follows, held by its latency timer
		added := mc.TimerAdded()
		dl, ok := mc.NextDeadline()
		held := mc.Now().Add(7 * time.Second)
		if srv.Counters().Requests["GET /v2/changes"] > 0 && ok && dl.Equal(held) {
			break // counted on arrival: its timer is what shows it is held
		}
		if ok && dl.Before(held) {
			mc.AdvanceToNext()
			continue
		}
		<-added
	}
	hook := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", Tasks: []fake.TaskSpec{
		{Kind: "run-hook", Summary: `Run configure hook of "k8s" snap`},
		{Kind: "service-control", Summary: `Run service command "restart" for services ["kubelet"] of snap "k8s"`},
	}})
	mc.AdvanceToNext()
	o := recvT(t, done)
	hook.Finish()
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.res.Queued || o.res.ChangeID == hook.ID() {
		t.Errorf("restart done by snapd (change %q) reported %+v: queued into hook change %s", "1", *o.res, hook.ID())
	}
}

// snapctl answers a start once its change is over; when the change failed
// and that answer arrives as the call's time runs out, the answer is
// final: the change's failure, not retryable (schedule seed 706 under
// load: "context deadline exceeded while retrying ... [retryable]", for a
// change made and failed). The transport holds snapd's whole answer until
// the request's time is over, so the call meets both at once.
func TestSnapctlFailedChangeAnsweredAtTheDeadlineIsFinal(t *testing.T) {
	snap := k8sSnap(0)
	for i := range snap.Apps {
		if snap.Apps[i].Name == "kubelet" {
			snap.Apps[i].FailStart = fake.SystemctlJobFailed("k8s", "kubelet")
			snap.Apps[i].Active = false
		}
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(snap))
	lateAnswer := func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err != nil || r.Method != "POST" {
				return resp, err
			}
			body, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr != nil {
				return nil, rerr
			}
			resp.Body = io.NopCloser(bytes.NewReader(body))
			<-r.Context().Done() // the answer comes as the time runs out
			return resp, nil
		})
	}
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"), snapsvc.WithTransport(lateAnswer))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Start(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{})
	var opErr *snapsvc.OpError
	if err == nil || !errors.As(err, &opErr) || opErr.Retryable() {
		t.Fatalf("error %v: want the change's failure, not retryable", err)
	}
	if !strings.Contains(err.Error(), "kubelet") || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v: want snapd's answer (the failed start), not the deadline", err)
	}
	if n := srv.Counters().ChangesCreated; n != 1 {
		t.Fatalf("%d changes made, want 1", n)
	}
}
