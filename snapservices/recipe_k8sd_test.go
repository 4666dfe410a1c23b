package snapservices_test

import (
	"context"
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// k8sdRecipe is the service part of k8sd's snap after docs/k8sd.md's
// one-file port: two handles, and each call goes to the one for where it
// runs. Inside k8sd's control.RetryFor (retryFor here), which pauses after
// every failure, a call makes one attempt (WithGiveUp(0)); anywhere else
// (a certificate refresh's restart, a controller outside a loop) a
// foreign change is waited out (retry.NestedPolicy, 25 s).
type k8sdRecipe struct{ services, inLoop snapservices.Control }

// retryForName is retryFor's name in a stack trace, as the recipe takes
// control.RetryFor's.
var retryForName = runtime.FuncForPC(reflect.ValueOf(retryFor).Pointer()).Name()

func (s *k8sdRecipe) servicesFor() snapservices.Control {
	var pcs [64]uintptr
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs[:])])
	for {
		f, more := frames.Next()
		if f.Function == retryForName {
			return s.inLoop
		}
		if !more {
			return s.services
		}
	}
}

func (s *k8sdRecipe) RestartServices(ctx context.Context, names []string, extraSnapArgs ...string) error {
	return s.servicesFor().RestartServices(ctx, names, extraSnapArgs...)
}

func (s *k8sdRecipe) StartServices(ctx context.Context, names []string, extraSnapArgs ...string) error {
	return s.servicesFor().StartServices(ctx, names, extraSnapArgs...)
}

// Issue 44, item 2: with WithGiveUp(0) on k8sd's only handle, the 13 calls
// outside RetryFor got no wait at all (a certificate refresh's restart
// under a 1 s hold: 0 of 3). With the recipe's two handles a call inside
// the loop still fails at once, one request, the loop's pause being the
// wait; a call outside it waits the change out and succeeds once it ends;
// and the two handles of one process never conflict with each other (the
// bootstrap loop's start while a controller's restart runs).
func TestK8sdRecipeWaitsOutsideTheLoopOnly(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnapApps(300*time.Millisecond)))
	snap := &k8sdRecipe{services: newREST(t, srv), inLoop: newREST(t, srv, snapservices.WithGiveUp(0))}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	// A call that waited would end with loopCtx, 5 s later.
	loopCtx, loopCancel := context.WithTimeout(ctx, 5*time.Second)
	defer loopCancel()
	inLoop := retryFor(loopCtx, 1, 0, func() error { return snap.RestartServices(loopCtx, []string{"kubelet"}) })
	var oe *snapsvc.OpError
	if !errors.As(inLoop, &oe) || !oe.Retryable() || !errors.Is(inLoop, snapsvc.ErrGaveUp) || loopCtx.Err() != nil {
		t.Fatalf("inside the loop, held: %v, want a retryable give-up at the first conflict", inLoop)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 {
		t.Errorf("inside the loop: %d POST /v2/apps, want 1", n)
	}

	outside := make(chan error, 1)
	go func() { outside <- snap.RestartServices(ctx, []string{"kubelet"}) }()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Conflicts() >= 2 }); err != nil {
		t.Fatal(err)
	}
	held.Finish()
	if err := <-outside; err != nil {
		t.Fatalf("outside the loop: %v, want the held change waited out", err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active {
		t.Errorf("kubelet %+v, want active", st)
	}

	// A controller's restart outside the loop runs while the bootstrap
	// loop starts kubelet: the process's own change is not a conflict.
	conflicts := srv.Counters().Conflicts
	restart := make(chan error, 1)
	go func() { restart <- snap.RestartServices(ctx, []string{"kubelet"}) }()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return len(v.InProgress()) > 0 }); err != nil {
		t.Fatal(err)
	}
	start := retryFor(ctx, 1, 0, func() error { return snap.StartServices(ctx, []string{"kubelet"}) })
	if err := errors.Join(<-restart, start); err != nil {
		t.Fatalf("the two handles' calls: %v", err)
	}
	if n := srv.Counters().Conflicts - conflicts; n != 0 {
		t.Errorf("%d conflicts between the process's own calls, want 0", n)
	}
	if !strings.HasSuffix(retryForName, ".retryFor") {
		t.Errorf("retryFor's name %q", retryForName)
	}
}
