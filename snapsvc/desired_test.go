package snapsvc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

var stepT0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// desiredSnap has one service in each enabled/active combination.
func desiredSnap() fake.Snap {
	return fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "containerd", Daemon: "notify", Enabled: true, Active: true},
		{Name: "kubelet", Daemon: "simple", Enabled: false, Active: true},
		{Name: "kube-proxy", Daemon: "simple", Enabled: true, Active: false},
		{Name: "kube-apiserver", Daemon: "simple", Enabled: false, Active: false},
		{Name: "k8s"}, // CLI, not a service
	}}
}

// appsPosts returns the bodies of POST /v2/apps requests.
func appsPosts(t *testing.T, srv *fake.Server) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, r := range srv.Requests() {
		if r.Method == "POST" && r.Path == "/v2/apps" {
			var m map[string]any
			if err := json.Unmarshal([]byte(r.Body), &m); err != nil {
				t.Fatalf("body %q: %v", r.Body, err)
			}
			out = append(out, m)
		}
	}
	return out
}

func TestEnsureRunningActsOnDifference(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(desiredSnap()))
	c := newClient(t, srv)
	ctx := ctxT(t)

	res, err := c.EnsureRunning(ctx, []string{"k8s"})
	if err != nil {
		t.Fatal(err)
	}
	wantChanged := []string{"k8s.kube-apiserver", "k8s.kube-proxy", "k8s.kubelet"}
	if !slices.Equal(res.Changed, wantChanged) || !slices.Equal(res.Unchanged, []string{"k8s.containerd"}) {
		t.Errorf("changed %v unchanged %v; want %v and [k8s.containerd]", res.Changed, res.Unchanged, wantChanged)
	}
	if res.Result == nil || res.Result.Status != "Done" || res.Result.ChangeID == "" {
		t.Errorf("result %+v, want a Done change", res.Result)
	}
	posts := appsPosts(t, srv)
	if len(posts) != 1 {
		t.Fatalf("%d POST /v2/apps, want 1: %v", len(posts), posts)
	}
	if posts[0]["action"] != "start" || posts[0]["enable"] != true {
		t.Errorf("request %v, want start --enable", posts[0])
	}
	var names []string
	for _, n := range posts[0]["names"].([]any) {
		names = append(names, n.(string))
	}
	if !slices.Equal(names, wantChanged) {
		t.Errorf("request names %v, want only the differing %v", names, wantChanged)
	}
	for _, app := range []string{"containerd", "kubelet", "kube-proxy", "kube-apiserver"} {
		if st, _ := srv.Service("k8s", app); !st.Active || !st.Enabled {
			t.Errorf("k8s.%s = %+v, want active and enabled", app, st)
		}
	}

	// Again: nothing differs, so nothing is sent and no change is made.
	before := srv.Counters()
	res, err = c.EnsureRunning(ctx, []string{"k8s.kubelet", "k8s.containerd"})
	if err != nil {
		t.Fatal(err)
	}
	after := srv.Counters()
	if res.Result != nil || len(res.Changed) != 0 || after.ChangesCreated != before.ChangesCreated || after.Requests["POST /v2/apps"] != before.Requests["POST /v2/apps"] {
		t.Errorf("second call acted: %+v; changes %d -> %d", res, before.ChangesCreated, after.ChangesCreated)
	}
}

func TestEnsureStopped(t *testing.T) {
	checkLeaks(t)
	for _, tc := range []struct {
		disable bool
		want    []string
	}{
		{false, []string{"k8s.containerd", "k8s.kubelet"}},                  // the active ones
		{true, []string{"k8s.containerd", "k8s.kube-proxy", "k8s.kubelet"}}, // and the enabled ones
	} {
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(desiredSnap()))
		c := newClient(t, srv)
		res, err := c.EnsureStopped(ctxT(t), []string{"k8s"}, snapsvc.StopOptions{Disable: tc.disable})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Changed, tc.want) {
			t.Errorf("disable=%v: changed %v, want %v", tc.disable, res.Changed, tc.want)
		}
		posts := appsPosts(t, srv)
		if len(posts) != 1 || posts[0]["action"] != "stop" || (posts[0]["disable"] == true) != tc.disable {
			t.Errorf("disable=%v: requests %v, want one stop", tc.disable, posts)
		}
		for _, app := range []string{"containerd", "kubelet", "kube-proxy", "kube-apiserver"} {
			st, _ := srv.Service("k8s", app)
			if st.Active || (tc.disable && st.Enabled) {
				t.Errorf("disable=%v: k8s.%s = %+v", tc.disable, app, st)
			}
		}
		// Idempotent.
		res, err = c.EnsureStopped(ctxT(t), []string{"k8s"}, snapsvc.StopOptions{Disable: tc.disable})
		if err != nil || res.Result != nil || len(appsPosts(t, srv)) != 1 {
			t.Errorf("disable=%v: second call: %+v, %v", tc.disable, res, err)
		}
	}
}

