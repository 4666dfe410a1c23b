// Package rollouttest measures a rollout the way an operator would: from
// the changes each machine's snapd (a fake.Server) recorded, not from
// anything the budget or the machines report. The budgets' fault and
// rollout tests (etcd, dqlite) share it.
package rollouttest

import (
	"sort"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)

// Interval is one restart as a machine's snapd saw it: from the change's
// spawn until its service was ready (the change done, plus the service's
// ready delay).
type Interval struct {
	Machine, Change string
	From, To        time.Time
}

// Site is one machine's snapd and how long its service takes to be ready
// once its change is done.
type Site struct {
	Machine    string
	Server     *fake.Server
	ReadyDelay time.Duration
}

// Intervals returns every change of every site as an Interval, sorted by
// spawn time. A change not done yet is open until an hour from now.
func Intervals(sites []Site) []Interval {
	var out []Interval
	for _, s := range sites {
		for _, c := range s.Server.Changes() {
			to := time.Now().Add(time.Hour)
			if c.Ready {
				to = c.ReadyTime.Add(s.ReadyDelay)
			}
			out = append(out, Interval{Machine: s.Machine, Change: c.ID, From: c.SpawnTime, To: to})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].From.Before(out[j].From) })
	return out
}

// MaxConcurrent is the most intervals open at one instant (an interval
// ending at the instant another starts does not overlap it).
func MaxConcurrent(ivs []Interval) int {
	type edge struct {
		t     time.Time
		delta int
	}
	var edges []edge
	for _, iv := range ivs {
		edges = append(edges, edge{iv.From, +1}, edge{iv.To, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].t.Equal(edges[j].t) {
			return edges[i].delta < edges[j].delta
		}
		return edges[i].t.Before(edges[j].t)
	})
	cur, peak := 0, 0
	for _, e := range edges {
		cur += e.delta
		peak = max(peak, cur)
	}
	return peak
}

// Makespan is the time from the first interval's start to the last one's
// end.
func Makespan(ivs []Interval) time.Duration {
	if len(ivs) == 0 {
		return 0
	}
	first, last := ivs[0].From, ivs[0].To
	for _, iv := range ivs {
		if iv.From.Before(first) {
			first = iv.From
		}
		if iv.To.After(last) {
			last = iv.To
		}
	}
	return last.Sub(first)
}
