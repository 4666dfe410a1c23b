package snapsvc_test

// Tests of an operation's main path (operation.go): one request, its change
// waited for, its verdict; bad input refused before any request.

import (
	"context"
	"encoding/json"
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
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(2*time.Millisecond)))
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

func TestUnknownServiceFailsAfterOneRequest(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
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
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(snap))
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
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
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

func TestAsyncThenNextOperationDoesNotConflict(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(5*time.Millisecond)))
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

// Operations that span two snaps take both snaps' locks in one order, so
// they neither deadlock against single-snap operations nor conflict.
func TestMultiSnapOperationsNeitherDeadlockNorConflict(t *testing.T) {
	etcd := fake.Snap{Name: "etcd", Apps: []fake.App{{Name: "etcd", Daemon: "simple", Enabled: true, Active: true,
		StartDuration: time.Millisecond, StopDuration: time.Millisecond}}}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(time.Millisecond), etcd))
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

// TestInvalidNamesNamed checks that an operation refused for its names
// says which names it was given, even empty ones, before any request.
func TestInvalidNamesNamed(t *testing.T) {
	c, err := snapsvc.New(snapsvc.WithSocket("/nonexistent/snapd.socket"), snapsvc.WithoutFileLock())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		names []string
		want  string
		is    error
	}{
		{[]string{""}, `snapsvc: restart "": invalid service name "": snap name "" must be 2 to 40 characters [not retryable]`, snapsvc.ErrInvalidName},
		{[]string{"k8s.kubelet", "K8S"}, `snapsvc: restart k8s.kubelet K8S: invalid service name "K8S": `, snapsvc.ErrInvalidName},
		{nil, `snapsvc: restart: `, snapsvc.ErrNoNames},
	} {
		_, err := c.Restart(context.Background(), tc.names, snapsvc.RestartOptions{})
		if !errors.Is(err, tc.is) || len(err.Error()) < len(tc.want) || err.Error()[:len(tc.want)] != tc.want {
			t.Errorf("Restart(%q): %v\nwant prefix %s", tc.names, err, tc.want)
		}
	}
}

func TestOperationWaitFromSeveralGoroutines(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(time.Millisecond)))
	c := newClient(t, srv)
	op, err := c.RestartAsync(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, err := op.Wait(ctxT(t)); err != nil || res.Status != "Done" || res.ChangeID != op.ChangeID() {
				t.Errorf("wait: %+v %v", res, err)
			}
		}()
	}
	wg.Wait()
}

// Repeated names are sent once, as the lost-answer matcher expects.
func TestRepeatedNamesSentOnce(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv)
	if _, err := c.Restart(ctxT(t), []string{"k8s.kubelet", "k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	if body := srv.Requests()[0].Body; !strings.Contains(body, `"names":["k8s.kubelet"]`) {
		t.Fatalf("sent %s", body)
	}
}

// APIError, Change and Task are snapsvc's own types (their fields show in
// go doc): errors.As finds an APIError in what the client returns, a hand-
// made one classifies like snapd's, and changes keep snapd's JSON.
func TestPublicWireTypes(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
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
