package snapsvc_test

// Regression tests for the defects of issue 11: each failed before the fix
// it names.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// foreignPost makes a change the way another tool would (a plain POST to
// /v2/apps) and returns its id.
func foreignPost(t *testing.T, srv *fake.Server, body string) string {
	t.Helper()
	id, err := postApps(srv.SocketPath(), body)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// foreignAgent is the User-Agent of foreign requests, so the fake's
// record tells them from snapsvc's even when their answer was lost.
const foreignAgent = "someone-else/1.0"

// postApps sends one POST /v2/apps on its own connection and returns the
// change id snapd answered with.
func postApps(sock, body string) (string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequest("POST", "http://localhost/v2/apps", strings.NewReader(body))
	req.Header.Set("User-Agent", foreignAgent)
	req.Header.Set("Content-Type", "application/json")
	rsp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer rsp.Body.Close()
	var env struct {
		Change string `json:"change"`
	}
	b, _ := io.ReadAll(rsp.Body)
	if err := json.Unmarshal(b, &env); err != nil || env.Change == "" {
		return "", fmt.Errorf("foreign POST: %d %s", rsp.StatusCode, b)
	}
	return env.Change, nil
}

// bodyOf returns the body of the request that created change id.
func bodyOf(srv *fake.Server, id string) string {
	for _, r := range srv.Requests() {
		if r.Change == id {
			return r.Body
		}
	}
	return ""
}

// arrived returns a fault Match that reports matching requests on ch.
func arrived(ch chan<- struct{}, want func(fake.Request) bool) func(fake.Request) bool {
	return func(r fake.Request) bool {
		if want != nil && !want(r) {
			return false
		}
		select {
		case ch <- struct{}{}:
		default:
		}
		return true
	}
}

// Defect 1a: after a lost answer, a foreign plain "start" (its change
// looks exactly like one of "start --enable") was adopted for our start
// --enable, and the service stayed disabled.
func TestLostAnswerForeignPlainStartNotTakenForEnable(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
	c := newClient(t, srv, snapsvc.WithClock(&instantClock{}))
	hold := make(chan struct{})
	seen := make(chan struct{}, 1)
	srv.InjectFault(fake.Fault{Kind: fake.FaultReject, Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold,
		Match: arrived(seen, func(r fake.Request) bool { return strings.Contains(r.Body, `"enable":true`) })})
	done := make(chan error, 1)
	var res *snapsvc.Result
	go func() {
		var err error
		res, err = c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{Enable: true})
		done <- err
	}()
	<-seen
	// While our request hangs, someone else starts kubelet without
	// enabling it; then our request is lost.
	foreign := foreignPost(t, srv, `{"action":"start","names":["k8s.kubelet"]}`)
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Enabled || !st.Active {
		t.Fatalf("kubelet %+v after a successful start --enable", st)
	}
	if res.ChangeID == foreign || !strings.Contains(bodyOf(srv, res.ChangeID), `"enable":true`) {
		t.Fatalf("reported change %s (made by %q); the foreign one is %s", res.ChangeID, bodyOf(srv, res.ChangeID), foreign)
	}
}