func TestEnsureRunningErrors(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(desiredSnap()))
	c := newClient(t, srv)
	ctx := ctxT(t)
	_, err := c.EnsureRunning(ctx, []string{"k8s.nope"})
	if !errors.Is(err, snapsvc.ErrNotFound) || !strings.Contains(err.Error(), "k8s.nope") {
		t.Errorf("unknown service: %v", err)
	}
	srv.SetFailStart("k8s", "kube-proxy", fake.SystemctlJobFailed("k8s", "kube-proxy"))
	_, err = c.EnsureRunning(ctx, []string{"k8s.kube-proxy"})
	var oe *snapsvc.OpError
	var ce *snapsvc.ChangeError
	if !errors.As(err, &oe) || !errors.As(err, &ce) || oe.Op != "start" || !strings.Contains(err.Error(), "snap.k8s.kube-proxy.service") {
		t.Errorf("failing start: %v", err)
	}
}

func TestWaitActive(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(desiredSnap()))
	mc := fake.NewManualClock(stepT0)
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)), snapsvc.WithPollInterval(500*time.Millisecond))
	ctx := ctxT(t)

	errc := make(chan error, 1)
	go func() { errc <- c.WaitActive(ctx, []string{"k8s.containerd", "k8s.kube-proxy"}) }()
	// First read done, kube-proxy inactive: WaitActive sleeps one interval.
	testclock.WaitTimerAt(ctx, t, mc, stepT0.Add(500*time.Millisecond))
	mc.Advance(500 * time.Millisecond)
	testclock.WaitTimerAt(ctx, t, mc, stepT0.Add(time.Second))
	srv.SetService("k8s", "kube-proxy", fake.AppState{Enabled: true, Active: true})
	mc.Advance(500 * time.Millisecond)
	if err := recvT(t, errc); err != nil {
		t.Fatalf("WaitActive: %v", err)
	}
	if n := srv.Counters().Requests["GET /v2/apps"]; n != 3 {
		t.Errorf("GET /v2/apps = %d, want 3 (t=0, 0.5s, 1s)", n)
	}
}

func TestWaitActiveBoundedByContext(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(desiredSnap()))
	mc := fake.NewManualClock(stepT0)
	c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)))
	ctx, cancel := context.WithCancel(ctxT(t))
	errc := make(chan error, 1)
	go func() { errc <- c.WaitActive(ctx, []string{"k8s"}) }()
	testclock.WaitTimerAt(ctx, t, mc, stepT0.Add(100*time.Millisecond)) // default poll interval
	cancel()
	err := recvT(t, errc)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context canceled", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "still inactive: k8s.kube-apiserver, k8s.kube-proxy") {
		t.Errorf("error %q does not name the inactive services", msg)
	}

	if err := c.WaitActive(ctxT(t), []string{"k8s.nope"}); !errors.Is(err, snapsvc.ErrNotFound) {
		t.Errorf("unknown service: %v, want not found at once", err)
	}
}

// At every daemon start, make sure the snap's services run and are
// enabled (a revert can leave them disabled), touching only those that
// are not.
func ExampleClient_EnsureRunning() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, _ := fake.New(fake.AllowNonRoot(), fake.WithSnaps(desiredSnap()))
	defer srv.Close()
	c, _ := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST))
	defer c.Close()
	ctx := context.Background()

	res, err := c.EnsureRunning(ctx, []string{"k8s"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("started or enabled:", strings.Join(res.Changed, " "))
	res, _ = c.EnsureRunning(ctx, []string{"k8s"})
	fmt.Println("second call acted:", res.Result != nil)
	if err := c.WaitActive(ctx, []string{"k8s"}); err == nil {
		fmt.Println("all active")
	}
	// Output:
	// started or enabled: k8s.kube-apiserver k8s.kube-proxy k8s.kubelet
	// second call acted: false
	// all active
}
