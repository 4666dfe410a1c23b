package snapsvc_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Refresh a snap to the latest revision of its channel; a second refresh
// finds nothing newer, an outcome rather than an error.
func ExampleClient_Refresh() {
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Version: "1.30", Revision: "10",
		Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true}}}),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11", Version: "1.31"}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for range 2 {
		res, err := c.Refresh(ctx, "k8s", snapsvc.RefreshOptions{})
		switch {
		case err != nil:
			log.Fatal(err)
		case res.NoUpdate:
			fmt.Printf("snap %q has no updates available\n", res.Snap)
		default:
			fmt.Println(res.Snap, res.Before.Version, "->", res.After.Version, res.Status)
		}
	}
	// Output:
	// k8s 1.30 -> 1.31 Done
	// snap "k8s" has no updates available
}

// A fleet refreshes one machine at a time: each machine's Client takes the
// budget's slot for the snap's services, refreshes, and gives the slot
// back only once its services are ready again (here: snapd reports them
// active). A refresh that leaves them not ready records a failed act,
// which halts the key for every machine.
func ExampleClient_Refresh_budget() {
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Version: "1.30", Revision: "10",
		Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true}}}),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11", Version: "1.31"}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	budget := newQueueBudget(1) // in production: etcdbudget or sqlbudget, shared by the fleet
	var c *snapsvc.Client
	active := probe.Func("k8s active", func(ctx context.Context) error {
		svcs, err := c.Services(ctx, "k8s")
		if err != nil {
			return err
		}
		for _, s := range svcs {
			if !s.Active {
				return fmt.Errorf("%s inactive", s.FullName())
			}
		}
		return nil
	})
	c, err = snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(budget.machine("node-1"), snapsvc.BudgetOptions{
			Ready: func(string) probe.Probe { return active },
			Probe: probe.Options{Interval: 10 * time.Millisecond, MaxWait: time.Minute},
		}))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	res, err := c.Refresh(context.Background(), "k8s", snapsvc.RefreshOptions{Channel: "latest/stable"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("refreshed to", res.After.Version)
	for _, a := range budget.history() {
		fmt.Println(a.Key, a.Action, a.Outcome)
	}
	// Output:
	// refreshed to 1.31
	// k8s.kubelet refresh ready
}

// Hold a snap's auto-refreshes (snapd 2.58 or later), then lift the hold.
func ExampleClient_HoldRefresh() {
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Revision: "10"}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	h, err := c.HoldRefresh(ctx, "k8s", snapsvc.HoldOptions{Level: snapsvc.HoldAutoRefresh})
	if err != nil {
		log.Fatal(err) // errors.Is(err, snapsvc.ErrHoldUnsupported) on snapd 2.57
	}
	fmt.Println("held:", h.Held(), "forever:", h.Forever)
	h, err = c.UnholdRefresh(ctx, "k8s")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held:", h.Held())
	// Output:
	// held: true forever: true
	// held: false
}

// A snap's gate-auto-refresh hook (with `snap set system
// experimental.gate-auto-refresh-hook=true`) lets snapd's auto-refresh go
// ahead only when the fleet's budget has room, and holds it otherwise.
// Inside the hook, snapsvc.New needs only the budget: snapctl mode, the
// hook's cookie and the snap's name come from its environment.
func ExampleClient_GateAutoRefresh() {
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Revision: "10",
		Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true}}}),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11"}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	hook := srv.StartHook("k8s", "gate-auto-refresh") // what snapd does before an auto-refresh
	budget := newQueueBudget(1)

	c, err := snapsvc.New(snapsvc.WithSnapSocket(srv.SnapSocketPath()), snapsvc.WithCookie(hook.Cookie()),
		snapsvc.WithSnap("k8s"), snapsvc.WithHook("gate-auto-refresh"),
		snapsvc.WithRestartBudget(budget.machine("node-1"), snapsvc.BudgetOptions{}))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	res, err := c.GateAutoRefresh(context.Background(), snapsvc.GateOptions{MaxWait: 30 * time.Second})
	if err != nil {
		log.Fatal(err) // the hook fails: snapd holds the refresh
	}
	fmt.Println("answered snapd:", res.Decision, "under", res.Keys)
	// Output:
	// answered snapd: proceed under [k8s.kubelet]
}
