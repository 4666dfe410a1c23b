package plan_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/plan"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

func TestNewRejects(t *testing.T) {
	svc := func(name string, after ...string) plan.Service { return plan.Service{Name: name, After: after} }
	for _, tc := range []struct {
		name     string
		services []plan.Service
		is       error
		msg      string
	}{
		{"cycle", []plan.Service{svc("k8s.a", "k8s.c"), svc("k8s.b", "k8s.a"), svc("k8s.c", "k8s.b"), svc("k8s.d")},
			plan.ErrCycle, "k8s.a -> k8s.c -> k8s.b -> k8s.a"},
		{"self", []plan.Service{svc("k8s.kubelet", "k8s.kubelet")}, plan.ErrCycle, "k8s.kubelet -> k8s.kubelet"},
		// k8s-snap #2530: the apiserver needing a pod that kubelet runs.
		{"hidden gate", []plan.Service{svc("k8s.kube-apiserver", "k8s.kubelet"), svc("k8s.kubelet", "k8s.kube-apiserver")},
			plan.ErrCycle, "k8s.kube-apiserver -> k8s.kubelet -> k8s.kube-apiserver"},
		{"unknown", []plan.Service{svc("k8s.kubelet", "k8s.containerd")}, plan.ErrUnknown, `"k8s.kubelet" comes after unknown service "k8s.containerd"`},
		{"duplicate", []plan.Service{svc("k8s.kubelet"), svc("k8s.kubelet")}, plan.ErrDuplicate, "k8s.kubelet"},
		{"invalid", []plan.Service{svc("K8S.kubelet")}, snapsvc.ErrInvalidName, "K8S.kubelet"},
		{"whole snap", []plan.Service{svc("k8s")}, snapsvc.ErrInvalidName, "not a whole snap"},
	} {
		_, err := plan.New(tc.services, plan.Options{})
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want %v mentioning %q", tc.name, err, tc.is, tc.msg)
		}
	}
}

// postedNames decodes the names of each POST /v2/apps.
func postedNames(t *testing.T, srv *fake.Server) [][]string {
	t.Helper()
	var out [][]string
	for _, body := range appsPosts(srv) {
		var inst struct {
			Action string   `json:"action"`
			Names  []string `json:"names"`
			Enable bool     `json:"enable"`
		}
		if err := json.Unmarshal([]byte(body), &inst); err != nil {
			t.Fatal(err)
		}
		if inst.Action != "start" || !inst.Enable {
			t.Errorf("request %s, want start --enable", body)
		}
		out = append(out, inst.Names)
	}
	return out
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestControlPlaneOrderBatchesAndReady(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap()))
	c := newClient(t, srv)
	ctx := ctxT(t)
	api, kubelet := newReadyz(t), newReadyz(t)
	services := controlPlane(tcpListener(t), api.URL)
	services[5].Probe = &probe.HTTP{URL: kubelet.URL + "/readyz"} // kubelet's healthz
	mc := fake.NewManualClock(t0)
	var events []string
	p, err := plan.New(services, plan.Options{Enable: true, Clock: testclock.Of(mc),
		Probe: probe.Options{Interval: time.Second, Timeout: time.Hour},
		OnEvent: func(e plan.Event) {
			events = append(events, e.Kind.String()+" "+strings.Join(e.Services, ","))
		}})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- p.Start(ctx, c) }()

	// The apiserver's probe failed once and waits an interval.
	testclock.WaitTimerAt(ctx, t, mc, t0.Add(time.Second))
	want := [][]string{{"k8s.containerd", "k8s.etcd"}, {"k8s.kube-apiserver"}}
	if got := postedNames(t, srv); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("requests %v, want %v", got, want)
	}
	for _, app := range []string{"kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"} {
		if st, _ := srv.Service("k8s", app); st.Active {
			t.Errorf("k8s.%s started before the apiserver was ready", app)
		}
	}
	if !p.IsReady("k8s.etcd") || !p.IsReady("k8s.containerd") || p.IsReady("k8s.kube-apiserver") || isClosed(p.Ready()) {
		t.Fatal("readiness wrong while the apiserver is not ready")
	}

	// The apiserver answers: its dependents start together, in one change.
	api.up.Store(true)
	mc.Advance(time.Second)
	testclock.WaitTimerAt(ctx, t, mc, t0.Add(2*time.Second)) // kubelet's probe waits
	want = append(want, []string{"k8s.kube-controller-manager", "k8s.kube-scheduler", "k8s.kubelet", "k8s.kube-proxy"})
	if got := postedNames(t, srv); !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("requests %v, want %v", got, want)
	}
	if isClosed(p.Ready()) {
		t.Fatal("ready before kubelet's probe passed")
	}

	kubelet.up.Store(true)
	mc.Advance(time.Second)
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := p.Err(); err != nil || !isClosed(p.Done()) {
		t.Errorf("after Start: Err %v, Done closed %v", err, isClosed(p.Done()))
	}
	bs := p.Batches()
	if len(bs) != 3 || bs[2].ChangeID == "" {
		t.Errorf("batches %+v", bs)
	}
	if n := srv.Counters().ChangesCreated; n != 3 {
		t.Errorf("%d changes, want 3", n)
	}
	for _, s := range services {
		if st, _ := srv.Service("k8s", strings.TrimPrefix(s.Name, "k8s.")); !st.Active || !st.Enabled {
			t.Errorf("%s = %+v, want active and enabled", s.Name, st)
		}
	}
	if api.calls.Load() != 2 || kubelet.calls.Load() != 2 {
		t.Errorf("probe checks: apiserver %d, kubelet %d; want 2 each", api.calls.Load(), kubelet.calls.Load())
	}
	wantEvents := []string{
		"starting k8s.containerd,k8s.etcd", "started k8s.containerd,k8s.etcd", "ready k8s.containerd", "ready k8s.etcd",
		"starting k8s.kube-apiserver", "started k8s.kube-apiserver", "ready k8s.kube-apiserver",
		"starting k8s.kube-controller-manager,k8s.kube-scheduler,k8s.kubelet,k8s.kube-proxy",
		"started k8s.kube-controller-manager,k8s.kube-scheduler,k8s.kubelet,k8s.kube-proxy",
		"ready k8s.kube-controller-manager", "ready k8s.kube-scheduler", "ready k8s.kube-proxy", "ready k8s.kubelet",
	}
	if !slices.Equal(events, wantEvents) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(events, "\n"), strings.Join(wantEvents, "\n"))
	}
	if err := p.Start(ctx, c); !errors.Is(err, plan.ErrStarted) {
		t.Errorf("second Start: %v", err)
	}
}