// Found by TestRandomizedSchedules (seeds 102384 and 111681, under
// load): after a lost answer to a start of the whole snap, a foreign
// start of one of its services was adopted, because the match took any
// service list for a whole-snap start. snapd lists every service of the
// snap in that task's summary, so only that list matches.
func TestLostAnswerWholeSnapStartNotTakenFromOneService(t *testing.T) {
	for _, action := range []string{"start", "stop"} {
		t.Run(action, func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
			c := newClient(t, srv, snapsvc.WithClock(&instantClock{}))
			hold := make(chan struct{})
			seen := make(chan struct{}, 1)
			srv.InjectFault(fake.Fault{Kind: fake.FaultReject, Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold,
				Match: arrived(seen, func(r fake.Request) bool { return r.UserAgent != foreignAgent })})
			done := make(chan error, 1)
			var res *snapsvc.Result
			go func() {
				var err error
				if action == "start" {
					res, err = c.Start(ctxT(t), []string{"k8s"}, snapsvc.StartOptions{})
				} else {
					res, err = c.Stop(ctxT(t), []string{"k8s"}, snapsvc.StopOptions{})
				}
				done <- err
			}()
			<-seen
			// While our request hangs, someone else acts on one service
			// of the snap; then our request is lost.
			foreign := foreignPost(t, srv, `{"action":"`+action+`","names":["k8s.kubelet"]}`)
			if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return len(v.InProgress()) == 0 }); err != nil {
				t.Fatal(err)
			}
			close(hold)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if res.ChangeID == foreign || !strings.Contains(bodyOf(srv, res.ChangeID), `"names":["k8s"]`) {
				t.Fatalf("reported change %s (made by %q); the foreign one is %s", res.ChangeID, bodyOf(srv, res.ChangeID), foreign)
			}
			for _, app := range []string{"containerd", "kube-apiserver", "kubelet"} {
				if st, _ := srv.Service("k8s", app); st.Active != (action == "start") {
					t.Fatalf("%s %+v after a successful %s of the snap", app, st, action)
				}
			}
		})
	}
}

// Found by TestRandomizedSchedules (seed 504151, under load): snapd
// carries on with a request whose connection broke, and may act on it
// late. The client's second look-up, a policy pause (1 ms in the test)
// after the first, found no change either, so it sent the request again:
// two restarts for one call. The second look-up now comes at least
// 100 ms after the first.
func TestLostAnswerLookedUpAgainAfterSettling(t *testing.T) {
	t0 := time.Now()
	mc := fake.NewManualClock(t0)
	srv := fake.NewServer(t, fake.WithClock(mc), fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithPolicy(retry.Policy{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, MaxElapsedTime: time.Minute}))
	hold := make(chan struct{})
	srv.InjectFault(fake.Fault{Kind: fake.FaultLate, Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold})
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctxT(t), out, "k8s.kubelet")
	// The first look-up found nothing; the client pauses before the next.
	testclock.WaitTimerAt(ctxT(t), t, mc, t0.Add(100*time.Millisecond))
	if n := srv.Counters().Requests["GET /v2/changes"]; n != 1 {
		t.Fatalf("%d look-ups before the settling pause", n)
	}
	close(hold) // snapd gets to the request now
	// Logged once handled: after the look-up, with its change made.
	if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.Requests() >= 2 }); err != nil {
		t.Fatal(err)
	}
	o := testclock.Drive(t, mc, time.Minute, out)
	if o.err != nil {
		t.Fatal(o.err)
	}
	if n := srv.Counters().ChangesCreated; n != 1 || o.res.ChangeID != srv.Changes()[0].ID {
		t.Fatalf("%d changes, result %+v: want the late request's change adopted", n, o.res)
	}
}

// Defect 1b: an identical foreign restart that finished just before our
// call (within the old 1 s slack) was taken as ours: no restart happened.
func TestLostAnswerEarlierIdenticalRestartNotAdopted(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.WithClock(mc), fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)))
	earlier := foreignPost(t, srv, `{"action":"restart","names":["k8s.kubelet"]}`)
	if err := srv.AdvanceUntilReady(ctxT(t), earlier); err != nil {
		t.Fatal(err)
	}
	mc.Advance(300 * time.Millisecond)
	srv.InjectFault(fake.Fault{Kind: fake.FaultReject, Method: "POST", Path: "/v2/apps", Times: 1})
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctxT(t), out, "k8s.kubelet")
	o := testclock.Drive(t, mc, time.Minute, out)
	if o.err != nil {
		t.Fatal(o.err)
	}
	if o.res.ChangeID == earlier {
		t.Fatalf("adopted the restart that ended 300ms before the call (%s)", earlier)
	}
	if n := srv.Counters().ChangesCreated; n != 2 {
		t.Fatalf("%d changes, want the earlier restart and ours", n)
	}
}

