package etcdbudget_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
)

// TestRolloutFaults runs a rollout (5 machines, budget 2) through a
// randomized schedule of the faults of issue 19: kill -9 of a machine
// (started again on its site, as a supervisor would), a machine paused
// (SIGSTOP) for up to 3s (past its 2s TTL at times), an etcd member hung (SIGSTOP) while two keep
// a quorum, and compactions. The number of machines restarting or not
// ready at once, rebuilt from the sites' change records (outside the
// faulted processes), never exceeds the budget; every machine call is
// bounded (2 minutes) and the whole run too. The seed is fixed and
// logged; ETCDBUDGET_FAULT_SEED=N replays another, =random draws one.
//
// Pauses stay below 2/3 TTL + LockDelay - 1s: a holder paused longer,
// whose restart was not sent yet, needs the core to fence before it acts
// (snapsvc.BudgetFencer; TestFencePausedHolder shows the slot's side).
func TestRolloutFaults(t *testing.T) {
	p := cluster(t)
	ctx := ctxT(t, 3*time.Minute)
	cli := client(t, p.Endpoints()...)
	// A fixed schedule by default, so the suite runs the same faults every
	// time: the one that found an expired waiter's lease reported as not
	// retryable. ETCDBUDGET_FAULT_SEED=N replays another; =random draws one
	// (for sweeps).
	seed := uint64(1796385466236575672)
	switch s := os.Getenv("ETCDBUDGET_FAULT_SEED"); s {
	case "":
	case "random":
		seed = uint64(time.Now().UnixNano())
	default:
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("ETCDBUDGET_FAULT_SEED: %v", err)
		}
		seed = n
	}
	rng := rand.New(rand.NewPCG(seed, 19))
	t.Logf("seed %d (ETCDBUDGET_FAULT_SEED=%d replays it)", seed, seed)

	// The service is ready 2.5s after its change, later than a killed
	// holder's lease expires (2/3 TTL to TTL after the kill): without the
	// lock-delay, killing a machine whose service is not ready lets a
	// third machine in.
	const n, budget, restarts = 5, 2, 3
	const ttl, lockDelay = 2 * time.Second, 3 * time.Second
	cfg := machineConfig{Endpoints: p.Endpoints(), Key: uniqueKey(t), Max: budget, TTL: ttl, Unreachable: 10 * time.Second,
		LockDelay: lockDelay, Restarts: restarts, StepDur: 20 * time.Millisecond, ReadyDelay: 2500 * time.Millisecond}
	ms := rollout(t, n, cfg)
	all := append([]*machine(nil), ms...) // every process, for the intervals
	exited := func(m *machine) bool {
		select {
		case err := <-m.exited:
			m.exited <- err
			return true
		default:
			return false
		}
	}
	counts := map[string]int{}
	var log []string
	for f := 0; f < 12; f++ {
		if err := sleep(ctx, time.Duration(300+rng.IntN(700))*time.Millisecond); err != nil {
			t.Fatal(err)
		}
		var live []int
		for i, m := range ms {
			if !exited(m) {
				live = append(live, i)
			}
		}
		if len(live) == 0 {
			break
		}
		// Mostly a machine whose service is restarting or not ready:
		// the one whose loss is dangerous.
		var busy []int
		for _, i := range live {
			if _, ok := ms[i].site.notReadyUntil(time.Now()); ok {
				busy = append(busy, i)
			}
		}
		i := live[rng.IntN(len(live))]
		if len(busy) > 0 && rng.IntN(5) > 0 {
			i = busy[rng.IntN(len(busy))]
		}
		switch kind := rng.IntN(4); kind {
		case 0: // kill -9, then the supervisor starts it again
			ms[i].kill()
			c := cfg
			c.Name, c.Restarts = ms[i].name, 1
			ms[i] = startMachineAt(t, c, ms[i].site)
			all = append(all, ms[i])
			counts["kill -9 machine"]++
			log = append(log, "kill "+c.Name)
		case 1: // pause a machine, past its TTL at times
			d := time.Duration(500+rng.IntN(2500)) * time.Millisecond
			etcdtest.Pause(ms[i].cmd.Process.Pid)
			sleep(ctx, d)
			etcdtest.Resume(ms[i].cmd.Process.Pid)
			counts["pause machine"]++
			log = append(log, fmt.Sprintf("pause %s %s", ms[i].name, d))
		case 2: // hang one etcd member; two keep a quorum
			mem := rng.IntN(3)
			d := time.Duration(1000+rng.IntN(2000)) * time.Millisecond
			if err := p.Pause(mem); err != nil {
				t.Fatal(err)
			}
			sleep(ctx, d)
			if err := p.Resume(mem); err != nil {
				t.Fatal(err)
			}
			counts["hang etcd member"]++
			log = append(log, fmt.Sprintf("hang m%d %s", mem, d))
		case 3:
			r, err := cli.Put(ctx, "/faults/compact", "x") // a revision not compacted yet
			if err == nil {
				_, err = cli.Compact(ctx, r.Header.Revision)
			}
			if err != nil {
				t.Fatal(err)
			}
			counts["compaction"]++
			log = append(log, "compact")
		}
	}
	t.Logf("faults: %s", strings.Join(log, ", "))
	timelines := map[string][]event{}
	for _, m := range ms {
		timelines[m.name] = m.wait(t, ctx)
	}
	for _, m := range all {
		for _, ev := range m.timeline() {
			switch ev.Ev {
			case "error", "lost":
				counts[ev.Ev]++
				t.Logf("%s: %s %s", m.name, ev.Ev, ev.Err)
			case "acquired":
				counts["acquired"]++
			}
		}
	}
	ivs := restartIntervals(t, ms)
	open := 0
	for _, iv := range ivs {
		if iv.to.After(time.Now()) {
			open++
		}
	}
	peak := maxConcurrent(ivs)
	t.Logf("budget %d: %d restarts (%d never ready), at most %d restarting or not ready at once; counts %v", budget, len(ivs), open, peak, counts)
	if peak > budget {
		t.Errorf("%d machines restarting or not ready at once, budget %d", peak, budget)
		for _, iv := range ivs {
			t.Logf("%s %s %s .. %s", iv.machine, iv.change, iv.from.Format("15:04:05.000"), iv.to.Format("15:04:05.000"))
		}
	}
	if open > 0 {
		t.Errorf("%d restarts never became ready", open)
	}
}

// sleep waits d or until ctx ends (not a synchronisation: the faults'
// schedule).
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
