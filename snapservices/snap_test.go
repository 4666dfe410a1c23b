package snapservices_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

func TestPortRaceAbsorbsForeignChange(t *testing.T) {
	srv, err := k8sFake()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	snap := &k8sdSnap{services: newREST(t, srv)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	snapSet := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	var bootAttempts, ctlAttempts atomic.Int32
	bootErr, ctlErr := make(chan error, 1), make(chan error, 1)
	go func() { bootErr <- bootstrapControlPlane(ctx, snap, &bootAttempts) }()
	go func() { ctlErr <- restartKubelet(ctx, snap, &ctlAttempts) }()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Requests() > 0 }); err != nil {
		t.Fatal(err)
	}
	first := srv.Requests()[0]
	if first.Method != "POST" || first.Path != "/v2/apps" || first.Status != 400 || !strings.Contains(first.Message, `"configure-snap" change in progress`) {
		t.Fatalf("first request %+v: want the conflict with the configure change", first)
	}
	snapSet.Finish()
	if err := <-bootErr; err != nil {
		t.Errorf("bootstrap: %v", err)
	}
	if err := <-ctlErr; err != nil {
		t.Errorf("controller: %v", err)
	}
	if b, c := bootAttempts.Load(), ctlAttempts.Load(); b != 1 || c != 1 {
		t.Errorf("loop bodies ran bootstrap %d, controller %d times: want 1 each (no conflict reached a caller)", b, c)
	}
	for _, name := range controlPlaneServices {
		if st, _ := srv.Service("k8s", name); !st.Enabled || !st.Active {
			t.Errorf("k8s.%s ends %+v, want enabled and active", name, st)
		}
	}
	// Every accepted request came after the configure change was ready;
	// the only conflicts snapd answered were with that change.
	ready := snapSet.ReadyTime()
	accepted := 0
	for _, r := range srv.Requests() {
		if r.Method != "POST" || r.Path != "/v2/apps" {
			continue
		}
		switch r.Status {
		case 202:
			accepted++
			if r.Time.Before(ready) {
				t.Errorf("change %s accepted at %v, before the configure change was ready at %v", r.Change, r.Time, ready)
			}
		case 400:
			if !strings.Contains(r.Message, `"configure-snap" change in progress`) {
				t.Errorf("a conflict between our own calls: %s", r.Message)
			}
		default:
			t.Errorf("POST /v2/apps answered %d: %s", r.Status, r.Message)
		}
	}
	if accepted != 2 {
		t.Errorf("%d changes accepted, want 2 (one start, one restart)", accepted)
	}
	if c := srv.Counters().Conflicts; c < 1 {
		t.Errorf("%d conflicts answered: the configure change never held a call", c)
	}
}

// k8sd's bootstrap starts kube-apiserver before etcd is ready: the first
// start's change fails, and its RetryFor loop starts again 5 s later. The
// port's retry.Do keeps that retry (the change's outcome is known: it
// failed), so the second attempt succeeds.
func TestFailedStartInRetryLoopIsTriedAgain(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "containerd", Daemon: "notify"},
		{Name: "kube-apiserver", Daemon: "simple", FailStart: fake.SystemctlJobFailed("k8s", "kube-apiserver")},
	}}))
	s := newREST(t, srv)
	before := srv.Counters().ChangesCreated
	var errs []error
	err := retry.Loop{Attempts: 5}.Do(context.Background(), func() error {
		if len(errs) == 1 {
			srv.SetFailStart("k8s", "kube-apiserver", "") // etcd is up now
		}
		err := s.StartServices(context.Background(), []string{"containerd", "kube-apiserver"})
		if err != nil {
			errs = append(errs, err)
		}
		return err
	})
	if err != nil || len(errs) != 1 {
		t.Fatalf("err %v after failures %v: want success on the second attempt", err, errs)
	}
	var opErr *snapsvc.OpError
	var chgErr *snapsvc.ChangeError
	if !errors.As(errs[0], &opErr) || opErr.Retryable() || opErr.ChangeID == "" || !errors.As(errs[0], &chgErr) ||
		!strings.Contains(chgErr.Err, "Job for snap.k8s.kube-apiserver.service failed") {
		t.Fatalf("first failure %v: want a non-retryable *OpError with the change and snapd's text", errs[0])
	}
	if n := srv.Counters().ChangesCreated - before; n != 2 {
		t.Fatalf("%d changes created, want 2 (one per attempt)", n)
	}
	if st, _ := srv.Service("k8s", "kube-apiserver"); !st.Active || !st.Enabled {
		t.Fatalf("kube-apiserver %+v", st)
	}
}