// Defect 1c: two clients that do not share memory (as two processes
// would) and lose their answers one after the other both adopted the
// first one's change.
func TestLostAnswersOfTwoProcessesClaimTwoChanges(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	// A second path to the same socket gives the second client a lock
	// registry of its own, as in another process.
	other := filepath.Join(t.TempDir(), "snapd.socket")
	if err := os.Symlink(srv.SocketPath(), other); err != nil {
		t.Fatal(err)
	}
	a := newClient(t, srv)
	b, err := snapsvc.New(snapsvc.WithSocket(other), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithClock(&instantClock{}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := ctxT(t)
	srv.InjectFault(fake.Fault{Kind: fake.FaultDrop, Method: "POST", Path: "/v2/apps", Times: 1})
	ra, err := a.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.InjectFault(fake.Fault{Kind: fake.FaultReject, Method: "POST", Path: "/v2/apps", Times: 1})
	rb, err := b.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ra.ChangeID == rb.ChangeID {
		t.Fatalf("both calls claim change %s", ra.ChangeID)
	}
	if n := srv.Counters().ChangesCreated; n != 2 {
		t.Fatalf("%d changes for two restarts", n)
	}
}

// Defect 2: a context that ended while the POST's answer was pending gave
// a retryable error; a caller that requeued on it restarted twice.
func TestContextEndWithAnswerPendingIsNotRetryable(t *testing.T) {
	t.Run("change made", func(t *testing.T) {
		srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
		c := newClient(t, srv)
		hold := make(chan struct{})
		defer close(hold)
		// snapd acts on the request, but its answer hangs.
		srv.InjectFault(fake.Fault{Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			errc <- err
		}()
		// The request is logged once handled (its change made), before
		// its answer is held.
		if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.Requests() > 0 }); err != nil {
			t.Fatal(err)
		}
		cancel()
		err := <-errc
		// The call's time is over: it looks nothing up (issue 18), the
		// outcome is unknown (TestInFlightChangeFoundInBackground shows
		// the change found in the background).
		var opErr *snapsvc.OpError
		if !errors.As(err, &opErr) || opErr.Retryable() || !errors.Is(err, context.Canceled) || !errors.Is(err, snapsvc.ErrOutcomeUnknown) {
			t.Fatalf("error %v: want cancelled, outcome unknown, not retryable", err)
		}
		if n := srv.Counters().ChangesCreated; n != 1 {
			t.Fatalf("%d changes made", n)
		}
	})
	t.Run("cannot tell", func(t *testing.T) {
		srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
		c := newClient(t, srv)
		hold := make(chan struct{})
		seen := make(chan struct{}, 1)
		// The request hangs before snapd has done anything visible.
		srv.InjectFault(fake.Fault{Kind: fake.FaultReject, Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold, Match: arrived(seen, nil)})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			errc <- err
		}()
		<-seen
		cancel()
		err := <-errc
		close(hold)
		var opErr *snapsvc.OpError
		if !errors.Is(err, snapsvc.ErrOutcomeUnknown) || !errors.As(err, &opErr) || opErr.Retryable() || !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v: want ErrOutcomeUnknown, cancelled, not retryable", err)
		}
	})
}

// waitCase waits, with c.WaitChange, for a foreign change that stays
// Doing until the test finishes it: once cond holds (the wait has shown
// what the test looks for), the change is finished and the wait must end
// with it.
func waitCase(t *testing.T, cond func(fake.View) bool, faults ...fake.Fault) (*fake.Server, error) {
	t.Helper()
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	for _, f := range faults {
		srv.InjectFault(f)
	}
	c := newClient(t, srv, snapsvc.WithPollInterval(5*time.Millisecond))
	chg := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	ctx := ctxT(t)
	errc := make(chan error, 1)
	go func() {
		_, err := c.WaitChange(ctx, chg.ID())
		errc <- err
	}()
	if err := srv.WaitFor(ctx, cond); err != nil {
		t.Fatalf("the wait never got there: %v (requests %v)", err, srv.Counters().Requests)
	}
	chg.Finish()
	return srv, <-errc
}

