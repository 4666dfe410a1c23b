package snapsvc_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// TestOperationEvents checks the lifecycle events: started, accepted
// (with the change), then done or failed once, with durations and the
// change id; for an Async operation the end comes from Wait, once.
func TestOperationEvents(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	var mu sync.Mutex
	var kinds []string
	var last snapsvc.Event
	c := newClient(t, srv, snapsvc.WithObserver(func(e snapsvc.Event) {
		mu.Lock()
		defer mu.Unlock()
		kinds = append(kinds, e.Kind.String())
		last = e
	}))
	take := func() ([]string, snapsvc.Event) {
		mu.Lock()
		defer mu.Unlock()
		k, l := kinds, last
		kinds = nil
		return k, l
	}
	ctx := context.Background()
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	k, l := take()
	if want := "started accepted done"; join(k) != want || l.ChangeID != "1" || l.Status != "Done" || l.Elapsed <= 0 || l.Op != "restart" {
		t.Errorf("restart: events %q (want %q), last %+v", join(k), want, l)
	}

	op, err := c.StartAsync(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := op.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if k, l := take(); join(k) != "started accepted done" || l.ChangeID != "2" {
		t.Errorf("async: events %q, last %+v", join(k), l)
	}

	_, err = c.Stop(ctx, []string{"k8s.nosuch"}, snapsvc.StopOptions{})
	k, l = take()
	var oe *snapsvc.OpError
	if join(k) != "started failed" || !errors.As(l.Err, &oe) || !errors.Is(err, snapsvc.ErrNotFound) {
		t.Errorf("failed stop: events %q, last %+v", join(k), l)
	}
}

func join(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out
}

// WithObserver given twice calls both observers, in order (an adapter's
// observer and its user's no longer replace each other).
func TestObserversChain(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	var got []string
	c := newClient(t, srv,
		snapsvc.WithObserver(func(e snapsvc.Event) { got = append(got, "first "+e.Kind.String()) }),
		snapsvc.WithObserver(func(e snapsvc.Event) { got = append(got, "second "+e.Kind.String()) }))
	if _, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(got) < 2 || got[0] != "first started" || got[1] != "second started" {
		t.Fatalf("events %q, want each event to reach both observers, first then second", got)
	}
}
