package snapsvc_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// boundEpsilon is how far past its bound (its context's deadline, its
// policy's MaxElapsedTime) a call may return: the README's stated epsilon.
const boundEpsilon = 50 * time.Millisecond

// checkBound fails the test when a call that started at start, bounded
// by bound, returned (now) more than boundEpsilon past it.
func checkBound(t *testing.T, what string, start time.Time, bound time.Duration) {
	t.Helper()
	took := time.Since(start)
	if over := took - bound; over > boundEpsilon {
		t.Errorf("%s returned %v after it began, %v past its bound of %v (epsilon %v)", what, took.Round(time.Millisecond), over.Round(time.Millisecond), bound, boundEpsilon)
	}
}

// wedge makes the fake a wedged snapd for every request matching f (its
// Kind and Hold are set here) until the test ends.
func wedge(t *testing.T, srv *fake.Server, f fake.Fault) {
	t.Helper()
	hold := make(chan struct{})
	f.Kind, f.Hold = fake.FaultWedge, hold
	inj := srv.InjectFault(f)
	t.Cleanup(func() { inj.Remove(); close(hold) })
}

// boundCalls are the calls issue 18 found outliving their deadline.
var boundCalls = []struct {
	name string
	call func(ctx context.Context, c *snapsvc.Client) error
}{
	{"Restart", func(ctx context.Context, c *snapsvc.Client) error {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		return err
	}},
	{"RestartAsync", func(ctx context.Context, c *snapsvc.Client) error {
		_, err := c.RestartAsync(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		return err
	}},
	{"Start --enable", func(ctx context.Context, c *snapsvc.Client) error {
		_, err := c.Start(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{Enable: true})
		return err
	}},
	{"whole-snap Stop", func(ctx context.Context, c *snapsvc.Client) error {
		_, err := c.Stop(ctx, []string{"k8s"}, snapsvc.StopOptions{})
		return err
	}},
}

// Issue 18, defect 1: with a 300 ms deadline against a snapd that accepts
// requests and never answers, calls returned after 2.3 s: after the
// deadline the client looked the change up for 2 s more. A call now
// returns by its deadline; its outcome is unknown and not retryable.
func TestDeadlineAgainstWedgedSnapd(t *testing.T) {
	for _, tc := range boundCalls {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
			c := newClient(t, srv)
			wedge(t, srv, fake.Fault{})
			const d = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			start := time.Now()
			err := tc.call(ctx, c)
			checkBound(t, tc.name, start, d)
			var opErr *snapsvc.OpError
			if !errors.As(err, &opErr) || opErr.Retryable() || !errors.Is(err, snapsvc.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("error %v: want the deadline, outcome unknown, not retryable", err)
			}
		})
	}
}

