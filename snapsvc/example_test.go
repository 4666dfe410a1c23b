package snapsvc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// A bootstrap hook starts the control plane and enables it at boot. On a
// real system snapsvc.New() needs no options: it finds snapd's socket, and
// inside a snap its cookie.
func Example_hook() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "containerd", Daemon: "notify"},
		{Name: "kube-apiserver", Daemon: "simple"},
		{Name: "kubelet", Daemon: "simple", After: []string{"containerd"}},
	}}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Start(ctx, []string{"k8s.containerd", "k8s.kube-apiserver", "k8s.kubelet"}, snapsvc.StartOptions{Enable: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("status:", res.Status, "attempts:", res.Attempts)
	svcs, _ := c.Services(ctx, "k8s")
	for _, s := range svcs {
		fmt.Println(s.FullName(), "enabled:", s.Enabled, "active:", s.Active)
	}
	// Output:
	// status: Done attempts: 1
	// k8s.containerd enabled: true active: true
	// k8s.kube-apiserver enabled: true active: true
	// k8s.kubelet enabled: true active: true
}

// A controller restarts kubelet after changing its configuration. If
// someone else holds the snap (here a "snap set" whose configure hook is
// running), Restart waits for that change and retries as soon as it is
// done.
func Example_controller() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
	}}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	snapSet := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	go func() {
		// The configure hook finishes once the controller has met it.
		for srv.Counters().Conflicts == 0 {
			time.Sleep(time.Millisecond)
		}
		snapSet.Finish()
	}()

	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()))
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Restart(context.Background(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	switch {
	case errors.As(err, &opErr) && opErr.Retryable():
		log.Printf("snapd still busy, will reconcile again later: %v", err)
		return
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println("status:", res.Status)
	fmt.Println("conflicts absorbed:", res.Conflicts)
	// Output:
	// status: Done
	// conflicts absorbed: 1
}

// Errors say what failed and whether retrying could help.
func ExampleOpError() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	c, _ := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()))
	_, err = c.Restart(context.Background(), []string{"k8s.kubelt"}, snapsvc.RestartOptions{})
	var opErr *snapsvc.OpError
	fmt.Println(errors.As(err, &opErr), opErr.Retryable(), errors.Is(err, snapsvc.ErrNotFound))
	fmt.Println(err)
	// Output:
	// true false true
	// snapsvc: restart k8s.kubelt: snapd: snap "k8s" has no service "kubelt" (POST /v2/apps: HTTP 404, kind app-not-found) [not retryable]
}
