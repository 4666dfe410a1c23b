package etcdbudget_test

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
)

// A slot whose holder vanished (kill -9: its lease expires, nobody
// released it) after it recorded an act (its fence) stays unusable for
// the lock-delay after the expiry; a holder that never acted, or recorded
// its services ready after its last act, needs none; an orderly release
// hands over at once; a probe that proves the vanished holder restarted
// after its act ends the delay early (issue 19, defect 5; issue 26,
// defect 1).
func TestLockDelay(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, 2*time.Minute)
	cli := client(t, p.Endpoints()...)
	const ttl = 3 * time.Second

	// steps are the holder's commands before it vanishes ("release":
	// it releases instead).
	takeover := func(t *testing.T, lockDelay time.Duration, ready func(context.Context, etcdbudget.VanishedHolder) bool, steps ...string) (time.Duration, etcdbudget.Stats, []budget.Wait) {
		key := uniqueKey(t)
		h := startHolder(t, holderConfig{Endpoints: p.Endpoints(), Key: key, Name: "vanishing", TTL: ttl, LockDelay: lockDelay})
		h.next(t, ctx, "acquired")
		b := newBudget(t, cli, "next", 1, func(c *etcdbudget.Config) { c.LockDelay = lockDelay; c.HolderReady = ready })
		out := make(chan acquired, 1)
		waits := make(chan budget.Wait, 10)
		acquireAsync(ctx, b, "next", key, out, waits)
		seen := []budget.Wait{<-waits}
		var at time.Time
		release := false
		for _, step := range steps {
			h.send(t, step)
			ev := h.next(t, ctx, map[string]string{"fence": "fence", "ready": "ready", "release": "released"}[step])
			if ev.Err != "" {
				t.Fatalf("holder's %s: %s", step, ev.Err)
			}
			at, release = ev.T, step == "release"
		}
		if !release {
			at = time.Now()
			h.cmd.Process.Kill()
		}
		var r acquired
		for r.name == "" {
			select {
			case w := <-waits:
				seen = append(seen, w)
			case r = <-out:
			}
		}
		if r.err != nil {
			t.Fatal(r.err)
		}
		d := time.Since(at)
		r.slot.Release(ctx)
		return d, b.Stats(), seen
	}
	// The lease expires 2/3 TTL to TTL after the kill (keep-alives every
	// TTL/3), the guard LockDelay later; etcd checks expiry every 500ms.
	// 5s of margin for a loaded machine (issue 36: 2 busy processes per
	// core beside the tests), well below the 30s lock-delay a wrong
	// verdict would cost.
	const margin = 5 * time.Second

	t.Run("killed after acting", func(t *testing.T) {
		const delay = 2 * time.Second
		d, st, waits := takeover(t, delay, nil, "fence")
		t.Logf("holder killed after its fence: next holder after %s (TTL %s, lock-delay %s)", d.Round(time.Millisecond), ttl, delay)
		if d < ttl*2/3+delay || d > ttl+delay+margin {
			t.Errorf("next holder after %s, want within [%s, %s]", d, ttl*2/3+delay, ttl+delay+margin)
		}
		if st.DelayedTakeovers != 1 {
			t.Errorf("stats %+v: want one delayed takeover", st)
		}
		last := waits[len(waits)-1]
		if len(last.Holders) != 1 || !strings.Contains(last.Holders[0], "vanishing (vanished; lock-delay)") {
			t.Errorf("the wait did not say it is held by a vanished holder's lock-delay: %+v", waits)
		}
	})

	t.Run("killed before acting", func(t *testing.T) {
		var asked atomic.Int32
		probe := func(context.Context, etcdbudget.VanishedHolder) bool { asked.Add(1); return false }
		d, st, _ := takeover(t, 30*time.Second, probe)
		t.Logf("holder killed before any fence: next holder after %s", d.Round(time.Millisecond))
		if d > ttl+margin || st.DelayedTakeovers != 0 || asked.Load() != 0 {
			t.Errorf("next holder after %s (stats %+v, probe asked %d times), want at the lease expiry, unprobed: it never acted", d, st, asked.Load())
		}
	})

	t.Run("killed after ready", func(t *testing.T) {
		var asked atomic.Int32
		probe := func(context.Context, etcdbudget.VanishedHolder) bool { asked.Add(1); return false }
		d, st, _ := takeover(t, 30*time.Second, probe, "fence", "ready")
		t.Logf("holder killed after recording ready: next holder after %s", d.Round(time.Millisecond))
		if d > ttl+margin || st.DelayedTakeovers != 0 || asked.Load() != 0 {
			t.Errorf("next holder after %s (stats %+v, probe asked %d times), want at the lease expiry, unprobed: it was ready after its act", d, st, asked.Load())
		}
	})

	t.Run("released", func(t *testing.T) {
		d, st, _ := takeover(t, 30*time.Second, nil, "fence", "release")
		t.Logf("holder released: next holder after %s", d.Round(time.Millisecond))
		// At once; a slot not handed over would wait out the 30s
		// lock-delay (the holder lives on, its lease kept alive): 10s
		// tells the two apart on a loaded machine.
		if d > 10*time.Second || st.DelayedTakeovers != 0 {
			t.Errorf("an orderly release handed over after %s (stats %+v), want at once", d, st)
		}
	})

	t.Run("proven ready", func(t *testing.T) {
		var asked atomic.Int32
		var got atomic.Value
		ready := func(_ context.Context, h etcdbudget.VanishedHolder) bool {
			asked.Add(1)
			got.Store(h)
			return h.Holder == "vanishing" && h.Acts == 1 && !h.Acted.IsZero()
		}
		d, _, _ := takeover(t, 30*time.Second, ready, "fence")
		t.Logf("holder killed after its fence, proven ready by the probe: next holder after %s", d.Round(time.Millisecond))
		if d > ttl+margin || asked.Load() == 0 {
			t.Errorf("next holder after %s (probe asked %d times, last with %+v), want at the lease expiry, not the 30s lock-delay", d, asked.Load(), got.Load())
		}
	})
}

