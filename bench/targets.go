package main

import (
	"fmt"
	"time"

	"github.com/snapsvc/snapsvc/testsupport/benchkit"
)

// target is one of issue 12's targets for snapsvc, checked on the rows.
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
// only).
func checkTargets(rows []row) []target {
	var out []target
	fd := func(d time.Duration, ok bool) string { return benchkit.FormatDuration(d, ok) }
	for _, r := range rows {
		if r.Strategy != benchkit.Snapsvc {
			continue
		}
		p50, ok50 := r.Wake(50)
		p99, ok99 := r.Wake(99)
		rate, rateOK := r.WaitRate()
		switch {
		case r.Scenario == scForeign && r.Notices:
			out = append(out, target{
				Name:   fmt.Sprintf("foreign %s, notices (%s): wake p50 <= 5ms", r.param(), r.Version),
				Figure: fmt.Sprintf("wake p50 %s, p99 %s (n=%d)", fd(p50, ok50), fd(p99, ok99), len(r.Wakes)),
				Met:    ok50 && p50 <= 5*time.Millisecond,
			})
		case r.Scenario == scForeign:
			limit := 25 * time.Millisecond
			if r.Hold > time.Second {
				limit = 60 * time.Millisecond
			}
			out = append(out, target{
				Name:   fmt.Sprintf("foreign %s, no notices (%s): wake p50 <= %v at <= 20 req/s", r.param(), r.Version, limit),
				Figure: fmt.Sprintf("wake p50 %s, p99 %s (n=%d); %.1f req/s over %s waited (%d requests)", fd(p50, ok50), fd(p99, ok99), len(r.Wakes), rate, fd(r.Waited, true), r.WaitedRequests),
				Met:    ok50 && p50 <= limit && rateOK && rate <= 20,
			})
		case r.Scenario == scLateSocket:
			out = append(out, target{
				Name:   fmt.Sprintf("late-socket (%s): socket up -> accepted <= 100ms", r.Version),
				Figure: fmt.Sprintf("p50 %s, p99 %s (n=%d)", fd(p50, ok50), fd(p99, ok99), len(r.Wakes)),
				Met:    ok99 && p99 <= 100*time.Millisecond && r.Failed == 0,
			})
		case r.Scenario == scBootstrap:
			out = append(out, target{
				Name:   fmt.Sprintf("bootstrap (%s): makespan <= 1.05 x ideal, 0 failed calls", r.Version),
				Figure: fmt.Sprintf("%s = %.2f x ideal %s; %d of %d calls failed", fd(r.Makespan, true), r.Ratio, fd(r.Ideal, true), r.Failed, r.Calls),
				Met:    r.Ratio <= 1.05 && r.Failed == 0,
			})
		case r.Scenario == scUncontended:
			out = append(out, target{
				Name:   fmt.Sprintf("no conflict (%s): <= 3 snapd requests per operation", r.Version),
				Figure: fmt.Sprintf("%.1f requests per restart", r.RequestsPerCall()),
				Met:    r.RequestsPerCall() <= 3,
			})
		case r.Scenario == scStorm:
			out = append(out, target{
				Name:   fmt.Sprintf("storm (%s): far fewer changes than calls (<= 1/%d)", r.Version, stormFewer),
				Figure: fmt.Sprintf("%.1f changes for %d calls per run; %d failed", r.Changes, r.Calls/r.Samples, r.Failed),
				Met:    r.Changes*stormFewer <= float64(r.Calls/r.Samples) && r.Failed == 0,
			})
		}
	}
	return out
}
