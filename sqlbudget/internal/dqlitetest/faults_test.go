//go:build libsqlite3

package dqlitetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/testsupport/rollouttest"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func uniqueKey(t *testing.T) string {
	return strings.ReplaceAll(t.Name(), "/", "-") + fmt.Sprintf("-%d", time.Now().UnixNano())
}

func startHolder(t *testing.T, cfg holderConfig) *machine {
	t.Helper()
	raw, _ := json.Marshal(cfg)
	return startProcess(t, cfg.Name, holderEnv, string(raw))
}

// A holder process frozen (SIGSTOP) past its row's TTL while another
// machine takes the slot: when it runs again its Fence says the slot is
// lost, so it does not act.
func TestHolderFrozenPastTTL(t *testing.T) {
	c := cluster(t)
	ctx := ctxT(t, 2*time.Minute)
	key := uniqueKey(t)
	const ttl = 2 * time.Second
	h := startHolder(t, holderConfig{Nodes: c.Addresses(), Key: key, Name: "frozen", TTL: ttl, LockDelay: -1})
	h.waitFor(t, ctx, "acquired")
	h.send(t, "fence")
	if ev := h.waitFor(t, ctx, "fence"); ev.Err != "" {
		t.Fatalf("fence of a held slot: %s", ev.Err)
	}
	if err := h.freeze(); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	db := c.DB("successor")
	defer db.Close()
	b, err := sqlbudget.New(sqlbudget.Config{Tx: sqlbudget.DBTx(db), Holder: "successor", TTL: ttl, LockDelay: -1, ClockSkew: ttl / 10})
	if err != nil {
		t.Fatal(err)
	}
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(frozen)
	if _, err := s.(budget.Fencer).Fence(ctx); err != nil {
		t.Fatalf("successor's fence: %v", err)
	}
	h.send(t, "fence") // read as soon as it runs again
	if err := h.thaw(); err != nil {
		t.Fatal(err)
	}
	ev := h.waitFor(t, ctx, "fence")
	t.Logf("holder frozen; successor took the slot after %s (TTL %s); the frozen holder's fence on thawing: %s", took.Round(time.Millisecond), ttl, ev.Err)
	if !ev.Lost {
		t.Errorf("the frozen holder's fence says %q while the successor holds the slot", ev.Err)
	}
	if took < ttl/2 {
		t.Errorf("the successor took the slot %s after the freeze, before the holder's row could have expired", took)
	}
	if err := s.Release(ctx); err != nil {
		t.Error(err)
	}
}

// A rollout of four machines on a dqlite cluster of their own, budget 1,
// under faults, one after the other: the dqlite leader killed (and later
// restarted on its data), a machine frozen right after its fence past its
// TTL, the (new) leader frozen for longer than the TTL. From the sites'
// change records: never more than one machine restarting or not ready.
func TestRolloutFaults(t *testing.T) {
	c := newCluster(t)
	ctx := ctxT(t, 4*time.Minute)
	const ttl, lockDelay = 3 * time.Second, 4 * time.Second
	cfg := machineConfig{Nodes: c.Addresses(), Key: uniqueKey(t), Max: 1, TTL: ttl, LockDelay: lockDelay,
		Restarts: 5, StepDur: 20 * time.Millisecond, ReadyDelay: 300 * time.Millisecond}
	var ms []*machine
	for i := range 4 {
		mc := cfg
		mc.Name = fmt.Sprintf("machine-%d", i+1)
		ms = append(ms, startMachine(t, mc, nil))
	}
	start := time.Now()
	var log []string
	note := func(format string, args ...any) {
		log = append(log, fmt.Sprintf("+%5.1fs ", time.Since(start).Seconds())+fmt.Sprintf(format, args...))
	}

	// 1. The leader killed mid-rollout.
	ms[0].waitFor(t, ctx, "change")
	l := c.Leader(ctx)
	if l < 0 {
		t.Fatal("no leader")
	}
	c.Kill(l)
	note("killed the dqlite leader n%d", l)

	// 2. A machine frozen right after its fence, past its TTL (its
	// restart may be sent when it thaws: the lock-delay covers it).
	victim := ms[1]
	victim.waitFor(t, ctx, snapsvc.BudgetFenced)
	if err := victim.freeze(); err != nil {
		t.Fatal(err)
	}
	note("froze %s after its fence", victim.name)
	time.Sleep(ttl + time.Second) // the fault's length, not a synchronisation
	if err := victim.thaw(); err != nil {
		t.Fatal(err)
	}
	note("thawed %s", victim.name)

	// 3. The killed node restarted on its data.
	if err := c.Restart(ctx, l); err != nil {
		t.Fatal(err)
	}
	note("restarted n%d on its data", l)

	// 4. The (new) leader frozen for longer than the TTL.
	ms[2].waitFor(t, ctx, "change")
	l2 := c.Leader(ctx)
	if l2 < 0 {
		t.Fatal("no leader")
	}
	if err := c.Freeze(l2); err != nil {
		t.Fatal(err)
	}
	note("froze the dqlite leader n%d", l2)
	time.Sleep(ttl + 2*time.Second) // the fault's length
	if err := c.Thaw(l2); err != nil {
		t.Fatal(err)
	}
	note("thawed n%d", l2)

	lost, errs := 0, 0
	for _, m := range ms {
		for _, ev := range m.wait(t, ctx) {
			switch ev.Ev {
			case snapsvc.BudgetLost:
				lost++
			case "error":
				errs++
			}
		}
	}
	ivs := restartIntervals(ms)
	peak := rollouttest.MaxConcurrent(ivs)
	for _, line := range log {
		t.Log(line)
	}
	t.Logf("%d restarts by 4 machines in %s, at most %d restarting or not ready at once (budget 1); %d slots lost and reported, %d errors retried or reported",
		len(ivs), rollouttest.Makespan(ivs).Round(time.Millisecond), peak, lost, errs)
	if peak > 1 {
		t.Errorf("%d machines restarting or not ready at once, budget 1", peak)
		for _, iv := range ivs {
			t.Logf("%s %s +%s .. +%s", iv.Machine, iv.Change, iv.From.Sub(start).Round(time.Millisecond), iv.To.Sub(start).Round(time.Millisecond))
		}
	}
	if len(ivs) < 20 {
		t.Errorf("%d restarts, want at least 20", len(ivs))
	}
}
