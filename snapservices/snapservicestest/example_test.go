package snapservicestest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapservices/snapservicestest"
)

// reconcileKubelet is caller code under test: it takes the interface, so
// the test hands it a Recorder and production code a *snapservices.Snap.
func reconcileKubelet(ctx context.Context, snap snapservices.Control) error {
	if err := snap.RestartServices(ctx, []string{"kubelet"}); err != nil {
		return fmt.Errorf("failed to restart kubelet: %w", err)
	}
	return nil
}

// A unit test of a caller records its calls and makes one fail.
func ExampleRecorder() {
	r := snapservicestest.NewRecorder("k8s")
	ctx := context.Background()

	fmt.Println(reconcileKubelet(ctx, r))
	r.FailService("restart", "kubelet", errors.New("snapd said no"))
	fmt.Println(reconcileKubelet(ctx, r))
	for _, c := range r.Calls() {
		fmt.Println(c.Action, c.Names, c.Err)
	}
	// Output:
	// <nil>
	// failed to restart kubelet: snapd said no
	// restart [k8s.kubelet] <nil>
	// restart [k8s.kubelet] snapd said no
}