// Defect 3: with every notices call cut, the change was never read and
// the caller waited out its whole context although the change was done.
func TestWaitReadsChangeWhenNoticesFail(t *testing.T) {
	srv, err := waitCase(t, func(v fake.View) bool { return v.RequestsTo("GET /v2/changes/{id}") >= 5 },
		fake.Fault{Kind: fake.FaultDrop, Method: "GET", Path: "/v2/notices"})
	if err != nil {
		t.Fatal(err)
	}
	// Three failed calls, then polling. (Go's transport sends a GET
	// again, once, when a reused connection is cut before the answer: up
	// to two requests per call reach the fake.)
	if n := srv.Counters().Requests["GET /v2/notices"]; n < 3 || n > 6 {
		t.Errorf("%d notices requests, want 3 calls (then polling)", n)
	}
}

// Defect 4: a long-poll that answered an empty list at once made the wait
// spin (thousands of calls a second).
func TestWaitDoesNotSpinOnInstantEmptyLongPoll(t *testing.T) {
	empty := fake.Fault{Kind: fake.FaultReply, Method: "GET", Path: "/v2/notices", Body: fake.SyncBody([]any{}),
		Match: func(r fake.Request) bool { return strings.Contains(r.Query, "timeout=") }}
	srv, err := waitCase(t, func(v fake.View) bool { return v.RequestsTo("GET /v2/changes/{id}") >= 10 }, empty)
	if err != nil {
		t.Fatal(err)
	}
	cnt := srv.Counters()
	if n := cnt.Requests["GET /v2/notices"]; n != 1+3 {
		t.Errorf("%d notices calls, want the first read and 3 misbehaving long-polls", n)
	}
	// Never faster than the poll interval: a pause of at least 5 ms comes
	// before every read but the first.
	reqs := srv.Requests()
	elapsed := reqs[len(reqs)-1].Time.Sub(reqs[0].Time)
	if n, max := cnt.Requests["GET /v2/changes/{id}"], 1+int(elapsed/(5*time.Millisecond)); n > max {
		t.Errorf("%d change reads in %v, more than one per poll interval (%d)", n, elapsed, max)
	}
}

// Defect 5: one HTTP 500 from the notices API ended the wait with a
// non-retryable error while the change was still running.
func TestWaitSurvivesNoticesServerError(t *testing.T) {
	fault := fake.Fault{Kind: fake.FaultReply, Method: "GET", Path: "/v2/notices", Times: 1,
		Status: 500, Body: fake.ErrorBody(500, "", "internal error"),
		Match: func(r fake.Request) bool { return strings.Contains(r.Query, "timeout=") }}
	srv, err := waitCase(t, func(v fake.View) bool {
		// The 500 was answered and the wait carried on to a long-poll.
		return v.RequestsTo("GET /v2/notices") >= 3 && v.InFlight() > 0
	}, fault)
	if err != nil {
		t.Fatalf("wait after one notices 500: %v", err)
	}
	if n := srv.Counters().Requests["GET /v2/notices"]; n < 3 {
		t.Errorf("%d notices calls", n)
	}
}

// Defect 6: a garbled body with a 2xx status on POST /v2/apps was a
// permanent failure, though snapd had accepted the request.
func TestGarbledAcceptanceAdoptsChange(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(time.Millisecond)))
	srv.InjectFault(fake.Fault{Kind: fake.FaultGarble, Method: "POST", Path: "/v2/apps", Times: 1})
	c := newClient(t, srv)
	res, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cnt := srv.Counters()
	if cnt.ChangesCreated != 1 || cnt.Requests["POST /v2/apps"] != 1 || res.ChangeID != srv.Requests()[0].Change {
		t.Fatalf("result %+v, counters %+v", res, cnt)
	}
}

