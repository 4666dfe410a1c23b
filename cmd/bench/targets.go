package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/testsupport/benchkit"
)

// target is one of issue 12's or issue 22's targets for snapsvc, checked
// on the rows.
type target struct {
	Name   string `json:"target"`
	Figure string `json:"figure"`
	Met    bool   `json:"met"`
}

func (t target) String() string {
	verdict := "MISSED"
	if t.Met {
		verdict = "met"
	}
	return fmt.Sprintf("target %-62s %-6s %s", t.Name+":", verdict, t.Figure)
}

// stormFewer is what "far fewer changes than calls" is taken to mean.
const stormFewer = 4

// checkTargets checks every target whose rows were run (snapsvc's rows
// only: issue 12's for the library on a host, issue 22's for snapctl
// mode, the confined snap and many waiters).
func checkTargets(rows []row) []target {
	var out []target
	fd := func(d time.Duration, ok bool) string { return benchkit.FormatDuration(d, ok) }
	for _, r := range rows {
		if !benchkit.IsSnapsvc(r.Strategy) {
			continue
		}
		p50, ok50 := r.Wake(50)
		p99, ok99 := r.Wake(99)
		rate, rateOK := r.WaitRate()
		who := r.Strategy
		waitFigure := fmt.Sprintf("wake p50 %s, p99 %s (n=%d); %.1f req/s over %s waited (%d requests)", fd(p50, ok50), fd(p99, ok99), len(r.Wakes), rate, fd(r.Waited, true), r.WaitedRequests)
		blindTarget := func(name string, limit, under time.Duration) target {
			if r.Hold >= under {
				return target{
					Name:   fmt.Sprintf("%s foreign %s, %s (%s): <= 20 req/s", who, r.param(), name, r.Version),
					Figure: waitFigure,
					Met:    !rateOK || rate <= 20,
				}
			}
			return target{
				Name:   fmt.Sprintf("%s foreign %s, %s (%s): wake p50 <= %v at <= 20 req/s", who, r.param(), name, r.Version, limit),
				Figure: waitFigure,
				Met:    ok50 && p50 <= limit && (!rateOK || rate <= 20),
			}
		}
		switch {
		case r.Scenario == scForeign && r.Strategy == benchkit.SnapsvcSnapctl:
			out = append(out, blindTarget("snapctl, blind", 50*time.Millisecond, 2*time.Second))
		case r.Scenario == scForeign && r.Strategy == benchkit.SnapsvcConfined && !r.Notices:
			out = append(out, blindTarget("no notices, no state file", 30*time.Millisecond, time.Second))
		case r.Scenario == scForeign && r.Notices:
			out = append(out, target{
				Name:   fmt.Sprintf("%s foreign %s, notices (%s): wake p50 <= 5ms", who, r.param(), r.Version),
				Figure: fmt.Sprintf("wake p50 %s, p99 %s (n=%d)", fd(p50, ok50), fd(p99, ok99), len(r.Wakes)),
				Met:    ok50 && p50 <= 5*time.Millisecond,
			})
		case r.Scenario == scForeign:
			limit := 25 * time.Millisecond
			if r.Hold > time.Second {
				limit = 60 * time.Millisecond
			}
			out = append(out, target{
				Name:   fmt.Sprintf("%s foreign %s, no notices (%s): wake p50 <= %v at <= 20 req/s", who, r.param(), r.Version, limit),
				Figure: waitFigure,
				Met:    ok50 && p50 <= limit && rateOK && rate <= 20,
			})
		case r.Scenario == scLateSocket:
			out = append(out, target{
				Name:   fmt.Sprintf("%s late-socket (%s): socket up -> accepted <= 100ms", who, r.Version),
				Figure: fmt.Sprintf("p50 %s, p99 %s (n=%d)", fd(p50, ok50), fd(p99, ok99), len(r.Wakes)),
				Met:    ok99 && p99 <= 100*time.Millisecond && r.Failed == 0,
			})
		case r.Scenario == scBootstrap:
			out = append(out, target{
				Name:   fmt.Sprintf("%s bootstrap (%s): makespan <= 1.05 x ideal, 0 failed calls", who, r.Version),
				Figure: fmt.Sprintf("%s = %.2f x ideal %s; %d of %d calls failed", fd(r.Makespan, true), r.Ratio, fd(r.Ideal, true), r.Failed, r.Calls),
				Met:    r.Ratio <= 1.05 && r.Failed == 0,
			})
		case r.Scenario == scUncontended:
			out = append(out, target{
				Name:   fmt.Sprintf("%s no conflict (%s): <= 3 snapd requests per operation", who, r.Version),
				Figure: fmt.Sprintf("%.1f requests per restart", r.RequestsPerCall()),
				Met:    r.RequestsPerCall() <= 3,
			})
		case r.Scenario == scStorm:
			out = append(out, target{
				Name:   fmt.Sprintf("%s storm (%s): far fewer changes than calls (<= 1/%d)", who, r.Version, stormFewer),
				Figure: fmt.Sprintf("%.1f changes for %d calls per run; %d failed", r.Changes, r.Calls/r.Samples, r.Failed),
				Met:    r.Changes*stormFewer <= float64(r.Calls/r.Samples) && r.Failed == 0,
			})
		}
	}
	return append(out, waitersTargets(rows)...)
}

