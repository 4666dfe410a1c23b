package fake_test

import (
	"context"
	"fmt"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// bootstrap is the code under test: a hook that starts its snap's
// services through snapsvc.
func bootstrap(ctx context.Context, c *snapsvc.Client) error {
	_, err := c.Start(ctx, []string{"k8s.containerd", "k8s.kubelet"}, snapsvc.StartOptions{Enable: true})
	return err
}

// Testing your own hook logic against the fake: start it, point a client
// at it, run the code, assert on what snapd (the fake) saw. In a test,
// fake.NewServer(t, ...) replaces fake.New and closes itself.
func Example_testYourHook() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	s, _ := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "containerd", Daemon: "notify"}, {Name: "kubelet", Daemon: "simple", After: []string{"containerd"}},
	}}))
	defer s.Close()
	c, _ := snapsvc.New(snapsvc.WithSocket(s.SocketPath()))
	busy := s.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"}) // a "snap set" is running
	go func() {
		s.WaitFor(context.Background(), func(v fake.View) bool { return v.Requests() > 0 })
		busy.Finish()
	}()

	err := bootstrap(context.Background(), c)
	st, _ := s.Service("k8s", "kubelet")
	fmt.Println("err:", err, "kubelet:", st, "snap set ready:", busy.Info().Ready)
	// Output:
	// err: <nil> kubelet: {true true} snap set ready: true
}