// Found by TestRandomizedSchedules (seed 182, under load): after a lost
// answer the client adopts the change that does what it asked, but an
// identical foreign change spawned after the request cannot be told from
// the request's own. When the context ended while the adopted change was
// still running, the error named the adopted change as if it were
// certainly the request's and did not say the outcome was unknown, while
// the request's own change was another one.
func TestAdoptedChangeUnfinishedIsOutcomeUnknown(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(time.Hour)))
	srv.InjectFault(fake.Fault{Kind: fake.FaultGarble, Method: "POST", Path: "/v2/apps", Times: 1})
	c := newClient(t, srv)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctx, out, "k8s.kubelet")
	// The change was adopted once the client waits for it.
	if err := srv.WaitFor(ctx, func(v fake.View) bool {
		return v.RequestsTo("GET /v2/changes/{id}")+v.RequestsTo("GET /v2/notices") > 0
	}); err != nil {
		t.Fatal(err)
	}
	cancel()
	err := (<-out).err
	var opErr *snapsvc.OpError
	if !errors.As(err, &opErr) || !errors.Is(err, snapsvc.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) || opErr.Retryable() {
		t.Fatalf("error %v: want ErrOutcomeUnknown, cancelled, not retryable", err)
	}
	if made := srv.Requests()[0].Change; opErr.ChangeID != made || srv.Counters().ChangesCreated != 1 {
		t.Fatalf("error names change %q, the request made %q", opErr.ChangeID, made)
	}
}

// Repeated names are sent once, as the lost-answer matcher expects.
func TestRepeatedNamesSentOnce(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	if _, err := c.Restart(ctxT(t), []string{"k8s.kubelet", "k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	if body := srv.Requests()[0].Body; !strings.Contains(body, `"names":["k8s.kubelet"]`) {
		t.Fatalf("sent %s", body)
	}
}

// A socket that appears late: the client re-dials quickly (no backoff
// towards seconds), reports the outage once through the observer, and
// succeeds within one re-dial interval of the socket appearing.
func TestLateSocketRedialsAndReports(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.WithClock(mc), fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	var mu sync.Mutex
	var events []snapsvc.Event
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithObserver(func(e snapsvc.Event) {
		if e.Kind == snapsvc.EventStarted || e.Kind == snapsvc.EventDone || e.Kind == snapsvc.EventFailed {
			return // the operation's lifecycle; this test is about reaching snapd
		}
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{})
		errc <- err
	}()
	start := mc.Now()
	// Ten seconds without a socket, re-dialled every 50 ms on the clock.
	for mc.Now().Sub(start) < 10*time.Second {
		testclock.WaitTimerAt(ctxT(t), t, mc, mc.Now().Add(50*time.Millisecond))
		mc.AdvanceToNext()
	}
	if err := srv.StartListening(); err != nil {
		t.Fatal(err)
	}
	up := mc.Now()
	if err := testclock.Drive(t, mc, time.Minute, errc); err != nil {
		t.Fatal(err)
	}
	var post fake.Request
	for _, r := range srv.Requests() {
		if r.Method == "POST" {
			post = r
		}
	}
	if d := post.Time.Sub(up); d > 50*time.Millisecond {
		t.Errorf("accepted %v after the socket appeared, want within one re-dial interval", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) < 3 || events[0].Kind != snapsvc.EventUnreachable || events[0].Socket != srv.SocketPath() ||
		!events[0].GiveUpAt.Equal(start.Add(30*time.Second)) || events[1].Kind != snapsvc.EventReachable {
		t.Fatalf("events %+v: want unreachable (socket, give-up time) once, then reachable", events)
	}
}

// A socket that never appears: the operation gives up after
// MaxUnreachable, far below the conflict budget, with a retryable error
// that names the socket.
func TestAbsentSocketBoundedByMaxUnreachable(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.WithClock(mc), fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)))
	errc := make(chan error, 1)
	start := mc.Now()
	go func() {
		_, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		errc <- err
	}()
	err := testclock.Drive(t, mc, time.Minute, errc)
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapsvc.ErrGaveUp) || !errors.As(err, &opErr) || !opErr.Retryable() ||
		!strings.Contains(err.Error(), srv.SocketPath()) || !strings.Contains(err.Error(), "unreachable for 30s") {
		t.Fatalf("error %v", err)
	}
	if d := mc.Now().Sub(start); d > 31*time.Second {
		t.Fatalf("gave up after %v", d)
	}

}