// waitersGrowthK and waitersGrowthP are what "does not grow with K" and
// "grows at most linearly, with a small constant, with P" are taken to
// mean: the rate with the most callers per process at most 1.5 x the rate
// with one (plus 1 request/s of noise), and the rate with P processes at
// most 1.5 x P x the rate with one.
const (
	waitersGrowthK = 1.5
	waitersGrowthP = 1.5
)

// waitersTargets checks, per snapd version and snapsvc mode, how snapd's
// load grows with the callers (K) and processes (P) waiting on one
// blocker.
func waitersTargets(rows []row) []target {
	type key struct {
		v        string
		strategy string
	}
	cells := map[key]map[[2]int]float64{}
	var order []key
	for _, r := range rows {
		if r.Scenario != scWaiters || !benchkit.IsSnapsvc(r.Strategy) {
			continue
		}
		k := key{string(r.Version), r.Strategy}
		if cells[k] == nil {
			cells[k] = map[[2]int]float64{}
			order = append(order, k)
		}
		rate, _ := r.WaitRate()
		cells[k][[2]int{r.K, r.P}] = rate
	}
	var out []target
	for _, k := range order {
		c := cells[k]
		var ks, ps []int
		for kp := range c {
			if !slices.Contains(ks, kp[0]) {
				ks = append(ks, kp[0])
			}
			if !slices.Contains(ps, kp[1]) {
				ps = append(ps, kp[1])
			}
		}
		slices.Sort(ks)
		slices.Sort(ps)
		kMin, kMax, pMin := ks[0], ks[len(ks)-1], ps[0]
		if kMax > kMin {
			var figs []string
			met := true
			for _, p := range ps {
				lo, hi := c[[2]int{kMin, p}], c[[2]int{kMax, p}]
				figs = append(figs, fmt.Sprintf("P=%d: %.1f -> %.1f req/s", p, lo, hi))
				met = met && hi <= waitersGrowthK*lo+1
			}
			out = append(out, target{
				Name:   fmt.Sprintf("%s waiters (%s): req/s does not grow with K (%d -> %d callers per process)", k.strategy, k.v, kMin, kMax),
				Figure: strings.Join(figs, "; "),
				Met:    met,
			})
		}
		for _, p := range ps {
			if p == pMin {
				continue
			}
			var figs []string
			met := true
			for _, kk := range ks {
				lo, hi := c[[2]int{kk, pMin}], c[[2]int{kk, p}]
				figs = append(figs, fmt.Sprintf("K=%d: %.1f -> %.1f req/s", kk, lo, hi))
				met = met && hi <= waitersGrowthP*float64(p)/float64(pMin)*lo+1
			}
			out = append(out, target{
				Name:   fmt.Sprintf("%s waiters (%s): req/s at most ~linear in P (%d -> %d processes)", k.strategy, k.v, pMin, p),
				Figure: strings.Join(figs, "; "),
				Met:    met,
			})
		}
	}
	return out
}