// Issue 18, defect 2: with MaxElapsedTime = MaxUnreachable = 500 ms and
// no context deadline, a restart against a wedged snapd had not returned
// after 4 s: the policy was only checked between attempts. It is now a
// deadline on every request.
func TestPolicyBoundAgainstWedgedSnapd(t *testing.T) {
	policy := retry.DefaultPolicy()
	policy.MaxElapsedTime, policy.MaxUnreachable = 500*time.Millisecond, 500*time.Millisecond
	for _, tc := range boundCalls {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
			c := newClient(t, srv, snapsvc.WithPolicy(policy))
			wedge(t, srv, fake.Fault{})
			start := time.Now()
			err := tc.call(context.Background(), c)
			checkBound(t, tc.name, start, policy.MaxElapsedTime)
			var opErr *snapsvc.OpError
			if !errors.As(err, &opErr) || opErr.Retryable() || !errors.Is(err, snapsvc.ErrOutcomeUnknown) || !errors.Is(err, snapsvc.ErrGaveUp) {
				t.Fatalf("error %v: want gave up, outcome unknown, not retryable", err)
			}
		})
	}
	t.Run("wedged while waiting for the change", func(t *testing.T) {
		srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
		c := newClient(t, srv, snapsvc.WithPolicy(policy))
		wedge(t, srv, fake.Fault{Method: "GET"})
		start := time.Now()
		_, err := c.Restart(context.Background(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		checkBound(t, "Restart", start, policy.MaxElapsedTime)
		var opErr *snapsvc.OpError
		if !errors.As(err, &opErr) || opErr.Retryable() || opErr.ChangeID == "" || !errors.Is(err, snapsvc.ErrGaveUp) {
			t.Fatalf("error %v: want gave up, naming the change, not retryable", err)
		}
	})
}

// A call cut off in flight looks its change up in the background, so the
// next operation on the snap waits for it instead of running into it.
func TestInFlightChangeFoundInBackground(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	logs := newLogWatch()
	c := newClient(t, srv, snapsvc.WithLogger(logs.logger()))
	hold := make(chan struct{})
	// snapd acts on the restart at once but its answer hangs.
	srv.InjectFault(fake.Fault{Method: "POST", Path: "/v2/apps", Times: 1, Hold: hold})
	defer close(hold)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		errc <- err
	}()
	if err := srv.WaitFor(ctxT(t), func(v fake.View) bool { return v.Requests() > 0 }); err != nil {
		t.Fatal(err)
	}
	found := logs.seen("a request cut off in flight made a change")
	cancel()
	err := <-errc
	var opErr *snapsvc.OpError
	if !errors.As(err, &opErr) || opErr.Retryable() || !errors.Is(err, snapsvc.ErrOutcomeUnknown) || !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v: want cancelled, outcome unknown, not retryable", err)
	}
	select {
	case <-found:
	case <-ctxT(t).Done():
		t.Fatal("the change of the request cut off was not found in the background")
	}
	if n := srv.Counters().ChangesCreated; n != 1 {
		t.Fatalf("%d changes for one restart", n)
	}
}

// Issue 18, defect 6: a joiner (5 min policy) got its leader's give-up
// (the leader's short policy) without sending a request. A joiner shares
// only the change's outcome; otherwise it acts itself, within its own
// bounds.
func TestCoalesceJoinerKeepsItsOwnPolicy(t *testing.T) {
	mc := fake.NewManualClock(stepT0)
	srv := fake.NewServer(t, fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	ctx := ctxT(t)
	short, long := retry.DefaultPolicy(), retry.DefaultPolicy()
	short.MaxElapsedTime = time.Second
	c0 := newClient(t, srv)
	logs := newLogWatch()
	ca := newClient(t, srv, snapsvc.WithPolicy(short), snapsvc.WithLogger(logs.logger()))
	cb := newClient(t, srv, snapsvc.WithPolicy(long), snapsvc.WithLogger(logs.logger()))

	first := make(chan restartOutcome, 1)
	restartAsync(c0, ctx, first, "k8s.kubelet") // holds the snap's lock
	running := waitNewChange(ctx, t, srv)
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	leader, joiner := make(chan restartOutcome, 1), make(chan restartOutcome, 1)
	leading := logs.seen("leading identical restarts")
	restartAsync(ca, ctx, leader, "k8s.kubelet")
	<-leading
	joined := logs.seen("joining an identical restart")
	restartAsync(cb, ctx, joiner, "k8s.kubelet")
	<-joined
	if err := srv.AdvanceUntilReady(ctx, running); err != nil {
		t.Fatal(err)
	}
	<-first
	// The leader acts, runs into the foreign change and gives up within
	// its own second.
	if o := <-leader; !errors.Is(o.err, snapsvc.ErrGaveUp) {
		t.Fatalf("leader: %+v, %v; want gave up", o.res, o.err)
	}
	select {
	case o := <-joiner:
		t.Fatalf("joiner ended with its leader: %+v, %v", o.res, o.err)
	default:
	}
	leaderPosts := srv.Counters().Requests["POST /v2/apps"]
	// The joiner acts itself: once the foreign change is done, it restarts.
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.RequestsTo("POST /v2/apps") > leaderPosts }); err != nil {
		t.Fatal(err)
	}
	foreign.Finish()
	own := waitNewChange(ctx, t, srv, running, foreign.ID())
	if err := srv.AdvanceUntilReady(ctx, own); err != nil {
		t.Fatal(err)
	}
	o := <-joiner
	if o.err != nil || o.res.Shared || o.res.Status != "Done" {
		t.Fatalf("joiner: %+v, %v; want its own restart, done", o.res, o.err)
	}
}

