package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/benchkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tiny is a configuration that runs every scenario and strategy in
// seconds: short changes, fixed's pause divided by 1000.
func tiny(t *testing.T) config {
	t.Helper()
	c, err := parseFlags([]string{"--samples", "2", "--runs", "1", "--durations", "20ms", "--scale", "1000",
		"--start", "2ms", "--stop", "2ms", "--hold", "60ms", "--socket-delay", "60ms", "--parallel", "4",
		"--waiters-k", "1,2", "--waiters-p", "1,2", "--waiters-hold", "60ms"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// callsPer is how many calls one sample of each scenario makes.
var callsPer = map[string]int{
	scForeign: 1, scBootstrap: len(hookServices) + bootstrapRestarts,
	scStorm: len(stormServices) * stormRestarts, scLateSocket: 1, scUncontended: 1,
}

// TestEveryScenarioAndStrategy runs a tiny configuration of everything
// and checks the samples' and the table's bookkeeping (not timings).
func TestEveryScenarioAndStrategy(t *testing.T) {
	c := tiny(t)
	var rows []row
	for _, sc := range c.scenarios {
		samples := c.runAll(c.jobs(sc))
		for _, s := range samples {
			checkSample(t, s)
		}
		rows = append(rows, aggregate(samples)...)
	}
	snapsvcs := 0
	for _, n := range benchkit.Names {
		if benchkit.IsSnapsvc(n) {
			snapsvcs++
		}
	}
	if want := (len(allScenarios)+len(c.durations)-3)*len(benchkit.Names)*len(c.versions) +
		2*len(c.waitersK)*len(c.waitersP)*snapsvcs*len(c.versions); len(rows) != want {
		t.Fatalf("%d rows, want %d", len(rows), want)
	}
	for _, r := range rows {
		n := c.samples
		if r.Scenario == scBootstrap || r.Scenario == scStorm || isWaiters(r.Scenario) {
			n = c.runs
		}
		calls := callsPer[r.Scenario]
		if isWaiters(r.Scenario) {
			calls = r.K * r.P
		}
		if r.Samples != n || r.Calls != n*calls || r.Failed > r.Calls || len(r.Errors) > 0 {
			t.Errorf("row %+v: want %d samples of %d calls, no harness error", r, n, calls)
		}
		if benchkit.IsSnapsvc(r.Strategy) && r.Failed != 0 {
			t.Errorf("%s on %s: snapsvc failed %d calls", r.Scenario, r.Version, r.Failed)
		}
		if r.Makespan <= 0 || r.Ideal <= 0 || r.Ratio <= 0 {
			t.Errorf("row %s %s %s: makespan %v, ideal %v, ratio %v", r.Scenario, r.Version, r.Strategy, r.Makespan, r.Ideal, r.Ratio)
		}
		if float64(r.WaitedRequests) > r.Requests*float64(r.Samples) {
			t.Errorf("row %s %s %s: %d requests while waiting of %v in all", r.Scenario, r.Version, r.Strategy, r.WaitedRequests, r.Requests*float64(r.Samples))
		}
	}

	var table, doc bytes.Buffer
	if err := c.writeTable(&table, rows); err != nil {
		t.Fatal(err)
	}
	out := table.String()
	for _, want := range []string{"scale 1000 = 5ms", "wake p50", "target snapsvc bootstrap (2.57.6)", "target snapsvc no conflict (2.77.1)", "target snapsvc storm", "target snapsvc late-socket", "target snapsvc foreign 20ms",
		"target snapsvc-snapctl foreign 20ms, snapctl, blind (2.57.6)", "target snapsvc-confined foreign 20ms, no notices, no state file (2.57.6)",
		"target snapsvc waiters (2.77.1): req/s does not grow with K", "target snapsvc-snapctl waiters (2.57.6): req/s at P=2 at most 1.25 x P=1",
		"target snapsvc waiters-own (2.57.6): req/s at P=2 at most 1.25 x P=1", "K=2 P=2",
		"waiters: snapd requests/s while the blocker held, by processes P", "snapctl 2.57.6 (blind)", "REST 2.77.1 (notices)", "REST 2.57.6 (state file)", "REST confined 2.57.6 (no state file)"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if got := strings.Count(out, "\n"); got < 2*len(rows)+len(c.header()) {
		t.Errorf("tables have %d lines for %d rows, each in two tables:\n%s", got, len(rows), out)
	}
	for _, l := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(l); n > tableWidth {
			t.Errorf("a line of %d columns, over %d:\n%s", n, tableWidth, l)
		}
	}
	// --wide: one table with every column, wider.
	wide := c
	wide.wide = true
	var wideOut bytes.Buffer
	if err := wide.writeTable(&wideOut, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(wideOut.String(), "reqs/call  req/s waiting  changes  wake p50  wake p99") || strings.Count(wideOut.String(), "\n") >= strings.Count(out, "\n") {
		t.Errorf("--wide is not one table with every column:\n%s", wideOut.String())
	}
	if err := c.writeJSON(&doc, rows); err != nil {
		t.Fatal(err)
	}
	var parsed struct {
		Rows []struct {
			Scenario, Strategy string
			Calls              int     `json:"calls"`
			MakespanMs         float64 `json:"makespan_p50_ms"`
		} `json:"rows"`
		Targets []target `json:"targets"`
	}
	if err := json.Unmarshal(doc.Bytes(), &parsed); err != nil {
		t.Fatalf("JSON output: %v\n%s", err, doc.String())
	}
	if len(parsed.Rows) != len(rows) || len(parsed.Targets) == 0 || parsed.Rows[0].MakespanMs <= 0 || parsed.Rows[0].Calls != rows[0].Calls {
		t.Errorf("JSON has %d rows (want %d), %d targets, first %+v", len(parsed.Rows), len(rows), len(parsed.Targets), parsed.Rows[0])
	}
}

// checkSample checks what must hold of any sample, whatever the timing.
func checkSample(t *testing.T, s sample) {
	t.Helper()
	j := s.job
	where := j.scenario + " " + string(j.version) + " " + j.strategy
	if s.err != nil {
		t.Errorf("%s: %v", where, s.err)
		return
	}
	calls := callsPer[j.scenario]
	if isWaiters(j.scenario) {
		calls = j.k * j.p
	}
	if len(s.outs) != calls {
		t.Errorf("%s: %d outcomes, want %d", where, len(s.outs), calls)
	}
	m := measure(s)
	attempts, shared := 0, 0
	for _, o := range s.outs {
		attempts += o.Attempts
		if o.Shared {
			shared++
		}
		if errors.Is(o.Err, benchkit.ErrSkipped) != (o.Attempts == 0 && !o.Shared) {
			t.Errorf("%s: %+v: skipped calls, and only they, make no attempt", where, o)
		}
		if o.Conflicts > o.Attempts {
			t.Errorf("%s: %+v: more conflicts than attempts", where, o)
		}
		if max := map[string]int{benchkit.Naive: 1, benchkit.Fixed: benchkit.FixedAttempts}[j.strategy]; max > 0 && o.Attempts > max {
			t.Errorf("%s: %+v: more than %d attempts", where, o, max)
		}
		if !o.Failed() && !o.Shared && j.strategy != benchkit.Naive && j.strategy != benchkit.SnapsvcSnapctl && o.ChangeID == "" {
			t.Errorf("%s: %+v: done without a change", where, o)
		}
	}
	own := len(benchkit.OwnChanges(s.outs))
	switch {
	case j.strategy == benchkit.SnapsvcSnapctl || j.strategy == benchkit.Naive:
		// snapctl's answers name no change.
	case benchkit.IsSnapsvc(j.strategy) && m.changes != own:
		// snapsvc makes one change per call that did not merge.
		t.Errorf("%s: %d changes created, %d distinct changes reported", where, m.changes, own)
	case benchkit.IsSnapsvc(j.strategy) && own+shared != len(s.outs):
		t.Errorf("%s: %d own changes and %d merged calls for %d calls", where, own, shared, len(s.outs))
	case m.changes < own:
		t.Errorf("%s: %d changes created but %d reported", where, m.changes, own)
	}
	// Every attempt reaches snapd, except those made before the socket
	// appeared.
	if j.scenario != scLateSocket && m.requests < attempts {
		t.Errorf("%s: %d requests for %d attempts", where, m.requests, attempts)
	}
	if m.failed > m.calls || m.makespan <= 0 || m.waited < 0 {
		t.Errorf("%s: metrics %+v", where, m)
	}
	for _, w := range m.wakes {
		if w < 0 {
			t.Errorf("%s: negative wake latency %v", where, w)
		}
	}
}

// TestMeasure checks the metrics on a hand-made request log: a caller
// refused at 1 ms, the blocker ready at 30 ms, our request at 32 ms. The
// requests made while waiting are those between the refusal and the
// accepted request, neither counted.
func TestMeasure(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	conflict := `snap "k8s" has "service-control" change in progress`
	s := sample{
		job: job{scenario: scForeign, strategy: benchkit.Snapsvc},
		t0:  t0,
		outs: []benchkit.Outcome{{Call: benchkit.Call{Action: "restart"}, Start: at(0), End: at(110),
			Attempts: 2, Conflicts: 1, ChangeID: "2"}},
		requests: []fake.Request{
			{Time: at(1), Method: "POST", Path: "/v2/apps", Status: 400, Message: conflict},
			{Time: at(2), Method: "GET", Path: "/v2/changes", Status: 200},
			{Time: at(3), Method: "GET", Path: "/v2/notices", Status: 200},
			{Time: at(31), Method: "GET", Path: "/v2/changes/1", Status: 200},
			{Time: at(32), Method: "POST", Path: "/v2/apps", Status: 202, Change: "2"},
			{Time: at(33), Method: "GET", Path: "/v2/changes/2", Status: 200},
		},
		changes: []fake.ChangeInfo{
			{ID: "1", Ready: true, SpawnTime: at(-20), ReadyTime: at(30)},
			{ID: "2", Ready: true, SpawnTime: at(32.1), ReadyTime: at(105)},
		},
		counters: fake.Counters{Requests: map[string]int{"POST /v2/apps": 2, "GET /v2/changes": 1, "GET /v2/notices": 1, "GET /v2/changes/{id}": 2}, ChangesCreated: 2},
		base:     fake.Counters{Requests: map[string]int{}, ChangesCreated: 1},
	}
	m := measure(s)
	want := metrics{makespan: 110 * time.Millisecond, calls: 1, requests: 6, changes: 1,
		waited: 31 * time.Millisecond, waitedReq: 3, wakes: []time.Duration{2 * time.Millisecond}}
	if m.makespan != want.makespan || m.calls != 1 || m.failed != 0 || m.requests != want.requests || m.changes != want.changes ||
		m.waited != want.waited || m.waitedReq != want.waitedReq || !slices.Equal(m.wakes, want.wakes) {
		t.Errorf("measure = %+v, want %+v", m, want)
	}

	// A caller that gives up opens no window; a merged call has no wake.
	s.outs[0].Err, s.requests = errors.New("gave up"), s.requests[:1]
	if m := measure(s); m.failed != 1 || m.waited != 0 || m.waitedReq != 0 || len(m.wakes) != 0 {
		t.Errorf("measure of a caller that gave up = %+v", m)
	}

	// late-socket: the wait runs from t0, the wake from the socket.
	ls := sample{
		job:      job{scenario: scLateSocket, strategy: benchkit.Snapsvc},
		t0:       t0,
		socketUp: at(1000),
		outs:     []benchkit.Outcome{{Start: at(0), End: at(1100), Attempts: 1, ChangeID: "1"}},
		requests: []fake.Request{{Time: at(1020), Method: "POST", Path: "/v2/apps", Status: 202, Change: "1"}},
		counters: fake.Counters{Requests: map[string]int{"POST /v2/apps": 1}, ChangesCreated: 1},
	}
	if m := measure(ls); m.waited != 1020*time.Millisecond || m.waitedReq != 0 || !slices.Equal(m.wakes, []time.Duration{20 * time.Millisecond}) {
		t.Errorf("measure of late-socket = %+v", m)
	}
}

// A snapctl call's answer names no change: its wake is read from the
// accepted snapctl request answered last within the call. In waiters the
// window is the blocker's hold, every request in it counted.
func TestMeasureSnapctlAndWaiters(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	conflict := `snapctl: snap "k8s" has "service-control" change in progress`
	s := sample{
		job: job{scenario: scForeign, strategy: benchkit.SnapsvcSnapctl},
		t0:  t0,
		outs: []benchkit.Outcome{{Call: benchkit.Call{Action: "restart"}, Start: at(0), End: at(120),
			Attempts: 3, Conflicts: 2}},
		requests: []fake.Request{
			{Time: at(1), Done: at(1.5), Method: "POST", Path: "/v2/snapctl", Status: 400, Message: conflict},
			{Time: at(16), Done: at(16.5), Method: "POST", Path: "/v2/snapctl", Status: 400, Message: conflict},
			{Time: at(40), Done: at(115), Method: "POST", Path: "/v2/snapctl", Status: 200},
		},
		changes: []fake.ChangeInfo{
			{ID: "1", Ready: true, SpawnTime: at(-20), ReadyTime: at(30)},
			{ID: "2", Ready: true, SpawnTime: at(40.1), ReadyTime: at(114)},
		},
		counters: fake.Counters{Requests: map[string]int{"POST /v2/snapctl": 3}, ChangesCreated: 2},
		base:     fake.Counters{Requests: map[string]int{}, ChangesCreated: 1},
	}
	m := measure(s)
	if !slices.Equal(m.wakes, []time.Duration{10 * time.Millisecond}) || m.waited != 39*time.Millisecond || m.waitedReq != 1 {
		t.Errorf("snapctl: measure = %+v, want a wake of 10ms and 1 request in 39ms", m)
	}
	s.job.scenario, s.freed = scWaiters, at(30)
	if m := measure(s); m.waited != 30*time.Millisecond || m.waitedReq != 2 {
		t.Errorf("waiters: measure = %+v, want 2 requests in 30ms", m)
	}
}

func TestFlags(t *testing.T) {
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.scenarios, allScenarios) || !slices.Equal(c.strategies, benchkit.Names) ||
		!slices.Equal(c.versions, []fake.Version{fake.Version257, fake.Version277}) || c.samples < 20 || c.scale != 1 || !c.stateFile {
		t.Errorf("defaults: %+v", c)
	}
	if c, err := parseFlags([]string{"--snapd-version", "2.68.3,2.62", "--durations", "1s,30ms", "--state-file=false"}); err != nil || c.stateFile ||
		!slices.Equal(c.versions, []fake.Version{fake.Version268, fake.Version262}) || !slices.Equal(c.durations, []time.Duration{time.Second, 30 * time.Millisecond}) {
		t.Errorf("parsed %+v, %v", c, err)
	}
	for _, bad := range [][]string{
		{"--scenario", "rush"}, {"--strategy", "hope"}, {"--snapd-version", "1.0"}, {"--durations", "soon"},
		{"--scale", "0.5"}, {"--samples", "0"}, {"--hold", "0s"}, {"extra"}, {"--json", "--wide"}, {"-scale", "2"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
	// The shared CLI style: GNU flags, usage errors exit 2 with the hint,
	// help and --version on stdout.
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--scenario", "rush"}, io.Discard, &stderr); code != 2 || stderr.String() != "error: unknown scenario \"rush\" (want "+strings.Join(allScenarios, ", ")+")\nRun 'bench --help' for usage.\n" {
		t.Errorf("run with a bad scenario: exit %d, %q", code, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"-bogus"}, io.Discard, &stderr); code != 2 || !strings.HasPrefix(stderr.String(), "error: unknown shorthand flag: 'b' in -bogus\n") {
		t.Errorf("run -bogus: exit %d, %q", code, stderr.String())
	}
	if code := run([]string{"-h"}, &stdout, io.Discard); code != 0 || !strings.Contains(stdout.String(), "--quick") {
		t.Errorf("run -h: exit %d, %q", code, stdout.String())
	}
	stdout.Reset()
	if code := run([]string{"--version"}, &stdout, io.Discard); code != 0 || !strings.HasPrefix(stdout.String(), "bench ") {
		t.Errorf("run --version: exit %d, %q", code, stdout.String())
	}

	// --quick: its preset for every flag not given.
	q, err := parseFlags([]string{"--quick", "--samples", "7"})
	if err != nil {
		t.Fatal(err)
	}
	if q.scale != 100 || q.runs != 1 || q.samples != 7 || q.hold != 500*time.Millisecond || !slices.Equal(q.durations, []time.Duration{30 * time.Millisecond, 300 * time.Millisecond, time.Second}) ||
		!slices.Equal(q.versions, c.versions) || !slices.Equal(q.scenarios, allScenarios) {
		t.Errorf("--quick --samples 7: %+v", q)
	}
}
