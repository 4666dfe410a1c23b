package snapsvc_test

// Tests of the reads (reads.go): bounded, riding out a snapd restart.

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// TestReadsRideOutSnapdRestart checks that each read (Services, Changes,
// Change) waits for a snapd whose socket is gone, within MaxUnreachable,
// as actions do: it reports EventUnreachable (Op "read"), then succeeds
// once the socket is back, with EventReachable.
func TestReadsRideOutSnapdRestart(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "web", Apps: []fake.App{{Name: "server", Daemon: "simple"}}}))
	chg := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "web", WithSnapNames: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // safety net
	defer cancel()
	reads := map[string]func(c *snapsvc.Client) error{
		"Services": func(c *snapsvc.Client) error { _, err := c.Services(ctx, "web"); return err },
		"Changes":  func(c *snapsvc.Client) error { _, err := c.Changes(ctx, snapsvc.ChangesOptions{}); return err },
		"Change":   func(c *snapsvc.Client) error { _, err := c.Change(ctx, chg.ID()); return err },
	}
	for name, read := range reads {
		t.Run(name, func(t *testing.T) {
			events := make(chan snapsvc.Event, 16)
			c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithoutFileLock(),
				snapsvc.WithObserver(func(ev snapsvc.Event) { events <- ev }))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			srv.StopListening()
			done := make(chan error, 1)
			go func() { done <- read(c) }()
			select {
			case ev := <-events:
				if ev.Kind != snapsvc.EventUnreachable || ev.Op != "read" {
					t.Fatalf("first event %v %q, want unreachable, read", ev.Kind, ev.Op)
				}
			case err := <-done:
				t.Fatalf("%s returned while snapd was away: %v", name, err)
			}
			if err := srv.StartListening(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("%s once snapd was back: %v", name, err)
			}
			if ev := <-events; ev.Kind != snapsvc.EventReachable {
				t.Errorf("no reachable event: %v", ev.Kind)
			}
		})
	}
}

// TestReadsGiveUpAfterMaxUnreachable checks the bound: a read gives up
// once snapd has been unreachable for MaxUnreachable, with ErrGaveUp and
// the connection error (retry.Transient), and an unknown change is not
// retried at all.
func TestReadsGiveUpAfterMaxUnreachable(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithoutListening())
	p := retry.DefaultPolicy()
	p.MaxUnreachable = time.Nanosecond
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithoutFileLock(), snapsvc.WithPolicy(p))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Services(context.Background())
	var ce *snapsvc.ConnectionError
	if !errors.Is(err, snapsvc.ErrGaveUp) || !errors.As(err, &ce) {
		t.Fatalf("Services against an absent snapd: %v", err)
	}
	if err := srv.StartListening(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Change(context.Background(), "999"); !errors.Is(err, snapsvc.ErrNotFound) || errors.Is(err, snapsvc.ErrGaveUp) {
		t.Fatalf("unknown change: %v", err)
	}
}

// Defect 4: reads ignored the policy's MaxElapsedTime on a wedged snapd:
// 300 ms asked, never returned without a context deadline.
func TestReadsBoundedByPolicyTime(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	reads := map[string]func(c *snapsvc.Client, id string) error{
		"Services": func(c *snapsvc.Client, _ string) error { _, err := c.Services(context.Background(), "k8s"); return err },
		"Changes": func(c *snapsvc.Client, _ string) error {
			_, err := c.Changes(context.Background(), snapsvc.ChangesOptions{})
			return err
		},
		"Change": func(c *snapsvc.Client, id string) error { _, err := c.Change(context.Background(), id); return err },
		"AbortChange": func(c *snapsvc.Client, id string) error {
			_, err := c.AbortChange(context.Background(), id)
			return err
		},
	}
	for name, read := range reads {
		t.Run(name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			chg := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
			p := retry.DefaultPolicy()
			p.MaxElapsedTime = 300 * time.Millisecond
			c := newClient(t, srv, snapsvc.WithPolicy(p))
			wedge(t, srv, fake.Fault{})
			lat := testclock.StartLateness()
			start := time.Now()
			err := read(c, chg.ID())
			checkBound(t, name, start, p.MaxElapsedTime, lat)
			if !errors.Is(err, snapsvc.ErrGaveUp) {
				t.Errorf("%s: %v, want ErrGaveUp (the policy's time)", name, err)
			}
			// snapd read the abort: it may carry it out once it gets its
			// lock, so the outcome is unknown; a read's never is.
			if want := name == "AbortChange"; errors.Is(err, snapsvc.ErrOutcomeUnknown) != want {
				t.Errorf("%s: %v, matches ErrOutcomeUnknown: %v, want %v", name, err, !want, want)
			}
		})
	}
}

// A read whose answer was lost is asked again, whatever its method (a
// snapctl listing is a POST): asking twice changes nothing. An abort whose
// answer was lost is not sent again: snapd carried it out.
func TestLostAnswersOfReadsAreAskedAgain(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	c := newSnapctlClient(t, srv, srv.Cookie("k8s"))
	srv.InjectFault(fake.Fault{Kind: fake.FaultDrop, Method: "POST", Path: "/v2/snapctl", Times: 1})
	svcs, err := c.Services(ctxT(t), "k8s.kubelet")
	if err != nil || len(svcs) != 1 || !svcs[0].Active {
		t.Fatalf("snapctl services with its first answer lost: %+v %v", svcs, err)
	}
	if n := countRequests(srv, "POST", "/v2/snapctl"); n != 2 {
		t.Errorf("%d snapctl requests, want 2 (the lost one asked again)", n)
	}

	chg := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	rc := newClient(t, srv)
	srv.InjectFault(fake.Fault{Kind: fake.FaultDrop, Method: "POST", Path: "/v2/changes/", Times: 1})
	_, err = rc.AbortChange(ctxT(t), chg.ID())
	if !errors.Is(err, snapsvc.ErrOutcomeUnknown) {
		t.Errorf("abort with its answer lost: %v, want ErrOutcomeUnknown", err)
	}
	if n := countRequests(srv, "POST", "/v2/changes/"+chg.ID()); n != 1 {
		t.Errorf("%d abort requests, want 1 (never sent twice)", n)
	}
}