// Without notices (snapd 2.57) a wait watches snapd's state file: with the
// poll interval set to an hour, a restart that meets a foreign change still
// goes ahead as soon as that change is done, woken by the file's rewrite.
// (The first conflict's retry at a rewrite, TestConflictRetriedAtStateRewrite,
// gives up after half a second without one; then the client lists the
// changes and waits for the blocker, which is what this test looks at.)
func TestStateFileWakesPollingWait(t *testing.T) {
	srv := fake.NewServer(t, fake.WithVersion(fake.Version257), fake.WithStateFile(), fake.WithSnaps(k8sSnap(0)))
	logs := newLogWatch()
	c := newClient(t, srv, snapsvc.WithStateFile(srv.StateFile()), snapsvc.WithPollInterval(time.Hour), snapsvc.WithLogger(logs.logger()))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	res, err := whenBlocked(t, logs, func() (*snapsvc.Result, error) {
		return c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	}, foreign.Finish)
	if err != nil {
		t.Fatal(err)
	}
	if res.Conflicts != 1 || res.Status != "Done" {
		t.Fatalf("result %+v", res)
	}
	if n := srv.Counters().Requests["GET /v2/changes/{id}"]; n > 4 {
		t.Errorf("%d change reads: the wait polled instead of watching", n)
	}
}