// A start that keeps failing is tried as often as the loop allows, then
// reported with snapd's text and the attempts.
func TestFailedStartInRetryLoopGivesUp(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", FailStart: fake.SystemctlJobFailed("k8s", "kubelet")},
	}}))
	s := newREST(t, srv)
	before := srv.Counters().ChangesCreated
	calls := 0
	err := retry.Loop{Attempts: 3}.Do(context.Background(), func() error {
		calls++
		return s.StartServices(context.Background(), []string{"kubelet"})
	})
	var stopped *retry.StoppedError
	var chgErr *snapsvc.ChangeError
	if calls != 3 || !errors.As(err, &stopped) || stopped.Attempts != 3 || !errors.As(err, &chgErr) {
		t.Fatalf("calls %d, err %v: want 3 calls and a StoppedError wrapping the change's failure", calls, err)
	}
	if n := srv.Counters().ChangesCreated - before; n != 3 {
		t.Fatalf("%d changes, want 3", n)
	}
}

func TestBareNameMapsToInstance(t *testing.T) {
	// A snap named kubelet exists in the store: a bare "kubelet" given to
	// snapsvc.Client would address it. Through the handle it is k8s's.
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(
		fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}},
		fake.Snap{Name: "kubelet", Apps: []fake.App{{Name: "daemon", Daemon: "simple"}}},
	))
	s := newREST(t, srv)
	if err := s.StartServices(context.Background(), []string{"kubelet"}, "--enable"); err != nil {
		t.Fatal(err)
	}
	if got := postedNames(t, srv); len(got) != 1 || !slices.Equal(got[0], []string{"k8s.kubelet"}) {
		t.Fatalf("posted names %v, want [[k8s.kubelet]]", got)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Enabled || !st.Active {
		t.Fatalf("k8s.kubelet %+v", st)
	}
	if st, _ := srv.Service("kubelet", "daemon"); st.Active || st.Enabled {
		t.Fatalf("the kubelet snap was touched: %+v", st)
	}
}

func TestBadInputSendsNothing(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
	s := newREST(t, srv)
	ctx := context.Background()
	cases := []struct {
		name string
		call func() error
		want error
		text string
	}{
		{"--force", func() error { return s.StopServices(ctx, []string{"kubelet"}, "--force") }, snapservices.ErrUnknownFlag, "--force"},
		{"--enable on stop", func() error { return s.StopServices(ctx, []string{"kubelet"}, "--enable") }, snapservices.ErrUnknownFlag, "--enable"},
		{"--users=all", func() error { return s.RestartServices(ctx, []string{"kubelet"}, "--users=all") }, snapservices.ErrUnsupportedFlag, "--users=all"},
		{"bad prefixed", func() error { return s.RestartServices(ctx, []string{"k8s.kube_let"}) }, snapsvc.ErrInvalidName, `"k8s.kube_let"`},
		{"other snap", func() error { return s.RestartServices(ctx, []string{"etcd.etcd"}) }, snapsvc.ErrWrongSnap, `"etcd"`},
		{"empty", func() error { return s.StartServices(ctx, []string{""}) }, snapsvc.ErrInvalidName, `""`},
		{"no names", func() error { return s.StartServices(ctx, nil) }, snapsvc.ErrNoNames, "no services"},
	}
	for _, c := range cases {
		err := c.call()
		var opErr *snapsvc.OpError
		if !errors.Is(err, c.want) || !errors.As(err, &opErr) || opErr.Retryable() || !strings.Contains(err.Error(), c.text) {
			t.Errorf("%s: %v: want a non-retryable *OpError wrapping %v and naming %s", c.name, err, c.want, c.text)
		}
	}
	if n := len(srv.Requests()); n != 0 {
		t.Fatalf("%d requests sent for bad input, want 0: %+v", n, srv.Requests())
	}
}

