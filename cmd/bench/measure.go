package main

import (
	"slices"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/testsupport/benchkit"
)

// metrics are one sample's figures, read from the fake's request log and
// changes (all on the real clock).
type metrics struct {
	makespan  time.Duration // t0 to the end of the last call
	calls     int
	failed    int
	requests  int // every request snapd received
	changes   int // changes the strategy made
	waited    time.Duration
	waitedReq int // requests that arrived while a call was waiting
	wakes     []time.Duration
}

// acceptedAt returns when the request that created change id arrived
// (the accepted POST /v2/apps), and false when the log has none.
func acceptedAt(reqs []fake.Request, id string) (time.Time, bool) {
	if id == "" {
		return time.Time{}, false
	}
	for _, r := range reqs {
		if r.Change == id && r.Method == "POST" && r.Status == 202 {
			return r.Time, true
		}
	}
	return time.Time{}, false
}

// acceptedFor returns when the request that did o's work arrived: the
// one that made its change, or, for snapctl (whose answer names no
// change), the accepted action answered last by the time o ended.
func acceptedFor(reqs []fake.Request, o benchkit.Outcome) (time.Time, bool) {
	if o.ChangeID != "" {
		return acceptedAt(reqs, o.ChangeID)
	}
	var best fake.Request
	for _, r := range reqs {
		if isAction(r) && r.Status < 400 && !r.Time.Before(o.Start) && !r.Done.After(o.End) && r.Done.After(best.Done) {
			best = r
		}
	}
	return best.Time, !best.Time.IsZero()
}

// lastReadyBefore returns the latest ready time of a change ready before
// t: when the snap last became free before t.
func lastReadyBefore(chgs []fake.ChangeInfo, t time.Time) (time.Time, bool) {
	var last time.Time
	for _, c := range chgs {
		if c.Ready && c.ReadyTime.Before(t) && c.ReadyTime.After(last) {
			last = c.ReadyTime
		}
	}
	return last, !last.IsZero()
}

// isAction reports whether r asked snapd to act on services.
func isAction(r fake.Request) bool {
	return r.Method == "POST" && (r.Path == "/v2/apps" || r.Path == "/v2/snapctl")
}

// refused reports whether snapd refused action request r with a change
// conflict (classified as the library classifies snapd's answers).
func refused(r fake.Request) bool {
	if r.Status < 400 {
		return false
	}
	return retry.Classify(&snapd.Error{Method: r.Method, Path: r.Path, StatusCode: r.Status, Kind: r.Kind, Message: r.Message}) == retry.Conflict
}

// waitWindows returns when callers were waiting, from the request log:
// from each refusal of an action (a change conflict) to the arrival of
// the next action snapd accepted; in late-socket, from t0 (nothing
// reaches a socket that is not there) to the first accepted action. A
// refusal that no accepted action follows opens no window (whoever was
// refused gave up, and a caller that gave up is not waiting), and when no
// call waited a conflict out (naive's refused calls all fail) nobody
// waited at all.
func waitWindows(s sample) []benchkit.Interval {
	waitedOut := s.job.scenario == scLateSocket
	for _, o := range s.outs {
		waitedOut = waitedOut || (o.Conflicts > 0 && !o.Failed())
	}
	if !waitedOut {
		return nil
	}
	var acts []fake.Request
	for _, r := range s.requests {
		if isAction(r) {
			acts = append(acts, r)
		}
	}
	slices.SortFunc(acts, func(a, b fake.Request) int { return a.Time.Compare(b.Time) })
	var ws []benchkit.Interval
	open := func(from time.Time) {
		for _, r := range acts {
			if r.Time.After(from) && r.Status < 400 {
				ws = append(ws, benchkit.Interval{From: from, To: r.Time})
				return
			}
		}
	}
	if s.job.scenario == scLateSocket {
		open(s.t0)
	}
	for _, r := range acts {
		if refused(r) {
			open(r.Time)
		}
	}
	return benchkit.Union(ws)
}

// measure computes a sample's metrics.
//
// Wake latency is, for each call that snapd refused with a conflict and
// that then made its own change, the time from the moment the snap last
// became free (the latest change ready before our accepted request
// arrived) to that arrival: how long the snap sat idle while the call
// waited. In late-socket it is from the socket's appearance to the
// accepted request's arrival instead. The requests that arrived while
// callers waited (inside waitWindows, the refusal that opens a window and
// the accepted request that closes it left out: every strategy makes
// those) are the cost of waiting.
func measure(s sample) metrics {
	m := metrics{calls: len(s.outs), changes: s.counters.ChangesCreated - s.base.ChangesCreated}
	for k, n := range s.counters.Requests {
		m.requests += n - s.base.Requests[k]
	}
	end := s.t0
	for _, o := range s.outs {
		if o.Failed() {
			m.failed++
		}
		if o.End.After(end) {
			end = o.End
		}
		arrived, ok := acceptedFor(s.requests, o)
		if !ok || o.Shared || o.Failed() {
			continue
		}
		switch {
		case s.job.scenario == scLateSocket:
			m.wakes = append(m.wakes, arrived.Sub(s.socketUp))
		case o.Conflicts > 0:
			if free, seen := lastReadyBefore(s.changes, arrived); seen {
				m.wakes = append(m.wakes, arrived.Sub(free))
			}
		}
	}
	m.makespan = end.Sub(s.t0)
	windows := waitWindows(s)
	if isWaiters(s.job.scenario) {
		// Every caller waits on the one blocker: snapd's load is what
		// arrives while it holds the snap.
		windows = []benchkit.Interval{{From: s.t0, To: s.freed}}
	}
	m.waited = benchkit.Length(windows)
	for _, r := range s.requests {
		if benchkit.Contains(windows, r.Time) {
			m.waitedReq++
		}
	}
	return m
}
