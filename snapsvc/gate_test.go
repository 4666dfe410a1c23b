package snapsvc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// gateClient is the Client a gate-auto-refresh hook of svcdemo builds:
// snapctl with the hook's cookie, under b as machine holder.
func gateClient(t *testing.T, srv *fake.Server, h *fake.Hook, b snapsvc.RestartBudget) *snapsvc.Client {
	t.Helper()
	opts := []snapsvc.Option{snapsvc.WithSnapSocket(srv.SnapSocketPath()),
		snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithCookie(h.Cookie()), snapsvc.WithSnap("svcdemo"), snapsvc.WithHook("gate-auto-refresh")}
	if b != nil {
		opts = append(opts, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	}
	c, err := snapsvc.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestGateProceedsWithASlot(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	hook := srv.StartHook("svcdemo", "gate-auto-refresh")
	b := newQueueBudget(1)
	c := gateClient(t, srv, hook, b.machine("node-1"))
	res, err := c.GateAutoRefresh(context.Background(), snapsvc.GateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != snapsvc.GateProceed || hook.RefreshAction() != "proceed" || len(res.Keys) != 2 || res.Why != nil {
		t.Fatalf("result %+v, hook answered %q", res, hook.RefreshAction())
	}
	// The refresh runs after the hook: the slots were let go of as a
	// crashed holder's (here freed at once), after the act was recorded.
	acts := b.history()
	if len(acts) != 2 || acts[0].Outcome != budget.OutcomeAbandoned || acts[0].Action != "refresh" || acts[0].Holder != "node-1" {
		t.Fatalf("acts %+v", acts)
	}
	if b.holding("svcdemo.alpha")+b.holding("svcdemo.beta") != 0 || len(b.abandoned) != 2 {
		t.Fatalf("slots held %d+%d, abandoned %v", b.holding("svcdemo.alpha"), b.holding("svcdemo.beta"), b.abandoned)
	}
}

func TestGateHoldsWhileTheBudgetIsTaken(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	hook := srv.StartHook("svcdemo", "gate-auto-refresh")
	b := newQueueBudget(1)
	other, err := b.machine("node-2").Acquire(context.Background(), "svcdemo.alpha", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release(context.Background())
	c := gateClient(t, srv, hook, b.machine("node-1"))
	res, err := c.GateAutoRefresh(context.Background(), snapsvc.GateOptions{MaxWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != snapsvc.GateHold || hook.RefreshAction() != "hold" || !errors.Is(res.Why, snapsvc.ErrBudgetWait) || res.HeldFor < 24*time.Hour {
		t.Fatalf("result %+v, hook answered %q", res, hook.RefreshAction())
	}
	if len(b.history()) != 0 || b.holding("svcdemo.alpha") != 1 || b.holding("svcdemo.beta") != 0 {
		t.Fatalf("acts %+v; held alpha %d beta %d (only node-2's)", b.history(), b.holding("svcdemo.alpha"), b.holding("svcdemo.beta"))
	}
}

func TestGateHoldsWhileHalted(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	hook := srv.StartHook("svcdemo", "gate-auto-refresh")
	b := newQueueBudget(1)
	slot, err := b.machine("node-2").Acquire(context.Background(), "svcdemo.beta", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := slot.(snapsvc.BudgetRecorder).Record(context.Background(), budget.Act{Key: "svcdemo.beta", Holder: "node-2", Action: "refresh", Outcome: budget.OutcomeFailed}); err != nil {
		t.Fatal(err)
	}
	slot.Release(context.Background())
	c := gateClient(t, srv, hook, b.machine("node-1"))
	res, err := c.GateAutoRefresh(context.Background(), snapsvc.GateOptions{MaxWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != snapsvc.GateHold || hook.RefreshAction() != "hold" || !errors.Is(res.Why, snapsvc.ErrBudgetHalted) {
		t.Fatalf("result %+v, hook answered %q", res, hook.RefreshAction())
	}
}

func TestGateWithoutBudgetProceeds(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	hook := srv.StartHook("svcdemo", "gate-auto-refresh")
	res, err := gateClient(t, srv, hook, nil).GateAutoRefresh(context.Background(), snapsvc.GateOptions{})
	if err != nil || res.Decision != snapsvc.GateProceed || hook.RefreshAction() != "proceed" {
		t.Fatalf("result %+v %v, hook answered %q", res, err, hook.RefreshAction())
	}
}

func TestGateOutsideTheHookIsRefused(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	configure := srv.StartHook("svcdemo", "configure")
	c, err := snapsvc.New(snapsvc.WithSnapSocket(srv.SnapSocketPath()),
		snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithCookie(configure.Cookie()), snapsvc.WithSnap("svcdemo"), snapsvc.WithHook("configure"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.GateAutoRefresh(context.Background(), snapsvc.GateOptions{}); !errors.Is(err, snapsvc.ErrNotGateHook) {
		t.Fatalf("configure hook: %v", err)
	}
	rest := newClient(t, srv)
	if _, err := rest.GateAutoRefresh(context.Background(), snapsvc.GateOptions{}); !errors.Is(err, snapsvc.ErrNotGateHook) {
		t.Fatalf("REST mode: %v", err)
	}
	if n := srv.Counters().Requests["POST /v2/snapctl"]; n != 0 {
		t.Fatalf("%d snapctl requests", n)
	}
}