func TestNoWaitReturnsBeforeTheChangeIsDone(t *testing.T) {
	mc := fake.NewManualClock(time.Unix(1000, 0))
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true, StopDuration: 10 * time.Second},
	}}))
	s := newREST(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.StopServices(ctx, []string{"kubelet"}, "--disable", "--no-wait"); err != nil {
		t.Fatal(err)
	}
	chgs := srv.Changes()
	if len(chgs) != 1 || chgs[0].Ready {
		t.Fatalf("changes %+v: want one still running", chgs)
	}
	if err := srv.AdvanceUntilReady(ctx, chgs[0].ID); err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); st.Active || st.Enabled {
		t.Fatalf("kubelet %+v after the stop, want disabled and inactive", st)
	}
}

func TestSnapctlModeRefusesNoWait(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true}}}))
	s := newREST(t, srv, snapservices.WithSnapctl(), snapservices.WithClientOptions(snapsvc.WithCookie(srv.Cookie("k8s")), snapsvc.WithHook("")))
	if m := s.Client().Mode(); m != snapsvc.ModeSnapctl {
		t.Fatalf("mode %v", m)
	}
	err := s.StopServices(context.Background(), []string{"kubelet"}, "--disable", "--no-wait")
	if !errors.Is(err, snapservices.ErrUnsupportedFlag) || !strings.Contains(err.Error(), "--no-wait") {
		t.Fatalf("%v: want ErrUnsupportedFlag naming --no-wait", err)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Fatalf("%d requests sent, want 0", n)
	}
	// Without --no-wait snapctl does the job.
	if err := s.StopServices(context.Background(), []string{"kubelet"}, "--disable"); err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); st.Active || st.Enabled {
		t.Fatalf("kubelet %+v", st)
	}
	for _, r := range srv.Requests() {
		if r.Path == "/v2/apps" && r.Method == "POST" {
			t.Fatalf("snapctl mode posted to /v2/apps: %+v", r)
		}
	}
}

func TestSnapctlNoWaitInConfigureHookIsQueued(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
	hook := srv.StartHook("k8s", "configure")
	s := newREST(t, srv, snapservices.WithSnapctl(), snapservices.WithClientOptions(snapsvc.WithCookie(hook.Cookie()), snapsvc.WithHook("configure")))
	// snapd queues the command until the hook ends and answers at once, so
	// --no-wait is honest here.
	if err := s.StartServices(context.Background(), []string{"kubelet"}, "--enable", "--no-wait"); err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); st.Active {
		t.Fatal("kubelet started inside the configure hook")
	}
	hook.Finish()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { st, _ := v.Service("k8s", "kubelet"); return st.Active && st.Enabled }); err != nil {
		t.Fatal(err)
	}
}

func TestEnsureRunningActsOnTheDifference(t *testing.T) {
	for _, noWait := range []bool{false, true} {
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
			{Name: "containerd", Daemon: "simple", Enabled: true, Active: true},
			{Name: "kubelet", Daemon: "simple", Active: true}, // a revert left it disabled
			{Name: "kube-proxy", Daemon: "simple"},
		}}))
		s := newREST(t, srv, snapservices.WithEnsureRunning(), snapservices.WithPlainFlags())
		args := []string{"--enable"}
		if noWait {
			args = append(args, "--no-wait")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		all := []string{"containerd", "kubelet", "kube-proxy"}
		if err := s.StartServices(ctx, all, args...); err != nil {
			t.Fatal(err)
		}
		if err := srv.WaitIdle(ctx); err != nil {
			t.Fatal(err)
		}
		if got := postedNames(t, srv); len(got) != 1 || !slices.Equal(got[0], []string{"k8s.kube-proxy", "k8s.kubelet"}) {
			t.Fatalf("no-wait %t: posted %v, want one start of kube-proxy and kubelet", noWait, got)
		}
		for _, name := range all {
			if st, _ := srv.Service("k8s", name); !st.Enabled || !st.Active {
				t.Fatalf("no-wait %t: k8s.%s %+v", noWait, name, st)
			}
		}
		// Everything running and enabled: no change at all.
		if err := s.StartServices(ctx, all, args...); err != nil {
			t.Fatal(err)
		}
		if got := postedNames(t, srv); len(got) != 1 {
			t.Fatalf("no-wait %t: a second ensure posted again: %v", noWait, got)
		}
		// A start without --enable is a plain start.
		if err := s.StartServices(ctx, []string{"kubelet"}); err != nil {
			t.Fatal(err)
		}
		if got := postedNames(t, srv); len(got) != 2 {
			t.Fatalf("no-wait %t: a plain start was not sent: %v", noWait, got)
		}
	}
}

