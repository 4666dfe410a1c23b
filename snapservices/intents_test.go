package snapservices_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// A daemon shut down while its restart waited out a foreign change: the
// Snap it builds when it starts again carries the restart out, once.
func TestWithIntentsReplaysWhatAShutDownLeft(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
	}}))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	conflicted := make(chan struct{})
	var once sync.Once
	first := newREST(t, srv, snapservices.WithInstance("k8s"), snapservices.WithIntents(),
		snapservices.WithClientOptions(snapsvc.WithObserver(func(ev snapsvc.Event) {
			if ev.Kind == snapsvc.EventConflict {
				once.Do(func() { close(conflicted) })
			}
		})))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- first.RestartServices(ctx, []string{"kubelet"}) }()
	<-conflicted
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the shut-down restart ended with %v", err)
	}
	first.Close()
	foreign.Finish()

	again := newREST(t, srv, snapservices.WithInstance("k8s"), snapservices.WithIntents())
	rs, err := again.Replayed(context.Background())
	if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayActed {
		t.Fatalf("replayed %+v, %v; want the restart acted", rs, err)
	}
	n := 0
	for _, c := range srv.Changes() {
		if c.Kind == "service-control" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d service changes, want 1", n)
	}
}
