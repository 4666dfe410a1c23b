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

// waitersGrowthK is what "does not grow with K" is taken to mean: the
// rate with the most callers per process at most 1.5 x the rate with one
// (plus 1 request/s of noise). waitersGrowthP is issue 35's bound on how
// it grows with P: the rate with the most processes at most 1.25 x the
// rate with the fewest.
const (
	waitersGrowthK = 1.5
	waitersGrowthP = 1.25
)

// waitersKey is one mode of the waiters scenarios: the scenario, snapd's
// version and snapsvc's strategy.
type waitersKey struct {
	scenario string
	version  string
	strategy string
}

// waitersCells returns, per mode in the rows' order, each cell's rate
// (snapd requests per second while the blocker held) by {K, P}.
func waitersCells(rows []row) ([]waitersKey, map[waitersKey]map[[2]int]float64) {
	cells := map[waitersKey]map[[2]int]float64{}
	var order []waitersKey
	for _, r := range rows {
		if !isWaiters(r.Scenario) || !benchkit.IsSnapsvc(r.Strategy) {
			continue
		}
		k := waitersKey{r.Scenario, string(r.Version), r.Strategy}
		if cells[k] == nil {
			cells[k] = map[[2]int]float64{}
			order = append(order, k)
		}
		rate, _ := r.WaitRate()
		cells[k][[2]int{r.K, r.P}] = rate
	}
	return order, cells
}

// axes returns the Ks and Ps of a mode's cells, sorted.
func axes(c map[[2]int]float64) (ks, ps []int) {
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
	return ks, ps
}

// waitersTargets checks, per snapd version and snapsvc mode, how snapd's
// load grows with the callers (K) and processes (P) waiting on one
// blocker.
func waitersTargets(rows []row) []target {
	order, cells := waitersCells(rows)
	var out []target
	for _, k := range order {
		c := cells[k]
		ks, ps := axes(c)
		kMin, kMax, pMin, pMax := ks[0], ks[len(ks)-1], ps[0], ps[len(ps)-1]
		if kMax > kMin {
			var figs []string
			met := true
			for _, p := range ps {
				lo, hi := c[[2]int{kMin, p}], c[[2]int{kMax, p}]
				figs = append(figs, fmt.Sprintf("P=%d: %.1f -> %.1f req/s", p, lo, hi))
				met = met && hi <= waitersGrowthK*lo+1
			}
			out = append(out, target{
				Name:   fmt.Sprintf("%s %s (%s): req/s does not grow with K (%d -> %d callers per process)", k.strategy, k.scenario, k.version, kMin, kMax),
				Figure: strings.Join(figs, "; "),
				Met:    met,
			})
		}
		if pMax > pMin {
			var figs []string
			met := true
			for _, kk := range ks {
				lo, hi := c[[2]int{kk, pMin}], c[[2]int{kk, pMax}]
				figs = append(figs, fmt.Sprintf("K=%d: %.1f -> %.1f req/s", kk, lo, hi))
				met = met && hi <= waitersGrowthP*lo
			}
			out = append(out, target{
				Name:   fmt.Sprintf("%s %s (%s): req/s at P=%d at most %.2f x P=%d", k.strategy, k.scenario, k.version, pMax, waitersGrowthP, pMin),
				Figure: strings.Join(figs, "; "),
				Met:    met,
			})
		}
	}
	return out
}
