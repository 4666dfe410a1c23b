package snapservicestest_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapservices/snapservicestest"
	"github.com/snapsvc/snapsvc/snapsvc"
)

func TestRecorderRecordsAndChecks(t *testing.T) {
	r := snapservicestest.NewRecorder("k8s")
	ctx := context.Background()
	if err := r.StartServices(ctx, []string{"containerd", "kubelet"}, "--enable"); err != nil {
		t.Fatal(err)
	}
	if err := r.StopServices(ctx, []string{"kube-proxy"}, "--force"); !errors.Is(err, snapservices.ErrUnknownFlag) {
		t.Fatalf("--force: %v", err)
	}
	if err := r.RestartServices(ctx, []string{"etcd.etcd"}); !errors.Is(err, snapsvc.ErrWrongSnap) {
		t.Fatalf("another snap's service: %v", err)
	}
	calls := r.Calls()
	if len(calls) != 3 {
		t.Fatalf("%d calls", len(calls))
	}
	c := calls[0]
	if c.Action != "start" || !slices.Equal(c.Services, []string{"containerd", "kubelet"}) || !slices.Equal(c.Args, []string{"--enable"}) ||
		!slices.Equal(c.Names, []string{"k8s.containerd", "k8s.kubelet"}) || c.Err != nil ||
		!slices.Equal(c.Command, []string{"snap", "start", "k8s.containerd", "k8s.kubelet", "--enable", "--enable"}) {
		t.Fatalf("first call %+v", c)
	}
	if calls[1].Names != nil || !errors.Is(calls[1].Err, snapservices.ErrUnknownFlag) {
		t.Fatalf("refused call %+v", calls[1])
	}
	// Calls returns copies.
	calls[0].Services[0] = "changed"
	if r.Calls()[0].Services[0] != "containerd" {
		t.Fatal("Calls shares its slices")
	}
	if got := r.CallsOf("restart"); len(got) != 1 {
		t.Fatalf("CallsOf(restart) = %+v", got)
	}
	r.Reset()
	if len(r.Calls()) != 0 {
		t.Fatal("Reset kept calls")
	}
}

func TestRecorderErrors(t *testing.T) {
	r := snapservicestest.NewRecorder("k8s")
	ctx := context.Background()
	busy := errors.New("busy")
	broken := errors.New("broken")
	r.FailCall(2, busy)
	r.FailService("restart", "kubelet", broken)
	r.FailService("", "containerd", broken)
	var handled []string
	r.HandleFunc(func(_ context.Context, c snapservicestest.Call) error {
		handled = append(handled, c.Action+" "+fmt.Sprint(c.Names))
		return nil
	})
	results := []error{
		r.RestartServices(ctx, []string{"kube-proxy"}),                        // 1: ok
		r.RestartServices(ctx, []string{"kube-proxy"}),                        // 2: FailCall
		r.RestartServices(ctx, []string{"kube-proxy", "kubelet"}),             // 3: FailService restart kubelet
		r.StartServices(ctx, []string{"kubelet"}, "--enable"),                 // 4: ok (restart only)
		r.StopServices(ctx, []string{"containerd"}, "--disable", "--no-wait"), // 5: any action
	}
	want := []error{nil, busy, broken, nil, broken}
	for i := range want {
		if !errors.Is(results[i], want[i]) || (want[i] == nil) != (results[i] == nil) {
			t.Errorf("call %d: %v, want %v", i+1, results[i], want[i])
		}
	}
	if len(handled) != 2 {
		t.Errorf("handler saw %q, want the two calls no error answered", handled)
	}
	for i, c := range r.Calls() {
		if !errors.Is(c.Err, want[i]) || (want[i] == nil) != (c.Err == nil) {
			t.Errorf("recorded call %d: Err %v, want %v", i+1, c.Err, want[i])
		}
	}
	r.ClearFailures()
	if err := r.RestartServices(ctx, []string{"kubelet"}); err != nil {
		t.Fatalf("after ClearFailures: %v", err)
	}
}

func TestRecorderConcurrentCallers(t *testing.T) {
	r := snapservicestest.NewRecorder("k8s")
	failure := errors.New("kubelet restart failed")
	r.FailService("restart", "kubelet", failure)
	var handled atomic.Int64
	r.HandleFunc(func(context.Context, snapservicestest.Call) error {
		handled.Add(1)
		return nil
	})
	const workers, each = 8, 50
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := 0; i < each; i++ {
				switch i % 3 {
				case 0:
					errs <- r.StartServices(ctx, []string{"containerd"}, "--enable")
				case 1:
					errs <- r.RestartServices(ctx, []string{"kubelet"})
				case 2:
					errs <- r.StopServices(ctx, []string{"kube-proxy"}, "--disable")
				}
				_ = r.Calls() // readers race with writers
			}
		}()
	}
	wg.Wait()
	close(errs)
	failed := 0
	for err := range errs {
		if err != nil {
			if !errors.Is(err, failure) {
				t.Fatalf("unexpected %v", err)
			}
			failed++
		}
	}
	calls := r.Calls()
	if len(calls) != workers*each {
		t.Fatalf("%d calls recorded, want %d", len(calls), workers*each)
	}
	restarts := len(r.CallsOf("restart"))
	if restarts != workers*17 || failed != restarts {
		t.Fatalf("%d restarts, %d failures: want %d of each", restarts, failed, workers*17)
	}
	if n := handled.Load(); n != int64(workers*each-restarts) {
		t.Fatalf("handler ran %d times, want %d (every call no error answered)", n, workers*each-restarts)
	}
	for _, c := range calls {
		if (c.Action == "restart") != (c.Err != nil) {
			t.Fatalf("call %+v", c)
		}
	}
}