func TestInstanceAndDefaultMode(t *testing.T) {
	// k8sd's environment: a classic snap's daemon has SNAP_COOKIE.
	t.Setenv("SNAP_COOKIE", "some-cookie")
	t.Setenv("SNAP_NAME", "k8s")
	t.Setenv("SNAP_INSTANCE_NAME", "k8s_dev")
	s, err := snapservices.New()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Instance() != "k8s_dev" || s.Client().Mode() != snapsvc.ModeREST {
		t.Fatalf("instance %q mode %v, want k8s_dev over REST", s.Instance(), s.Client().Mode())
	}
	t.Setenv("SNAP_INSTANCE_NAME", "")
	if s, err := snapservices.New(); err != nil || s.Instance() != "k8s" {
		t.Fatalf("from SNAP_NAME: %v, %v", s, err)
	}
	t.Setenv("SNAP_NAME", "")
	if _, err := snapservices.New(); err == nil || !strings.Contains(err.Error(), "WithInstance") {
		t.Fatalf("no instance: %v", err)
	}
	if _, err := snapservices.New(snapservices.WithInstance("k8s.kubelet")); !errors.Is(err, snapsvc.ErrInvalidName) {
		t.Fatalf("bad instance: %v", err)
	}
	if s, err := snapservices.New(snapservices.WithInstance("k8s"), snapservices.WithSnapctl()); err != nil || s.Client().Mode() != snapsvc.ModeSnapctl {
		t.Fatalf("WithSnapctl: %v", err)
	}
}

// Issue 44, item 7: the handle had no WithSocket; reaching a fake took
// WithClientOptions(snapsvc.WithSocket(...)). WithSocket and
// WithSnapSocket name the sockets of the client New builds, in each mode;
// with WithClient, whose client has its own, New fails.
func TestWithSockets(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rest, err := snapservices.New(snapservices.WithInstance("k8s"), snapservices.WithSocket(srv.SocketPath()))
	if err != nil {
		t.Fatal(err)
	}
	defer rest.Close()
	if err := rest.StartServices(ctx, []string{"kubelet"}); err != nil {
		t.Fatalf("REST on WithSocket: %v", err)
	}
	ctl, err := snapservices.New(snapservices.WithInstance("k8s"), snapservices.WithSnapctl(), snapservices.WithSnapSocket(srv.SnapSocketPath()),
		snapservices.WithClientOptions(snapsvc.WithCookie(srv.Cookie("k8s"))))
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	if err := ctl.RestartServices(ctx, []string{"kubelet"}); err != nil {
		t.Fatalf("snapctl on WithSnapSocket: %v", err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 {
		t.Errorf("%d POST /v2/apps, want the REST handle's one", n)
	}
	if n := srv.Counters().Requests["POST /v2/snapctl"]; n < 1 {
		t.Errorf("%d POST /v2/snapctl, want the snapctl handle's", n)
	}
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := snapservices.New(snapservices.WithInstance("k8s"), snapservices.WithClient(c), snapservices.WithSocket("/elsewhere")); !errors.Is(err, snapservices.ErrSetup) {
		t.Errorf("WithClient and WithSocket: %v, want ErrSetup", err)
	}
}