func TestProbeTimeoutNamesServiceProbeAndLastError(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap()))
	c := newClient(t, srv)
	ctx := ctxT(t)
	api := newReadyz(t) // never up
	mc := fake.NewManualClock(t0)
	services := controlPlane(tcpListener(t), api.URL)
	services[2].ProbeOptions.MaxWait = 5 * time.Second
	p, err := plan.New(services, plan.Options{Clock: testclock.Of(mc), Probe: probe.Options{Interval: time.Second, Timeout: time.Hour, MaxWait: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- p.Start(ctx, c) }()
	err = testclock.Drive(t, mc, time.Minute, errc)
	var se *plan.ServiceError
	if !errors.As(err, &se) || !errors.Is(err, probe.ErrNotReady) {
		t.Fatalf("err = %v, want a ServiceError for a probe", err)
	}
	if !slices.Equal(se.Services, []string{"k8s.kube-apiserver"}) {
		t.Errorf("services %v", se.Services)
	}
	msg := err.Error()
	for _, want := range []string{"service k8s.kube-apiserver not ready", "GET " + api.URL + "/readyz", "503 Service Unavailable",
		"etcd failed: reason withheld", "maximum wait exceeded (5s)",
		"not started: k8s.kube-controller-manager, k8s.kube-scheduler, k8s.kubelet, k8s.kube-proxy"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q\ndoes not mention %q", msg, want)
		}
	}
	if isClosed(p.Ready()) || !isClosed(p.Done()) || p.WaitReady(ctx) != err {
		t.Error("failed plan: Ready closed, Done open or WaitReady disagrees")
	}
	if got := mc.Now().Sub(t0); got != 5*time.Second {
		t.Errorf("gave up after %v, want 5s", got)
	}
	if n := len(appsPosts(srv)); n != 2 {
		t.Errorf("%d start requests, want 2 (nothing after the apiserver)", n)
	}
}

func TestContextEndNamesWaitingProbe(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap()))
	c := newClient(t, srv)
	api := newReadyz(t)
	mc := fake.NewManualClock(t0)
	p, err := plan.New(controlPlane(tcpListener(t), api.URL), plan.Options{Clock: testclock.Of(mc),
		Probe: probe.Options{Interval: time.Second, Timeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	errc := make(chan error, 1)
	go func() { errc <- p.Start(ctx, c) }()

	// A controller's wait is cancellable on its own.
	wctx, wcancel := context.WithCancel(ctx)
	wcancel()
	if err := p.WaitReady(wctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitReady with a cancelled context: %v", err)
	}

	testclock.WaitTimerAt(ctx, t, mc, t0.Add(time.Second))
	cancel()
	err = <-errc
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "k8s.kube-apiserver not ready") ||
		!strings.Contains(err.Error(), "last error: status 503") {
		t.Errorf("err = %v", err)
	}
}

func TestStartFailureNamesBatch(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap()))
	srv.SetFailStart("k8s", "etcd", fake.SystemctlJobFailed("k8s", "etcd"))
	c := newClient(t, srv)
	p, err := plan.New(controlPlane(tcpListener(t), "http://127.0.0.1:1"), plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Start(ctxT(t), c)
	var se *plan.ServiceError
	var oe *snapsvc.OpError
	if !errors.As(err, &se) || !errors.As(err, &oe) {
		t.Fatalf("err = %v", err)
	}
	if !slices.Equal(se.Services, []string{"k8s.containerd", "k8s.etcd"}) || se.Probe != "" || len(se.Waiting) != 5 {
		t.Errorf("error fields %+v", se)
	}
	if msg := err.Error(); !strings.Contains(msg, "plan: starting k8s.containerd, k8s.etcd") || !strings.Contains(msg, "snap.k8s.etcd.service") {
		t.Errorf("error %q", msg)
	}
}

