//go:build libsqlite3

package dqlitetest

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/testsupport/rollouttest"
)

// The rollout-demo on dqlite: five simulated machines (each a dqlite
// client process with its own fake snapd) restart microovn.ovn-northd,
// as microovn's refresh does on every member at once, under budget 1 and
// then 2, on a 3-node dqlite cluster. It prints the timeline of the
// budget-1 run and the figures of both; the peak comes from the sites'
// change records.
func TestRolloutDemo(t *testing.T) {
	c := cluster(t)
	ctx := ctxT(t, 3*time.Minute)
	makespans := map[int]time.Duration{}
	for _, max := range []int{1, 2} {
		cfg := machineConfig{Nodes: c.Addresses(), Key: uniqueKey(t), Max: max, TTL: 3 * time.Second, LockDelay: 10 * time.Second,
			Restarts: 3, StepDur: 50 * time.Millisecond, ReadyDelay: 300 * time.Millisecond, Settle: 100 * time.Millisecond}
		var ms []*machine
		for i := range 5 {
			mc := cfg
			mc.Name = fmt.Sprintf("machine-%d", i+1)
			ms = append(ms, startMachine(t, mc, nil))
		}
		var lines []string
		var first time.Time
		all := map[string][]event{}
		for _, m := range ms {
			all[m.name] = m.wait(t, ctx)
			if evs := all[m.name]; len(evs) > 0 && (first.IsZero() || evs[0].T.Before(first)) {
				first = evs[0].T
			}
		}
		errs := 0
		for name, evs := range all {
			for _, ev := range evs {
				switch ev.Ev {
				case "waiting":
					lines = append(lines, fmt.Sprintf("%s|%-10s waits behind %s", ev.T.Format(time.RFC3339Nano), name, strings.Join(ev.Holders, ", ")))
				case "acquired":
					lines = append(lines, fmt.Sprintf("%s|%-10s acquired after %s; restarting", ev.T.Format(time.RFC3339Nano), name, ev.Waited.Round(time.Millisecond)))
				case "ready":
					lines = append(lines, fmt.Sprintf("%s|%-10s ovn-northd ready", ev.T.Format(time.RFC3339Nano), name))
				case "released":
					lines = append(lines, fmt.Sprintf("%s|%-10s released (held %s)", ev.T.Format(time.RFC3339Nano), name, ev.Held.Round(time.Millisecond)))
				case "error", "lost":
					errs++
					t.Errorf("%s: %s %s", name, ev.Ev, ev.Err)
				}
			}
		}
		ivs := restartIntervals(ms)
		peak := rollouttest.MaxConcurrent(ivs)
		makespans[max] = rollouttest.Makespan(ivs)
		if max == 1 {
			sort.Strings(lines)
			for _, l := range lines {
				ts, rest, _ := strings.Cut(l, "|")
				at, _ := time.Parse(time.RFC3339Nano, ts)
				t.Logf("%8s  %s", fmt.Sprintf("+%.3fs", at.Sub(first).Seconds()), rest)
			}
		}
		t.Logf("budget %d: 5 machines × 3 restarts = %d restarts on 3 dqlite nodes, at most %d restarting or not ready at once, makespan %s",
			max, len(ivs), peak, makespans[max].Round(time.Millisecond))
		if len(ivs) != 15 || peak > max {
			t.Errorf("budget %d: %d restarts (want 15), %d at once", max, len(ivs), peak)
		}
		if max == 2 && peak < 2 {
			t.Error("budget 2 never used its second slot")
		}
	}
	t.Logf("makespan budget 2 / budget 1 = %.2f", float64(makespans[2])/float64(makespans[1]))
}
