package snapservices_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapservices"
)

// k8sdSnap is the service part of k8sd's snap.Snap after the port. Before,
// each method built a command line ("snap start k8s.containerd
// k8s.kubelet ... --enable") and ran it; after, it hands the same names
// and flags to a snapservices.Snap built once (snapservices.Open on a real
// system: the instance comes from $SNAP_INSTANCE_NAME, REST on
// /run/snapd.socket). The Snap keeps k8sd's contract: bare or "k8s."
// names, "k8s" for the whole snap, start enabling and stop disabling.
type k8sdSnap struct{ services snapservices.Control }

func (s *k8sdSnap) StartServices(ctx context.Context, names []string, extraSnapArgs ...string) error {
	return s.services.StartServices(ctx, names, extraSnapArgs...)
}

func (s *k8sdSnap) StopServices(ctx context.Context, names []string, extraSnapArgs ...string) error {
	return s.services.StopServices(ctx, names, extraSnapArgs...)
}

func (s *k8sdSnap) RestartServices(ctx context.Context, names []string, extraSnapArgs ...string) error {
	return s.services.RestartServices(ctx, names, extraSnapArgs...)
}

// controlPlaneServices are the services k8sd's bootstrap starts, in its
// order.
var controlPlaneServices = []string{"containerd", "kube-controller-manager", "kube-proxy", "kube-scheduler", "kubelet", "kube-apiserver"}

// bootstrapControlPlane is the service step of k8sd's bootstrap hook. The
// one line that changes: control.RetryFor(ctx, 5, 5*time.Second, ...)
// becomes retry.Do with the same arguments, which stops at once when
// retrying cannot help and keeps the cause when ctx ends. attempts counts
// the runs of the loop's body.
func bootstrapControlPlane(ctx context.Context, snap *k8sdSnap, attempts *atomic.Int32) error {
	if err := retry.Do(ctx, 5, 5*time.Second, func() error {
		attempts.Add(1)
		if err := snap.StartServices(ctx, controlPlaneServices); err != nil {
			return fmt.Errorf("failed to start services: %w", err)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("failed after retry: %w", err)
	}
	return nil
}

// restartKubelet is the node-configuration controller's step after it
// rewrote kubelet's arguments; the same one-line change.
func restartKubelet(ctx context.Context, snap *k8sdSnap, attempts *atomic.Int32) error {
	if err := retry.Do(ctx, 5, 5*time.Second, func() error {
		attempts.Add(1)
		if err := snap.RestartServices(ctx, []string{"kubelet"}); err != nil {
			return fmt.Errorf("failed to restart kubelet to apply node configuration: %w", err)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("failed after retry: %w", err)
	}
	return nil
}

// k8sFake is a fake snapd with a freshly installed k8s snap: every service
// disabled and inactive except k8sd, the daemon running this code.
func k8sFake() (*fake.Server, error) {
	apps := []fake.App{{Name: "k8s"}, {Name: "k8sd", Daemon: "simple", Enabled: true, Active: true}}
	for _, name := range controlPlaneServices {
		app := fake.App{Name: name, Daemon: "simple"}
		if name == "kubelet" || name == "kube-apiserver" {
			app.After = []string{"containerd"}
		}
		apps = append(apps, app)
	}
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services (k8sd runs as root).
	return fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: apps}))
}

// k8sd's bootstrap hook starts the control plane while its
// node-configuration controller restarts kubelet, and an administrator's
// "snap set k8s ..." holds the snap with its configure hook. Before the
// port, one of the two calls failed with `snap "k8s" has "service-control"
// change in progress` and slept 5 s in RetryFor. After it, neither sees a
// conflict: their calls are serialised, the configure change is waited
// out, and each loop runs its body once.
func Example_k8sdPort() {
	srv, err := k8sFake()
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	services, err := snapservices.New(snapservices.WithInstance("k8s"),
		snapservices.WithSocket(srv.SocketPath()))
	if err != nil {
		log.Fatal(err)
	}
	defer services.Close()
	snap := &k8sdSnap{services: services}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	snapSet := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	var bootAttempts, ctlAttempts atomic.Int32
	errs := make(chan error, 2)
	go func() { errs <- bootstrapControlPlane(ctx, snap, &bootAttempts) }()
	go func() { errs <- restartKubelet(ctx, snap, &ctlAttempts) }()

	// The configure hook ends once the first call has met it.
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Requests() > 0 }); err != nil {
		log.Fatal(err)
	}
	snapSet.Finish()
	err = errors.Join(<-errs, <-errs)

	fmt.Println("errors:", err)
	fmt.Println("loop runs: bootstrap", bootAttempts.Load(), "controller", ctlAttempts.Load())
	for _, name := range controlPlaneServices {
		st, _ := srv.Service("k8s", name)
		fmt.Printf("k8s.%s enabled=%t active=%t\n", name, st.Enabled, st.Active)
	}
	// Output:
	// errors: <nil>
	// loop runs: bootstrap 1 controller 1
	// k8s.containerd enabled=true active=true
	// k8s.kube-controller-manager enabled=true active=true
	// k8s.kube-proxy enabled=true active=true
	// k8s.kube-scheduler enabled=true active=true
	// k8s.kubelet enabled=true active=true
	// k8s.kube-apiserver enabled=true active=true
}