// A holder paused (SIGSTOP) past its lease while another machine took the
// slot: when it runs again, Fence says the slot is lost, so it does not
// act (issue 19, defect 3).
func TestFencePausedHolder(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	const ttl = 3 * time.Second
	h := startHolder(t, holderConfig{Endpoints: p.Endpoints(), Key: key, Name: "paused", TTL: ttl, LockDelay: -1})
	h.next(t, ctx, "acquired")
	h.send(t, "fence")
	if ev := h.next(t, ctx, "fence"); ev.Err != "" {
		t.Fatalf("fence of a held slot: %s", ev.Err)
	}
	if err := etcdtest.Pause(h.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	b := newBudget(t, cli, "successor", 1, func(c *etcdbudget.Config) { c.LockDelay = -1 })
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	if _, err := s.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatalf("successor's fence: %v", err)
	}
	h.send(t, "fence") // read as soon as it runs again
	if err := etcdtest.Resume(h.cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	ev := h.next(t, ctx, "fence")
	t.Logf("paused holder's fence after resuming (Lost already closed: %v): %s", ev.LostBefore, ev.Err)
	if !ev.Lost {
		t.Fatalf("the paused holder's fence says %q while the successor holds the slot", ev.Err)
	}
}

// Status tells a holder from a waiter that would hold the slot but for a
// vanished holder's lock-delay (issue 26, defect 7: the blocked waiter
// was listed as a holder).
func TestStatusBlockedByLockDelay(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	const ttl = 3 * time.Second
	h := startHolder(t, holderConfig{Endpoints: p.Endpoints(), Key: key, Name: "node-a", TTL: ttl, LockDelay: 30 * time.Second})
	h.next(t, ctx, "acquired")
	h.send(t, "fence")
	if ev := h.next(t, ctx, "fence"); ev.Err != "" {
		t.Fatal(ev.Err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make(chan acquired, 1)
	acquireAsync(wctx, newBudget(t, cli, "node-b", 1, func(c *etcdbudget.Config) { c.LockDelay = 30 * time.Second }), "node-b", key, out, nil)
	h.cmd.Process.Kill()
	b := newBudget(t, cli, "reader", 1)
	var st *etcdbudget.KeyStatus
	for {
		var err error
		if st, err = b.Status(ctx, key); err != nil {
			t.Fatal(err)
		}
		if len(st.Vanished) > 0 {
			break
		}
		select {
		case <-time.After(100 * time.Millisecond): // polling etcd's state until the lease expired
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	t.Logf("holders %q, waiters %q (blocked by %q), vanished %q", holdersOf(st.Holders), holdersOf(st.Waiters), st.Waiters[0].BlockedBy, holdersOf(st.Vanished))
	if len(st.Holders) != 0 || !slices.Equal(holdersOf(st.Waiters), []string{"node-b"}) || !slices.Equal(st.Waiters[0].BlockedBy, []string{"node-a"}) ||
		!slices.Equal(holdersOf(st.Vanished), []string{"node-a"}) || st.Vanished[0].Acts != 1 || !st.Vanished[0].ReadyAt.IsZero() {
		t.Fatalf("status %+v: want no holder, node-b waiting blocked by node-a's lock-delay, node-a vanished after one act", st)
	}
	cancel()
	<-out
}
