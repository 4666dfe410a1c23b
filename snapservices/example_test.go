package snapservices_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapservices/snapservicestest"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Bad input fails before any request, saying what is wrong.
func ExampleSnap_StopServices() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
	}}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	snap, err := snapservices.New(snapservices.WithInstance("k8s"),
		snapservices.WithClientOptions(snapsvc.WithSocket(srv.SocketPath())))
	if err != nil {
		log.Fatal(err)
	}
	defer snap.Close()
	ctx := context.Background()

	err = snap.StopServices(ctx, []string{"kubelet"}, "--force")
	fmt.Println(errors.Is(err, snapservices.ErrUnknownFlag), err)
	err = snap.StopServices(ctx, []string{"etcd.etcd"})
	fmt.Println(errors.Is(err, snapsvc.ErrWrongSnap), err)
	fmt.Println("requests sent:", len(srv.Requests()))

	// The remove hook's stop (and disable, as k8sd's StopServices always
	// does): --no-wait returns once snapd accepted it.
	if err := snap.StopServices(ctx, []string{"kubelet"}, "--no-wait"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("requests sent:", len(srv.Requests()))
	// Output:
	// true snapsvc: stop k8s.kubelet: unknown flag --force: snap stop accepts --disable, --no-wait [not retryable]
	// true snapsvc: stop etcd.etcd: service of another snap: "etcd.etcd" names a service of snap "etcd"; this handle controls snap "k8s" only (give "<app>" or "k8s.<app>") [not retryable]
	// requests sent: 0
	// requests sent: 1
}

// Code written around snapctl (microceph's snapStart, snapRestart and
// snapCheckActive) keeps its calls; in a unit test the handle hands the
// test's runner the snapctl lines the code ran before, and reads the state
// from the runner's answer. In the strict snap the same calls go through
// snapctl on snapd's snap socket, waiting out changes that hold the snap.
func ExampleSnapctlStyle() {
	r := snapservicestest.NewRecorder("microceph", snapservicestest.Snapctl(), snapservicestest.PlainFlags())
	r.SetService("rgw", true, true)
	svc := snapservices.Open(snapservices.SnapctlStyle(), snapservices.WithSnapDir(""), snapservices.WithCommandOutput(r.Output))
	ctx := context.Background()

	fmt.Println(svc.Mode(), svc.StartServices(ctx, []string{"microceph.nfs"}, "--enable"))
	fmt.Println(svc.RestartServices(ctx, []string{"microceph.rgw"}, "--reload"))
	states, err := svc.Services(ctx, []string{"microceph.rgw"})
	fmt.Println(states[0].FullName(), states[0].Active, err)
	for _, line := range r.Commands() {
		fmt.Println(line)
	}
	// Output:
	// snapctl <nil>
	// <nil>
	// microceph.rgw true <nil>
	// snapctl start microceph.nfs --enable
	// snapctl restart --reload microceph.rgw
	// snapctl services microceph.rgw
}