// Issue 18, defect 7: WithMinRestartInterval ignored restarts made by
// another Client of the process without the option. A paced restart
// right after one now waits (here: past its deadline).
func TestRestartPacingCountsEveryClient(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	plain := newClient(t, srv)
	paced := newClient(t, srv, snapsvc.WithMinRestartInterval(time.Hour))
	if _, err := plain.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	res, err := paced.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("paced restart right after another client's: %+v, %v; want it held by the interval", res, err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 {
		t.Fatalf("%d restarts sent, want 1", n)
	}
}

// inotifyCount counts the process's open inotify instances.
func inotifyCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd:", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(l, "inotify") {
			n++
		}
	}
	return n
}

// Issue 18, defect 5: Close concurrent with a client's first call raced
// on the state file's watch (-race), and after 50 such clients 12-21
// inotify instances stayed open. Close is safe with every call: no race,
// and no inotify instance, connection or goroutine is left.
func TestCloseRacingFirstCall(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithStateFile())
	before := inotifyCount(t)
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithStateFile(srv.StateFile()))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		}()
		go func() {
			defer wg.Done()
			c.Close()
		}()
	}
	wg.Wait()
	if after := inotifyCount(t); after != before {
		t.Fatalf("%d inotify instances before 50 clients closed while calling, %d after", before, after)
	}
}

// Issue 18: a POST whose 2xx answer arrives cut, garbled or not at all,
// followed by the deadline (snapd answering the look-ups or wedged), may
// have acted: it is never reported retryable, and the call returns by
// its deadline.
func TestLostAnswerThenDeadlineIsNotRetryable(t *testing.T) {
	for _, kind := range []fake.FaultKind{fake.FaultCut, fake.FaultGarble, fake.FaultDrop} {
		for _, wedged := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v wedged=%t", kind, wedged), func(t *testing.T) {
				srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(time.Hour)))
				c := newClient(t, srv)
				srv.InjectFault(fake.Fault{Kind: kind, Method: "POST", Path: "/v2/apps", Times: 1})
				if wedged {
					wedge(t, srv, fake.Fault{Method: "GET"})
				}
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				start := time.Now()
				_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
				checkBound(t, "Restart", start, 300*time.Millisecond)
				var opErr *snapsvc.OpError
				if !errors.As(err, &opErr) || opErr.Retryable() {
					t.Fatalf("error %v: want not retryable", err)
				}
			})
		}
	}
}

// Issue 18: while snapd was unreachable the library logged "snapd
// unavailable; backing off" at Info every 50 ms. The state change is
// logged at Info once, repeats at Debug, and the end at Info with the
// count of repeats.
func TestUnreachableLogsOnceAtInfo(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	clock := &instantClock{}
	clock.onPause = func(n int) {
		if n == 30 {
			if err := srv.StartListening(); err != nil {
				t.Error(err)
			}
		}
	}
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c := newClient(t, srv, snapsvc.WithClock(clock), snapsvc.WithLogger(logger))
	if _, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if n := strings.Count(out, "snapd unavailable"); n != 1 {
		t.Errorf("%d Info lines 'snapd unavailable' for one outage:\n%s", n, out)
	}
	if !strings.Contains(out, "no longer unable to reach snapd") || !strings.Contains(out, "repeats_logged_at_debug=") {
		t.Errorf("the outage's end and its repeats are not logged at Info:\n%s", out)
	}
}

// Issue 29: a call that simply timed out while snapd was unreachable
// logged "no longer unable to reach snapd", as if snapd had come back.
// It logs that it ended while unable to reach it.
func TestUnreachableToTheEndNotLoggedAsOver(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p := retry.DefaultPolicy()
	p.MaxUnreachable = 100 * time.Millisecond
	c := newClient(t, srv, snapsvc.WithLogger(logger), snapsvc.WithPolicy(p))
	if _, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{}); !errors.Is(err, snapsvc.ErrGaveUp) {
		t.Fatalf("Start against a snapd that never comes: %v", err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if strings.Contains(out, "no longer unable to reach snapd") || !strings.Contains(out, "ended while unable to reach snapd") {
		t.Errorf("the log says the outage ended:\n%s", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