// Services unlocked by different readiness events go in separate changes,
// each as soon as its own dependency is ready.
func TestIndependentChainsStartIndependently(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap()))
	c := newClient(t, srv)
	ctx := ctxT(t)
	etcdUp, apiUp := newReadyz(t), newReadyz(t)
	// One clock per probe, so each can be driven on its own.
	etcdClock, apiClock := fake.NewManualClock(t0), fake.NewManualClock(t0)
	p, err := plan.New([]plan.Service{
		{Name: "k8s.etcd", Probe: &probe.HTTP{URL: etcdUp.URL + "/readyz"}, ProbeOptions: probe.Options{Clock: testclock.Of(etcdClock)}},
		{Name: "k8s.kube-apiserver", Probe: &probe.HTTP{URL: apiUp.URL + "/readyz"}, ProbeOptions: probe.Options{Clock: testclock.Of(apiClock)}},
		{Name: "k8s.containerd", After: []string{"k8s.etcd"}},
		{Name: "k8s.kubelet", After: []string{"k8s.kube-apiserver"}},
	}, plan.Options{Probe: probe.Options{Interval: time.Second, Timeout: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- p.Start(ctx, c) }()
	testclock.WaitTimerAt(ctx, t, etcdClock, t0.Add(time.Second))
	testclock.WaitTimerAt(ctx, t, apiClock, t0.Add(time.Second))
	etcdUp.up.Store(true)
	etcdClock.Advance(time.Second)
	// containerd starts while the apiserver is still not ready.
	if err := srv.WaitFor(ctx, func(v fake.View) bool { st, _ := v.Service("k8s", "containerd"); return st.Active }); err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); st.Active {
		t.Fatal("kubelet started before the apiserver was ready")
	}
	apiUp.up.Store(true)
	apiClock.Advance(time.Second)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"k8s.etcd", "k8s.kube-apiserver"}, {"k8s.containerd"}, {"k8s.kubelet"}}
	var got [][]string
	for _, b := range p.Batches() {
		got = append(got, b.Services)
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("batches %v, want %v", got, want)
	}
}

// With SkipRunning, services snapd already reports running are not
// started again; a plan whose services all run makes no change at all.
func TestSkipRunning(t *testing.T) {
	snap := k8sSnap()
	for i := range snap.Apps {
		switch snap.Apps[i].Name {
		case "containerd", "etcd":
			snap.Apps[i].Active, snap.Apps[i].Enabled = true, true
		case "kube-apiserver":
			snap.Apps[i].Active = true // running, but left disabled
		}
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(snap))
	c := newClient(t, srv)
	ctx := ctxT(t)
	api := newReadyz(t)
	api.up.Store(true)
	opts := plan.Options{Enable: true, SkipRunning: true, Probe: probe.Options{Interval: time.Second, MaxWait: time.Minute}}
	p, err := plan.New(controlPlane(tcpListener(t), api.URL), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(ctx, c); err != nil {
		t.Fatal(err)
	}
	if got := p.Skipped(); !slices.Equal(got, []string{"k8s.containerd", "k8s.etcd"}) {
		t.Errorf("skipped %v", got)
	}
	want := [][]string{{"k8s.kube-apiserver"}, {"k8s.kube-controller-manager", "k8s.kube-scheduler", "k8s.kubelet", "k8s.kube-proxy"}}
	if got := postedNames(t, srv); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("requests %v, want %v", got, want)
	}
	if st, _ := srv.Service("k8s", "kube-apiserver"); !st.Enabled {
		t.Error("kube-apiserver left disabled")
	}

	// Everything runs now: a new plan makes no change, and is ready.
	before := srv.Counters().ChangesCreated
	p, _ = plan.New(controlPlane(tcpListener(t), api.URL), opts)
	if err := p.Start(ctx, c); err != nil {
		t.Fatal(err)
	}
	if n := srv.Counters().ChangesCreated; n != before || len(p.Batches()) != 0 || len(p.Skipped()) != 7 || !isClosed(p.Ready()) {
		t.Errorf("second run: %d new changes, batches %v, skipped %v", n-before, p.Batches(), p.Skipped())
	}
}
