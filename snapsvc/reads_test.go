package snapsvc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// TestReadsRideOutSnapdRestart checks that each read (Services, Changes,
// Change) waits for a snapd whose socket is gone, within MaxUnreachable,
// as actions do: it reports EventUnreachable (Op "read"), then succeeds
// once the socket is back, with EventReachable.
func TestReadsRideOutSnapdRestart(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := fake.NewServer(t, fake.WithSnaps(fake.Snap{Name: "web", Apps: []fake.App{{Name: "server", Daemon: "simple"}}}))
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
	srv := fake.NewServer(t, fake.WithoutListening())
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