// A read that fails leaves the wait not knowing whether the change is
// done: the next read must come after the pause, not wait for a state
// file rewrite that may have come already. (It waited for the safety net
// instead: with a long poll interval, for good.)
func TestPollingWaitRereadsAfterFailedRead(t *testing.T) {
	mc := fake.NewManualClock(time.Now())
	srv := fake.NewServer(t, fake.WithClock(mc), fake.WithVersion(fake.Version257), fake.WithStateFile(), fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithStateFile(srv.StateFile()), snapsvc.WithPollInterval(time.Hour))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	// The read that would see the blocker done is cut.
	srv.InjectFault(fake.Fault{Kind: fake.FaultCut, Method: "GET", Path: "/v2/changes/" + foreign.ID(), Times: 1})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		errc <- err
	}()
	// A rewrite that does not end the blocker: the attempt made at it is
	// refused too, and the client lists the changes and waits.
	if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.RequestsTo("POST /v2/apps") > 0 }); err != nil {
		t.Fatal(err)
	}
	other := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "other"})
	defer other.Finish()
	if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.RequestsTo("GET /v2/notices") > 0 }); err != nil {
		t.Fatal(err)
	}
	foreign.Finish() // rewrites the state file: the wait wakes and its read is cut
	if err := testclock.Drive(t, mc, time.Minute, errc); err != nil {
		t.Fatal(err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 3 {
		t.Errorf("%d requests to act; want 3: refused, refused at the unrelated rewrite, accepted", n)
	}
}

// With snapd's state file watched, a first conflict is retried at the
// next rewrite, without listing changes or reading the blocker: most
// blockers are service changes that end within milliseconds, and on snapd
// < 2.62 naming the blocker costs requests (a listing, reads) that a short
// wait cannot afford within issue 12's 20 requests/s.
func TestConflictRetriedAtStateRewrite(t *testing.T) {
	srv := fake.NewServer(t, fake.WithVersion(fake.Version257), fake.WithStateFile(), fake.WithSnaps(k8sSnap(0)))
	var events []snapsvc.Event
	var mu sync.Mutex
	c := newClient(t, srv, snapsvc.WithStateFile(srv.StateFile()), snapsvc.WithPollInterval(time.Hour),
		snapsvc.WithObserver(func(e snapsvc.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctxT(t), out, "k8s.kubelet")
	if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.Conflicts() > 0 }); err != nil {
		t.Fatal(err)
	}
	foreign.Finish()
	o := <-out
	if o.err != nil {
		t.Fatal(o.err)
	}
	res := o.res
	cnt := srv.Counters()
	if res.Conflicts != 1 || res.Attempts != 2 || cnt.Requests["GET /v2/changes"] != 0 || cnt.Requests["GET /v2/changes/{id}"] > 2 {
		t.Fatalf("result %+v, requests %v: want one conflict, retried without listing", res, cnt.Requests)
	}
	for _, r := range srv.Requests() {
		if r.Path == "/v2/changes/"+foreign.ID() {
			t.Errorf("the blocker was read")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.ContainsFunc(events, func(e snapsvc.Event) bool { return e.Kind == snapsvc.EventConflict && e.Err != nil }) {
		t.Errorf("no conflict event: %+v", events)
	}
}

// Without notices, a wait for a blocker the client has just listed in
// progress takes the listing for its first read and idles first; before,
// it read the blocker again at once: one request more per conflict
// against the 20 requests/s budget for short waits. (With the
// state file watched, the idle ends at the rewrite that finishes the
// blocker: TestStateFileWakesPollingWait.)
func TestPollingWaitTakesListingForFirstRead(t *testing.T) {
	t0 := time.Now()
	mc := fake.NewManualClock(t0)
	srv := fake.NewServer(t, fake.WithClock(mc), fake.WithVersion(fake.Version257), fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		errc <- err
	}()
	// The wait's first pause (20ms: the fast start of the poll ramp).
	testclock.WaitTimerAt(ctxT(t), t, mc, t0.Add(20*time.Millisecond))
	reads := func() int {
		n := 0
		for _, r := range srv.Requests() {
			if r.Path == "/v2/changes/"+foreign.ID() {
				n++
			}
		}
		return n
	}
	if n := reads(); n != 0 || srv.Counters().Requests["GET /v2/changes"] != 1 {
		t.Fatalf("blocker read %d times after the listing, before the first pause; want 0", n)
	}
	foreign.Finish()
	if err := testclock.Drive(t, mc, time.Minute, errc); err != nil {
		t.Fatal(err)
	}
	if n := reads(); n != 1 {
		t.Errorf("blocker read %d times; want once, after the pause", n)
	}
}

// APIError, Change and Task are snapsvc's own types (their fields show in
// go doc): errors.As finds an APIError in what the client returns, a hand-
// made one classifies like snapd's, and changes keep snapd's JSON.
func TestPublicWireTypes(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	_, err := c.Restart(ctxT(t), []string{"k8s.nosuch"}, snapsvc.RestartOptions{})
	var apiErr *snapsvc.APIError
	if !errors.As(err, &apiErr) || apiErr.Kind != "app-not-found" || apiErr.StatusCode != 404 || !errors.Is(err, snapsvc.ErrNotFound) {
		t.Fatalf("errors.As: %v %+v", err, apiErr)
	}
	if retry.Classify(&snapsvc.APIError{StatusCode: 400, Message: `snap "k8s" has "service-control" change in progress`}) != retry.Conflict {
		t.Fatal("a hand-made APIError does not classify")
	}
	res, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	chg, err := c.Change(ctxT(t), res.ChangeID)
	if err != nil || len(chg.Tasks) != 1 || chg.Tasks[0].Data.AffectedSnaps[0] != "k8s" || chg.ReadyTime == nil {
		t.Fatalf("change %+v %v", chg, err)
	}
	b, _ := json.Marshal(chg)
	if !strings.Contains(string(b), `"spawn-time":`) || !strings.Contains(string(b), `"affected-snaps":["k8s"]`) {
		t.Fatalf("JSON %s", b)
	}
}

// A context that ends before anything was done (here, while the call waits
// for the snap's lock) leaves a retryable error: nothing ran.
func TestInterruptedBeforeActingIsRetryable(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	hold := make(chan struct{})
	seen := make(chan struct{}, 1)
	srv.InjectFault(fake.Fault{Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold, Match: arrived(seen, nil)})
	first := make(chan error, 1)
	go func() {
		_, err := c.Restart(context.Background(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		first <- err
	}()
	<-seen // the first call holds the snap's lock, its answer pending
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{})
	var opErr *snapsvc.OpError
	if !errors.As(err, &opErr) || !opErr.Retryable() || !errors.Is(err, context.Canceled) || opErr.ChangeID != "" {
		t.Fatalf("error %v: want cancelled, retryable, no change", err)
	}
	close(hold)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 {
		t.Fatalf("%d POSTs: the cancelled call acted", n)
	}
}
