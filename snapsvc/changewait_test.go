package snapsvc_test

// Tests of the wait for a change (changewait.go, wakers.go): notices, the
// state file, polling.

import (
	"errors"
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

// snapd < 2.62 has no notices: waits fall back to polling the change.
func TestWaitWithoutNotices(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(3*time.Millisecond)), fake.WithVersion(fake.Version257))
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
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
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
	if err := recvT(t, idle); err != nil {
		t.Fatal(err)
	}
}

func TestWaitChangeUpdate(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	ctx := ctxT(t)
	base, err := c.WaitChangeUpdate(ctx, time.Time{}, time.Hour)
	if err != nil || !base.IsZero() {
		t.Fatalf("no change yet: %v %v", base, err)
	}
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	base, err = c.WaitChangeUpdate(ctx, time.Time{}, time.Hour)
	if err != nil || base.IsZero() {
		t.Fatalf("baseline: %v %v", base, err)
	}
	woke := make(chan time.Time, 1)
	go func() {
		next, err := c.WaitChangeUpdate(ctx, base, time.Hour) // would hold an hour without a notice
		if err != nil {
			t.Error(err)
		}
		woke <- next
	}()
	srv.WaitFor(ctx, func(v fake.View) bool { return v.InFlight() > 0 }) // the long-poll is held
	foreign.Finish()
	if next := recvT(t, woke); !next.After(base) {
		t.Errorf("woke with %v, not after %v", next, base)
	}

	old := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithVersion(fake.Version257))
	if _, err := newClient(t, old).WaitChangeUpdate(ctx, time.Time{}, time.Hour); !errors.Is(err, snapsvc.ErrNoNotices) {
		t.Errorf("snapd 2.57: %v, want ErrNoNotices", err)
	}
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

// Without notices (snapd 2.57) a wait watches snapd's state file: with the
// poll interval set to an hour, a restart that meets a foreign change still
// goes ahead as soon as that change is done, woken by the file's rewrite.
// (The first conflict's retry at a rewrite, TestConflictRetriedAtStateRewrite,
// gives up after half a second without one; then the client lists the
// changes and waits for the blocker, which is what this test looks at.)
func TestStateFileWakesPollingWait(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(fake.Version257), fake.WithStateFile(), fake.WithSnaps(k8sSnap(0)))
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
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithVersion(fake.Version257), fake.WithStateFile(), fake.WithSnaps(k8sSnap(0)))
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

// Without notices, a wait for a blocker the client has just listed in
// progress takes the listing for its first read and idles first; before,
// it read the blocker again at once: one request more per conflict
// against the 20 requests/s budget for short waits. (With the
// state file watched, the idle ends at the rewrite that finishes the
// blocker: TestStateFileWakesPollingWait.)
func TestPollingWaitTakesListingForFirstRead(t *testing.T) {
	t0 := time.Now()
	mc := fake.NewManualClock(t0)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithVersion(fake.Version257), fake.WithSnaps(k8sSnap(0)))
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

// waitCase waits, with c.WaitChange, for a foreign change that stays
// Doing until the test finishes it: once cond holds (the wait has shown
// what the test looks for), the change is finished and the wait must end
// with it.
func waitCase(t *testing.T, cond func(fake.View) bool, faults ...fake.Fault) (*fake.Server, error) {
	t.Helper()
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
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

// Defect 7: a wait gave up up to one poll interval after the give-up time
// it announced (752 ms late with a 1 s poll): its idle was not cut at the
// call's give-up instant.
func TestWaitGivesUpWhenItSaid(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	for _, v := range []fake.Version{fake.Version257, fake.Version277} {
		t.Run(string(v), func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(v), fake.WithSnaps(k8sSnap(0)))
			chg := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
			p := retry.DefaultPolicy()
			p.MaxUnreachable = 250 * time.Millisecond
			var mu sync.Mutex
			var giveUpAt time.Time
			c := newClient(t, srv, snapsvc.WithPolicy(p), snapsvc.WithPollInterval(time.Second),
				snapsvc.WithObserver(func(ev snapsvc.Event) {
					if ev.Kind == snapsvc.EventUnreachable {
						mu.Lock()
						giveUpAt = ev.GiveUpAt
						mu.Unlock()
					}
				}))
			done := make(chan error, 1)
			go func() { _, err := c.WaitChange(ctxT(t), chg.ID()); done <- err }()
			// Let the wait settle into its idle, then take snapd away.
			if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.RequestsTo("GET /v2/changes/{id}") > 0 }); err != nil {
				t.Fatal(err)
			}
			srv.StopListening()
			err := recvT(t, done)
			returned := time.Now()
			mu.Lock()
			at := giveUpAt
			mu.Unlock()
			if !errors.Is(err, snapsvc.ErrGaveUp) {
				t.Fatalf("WaitChange: %v, want ErrGaveUp", err)
			}
			if at.IsZero() {
				t.Fatal("no EventUnreachable announced a give-up time")
			}
			if late := returned.Sub(at); late > boundEpsilon {
				t.Errorf("gave up %v after the give-up time it announced (epsilon %v)", late, boundEpsilon)
			}
		})
	}
}
