package snapservices_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Bad input fails before any request, saying what is wrong.
func ExampleSnap_StopServices() {
	srv, err := fake.New(fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
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
