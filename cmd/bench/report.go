package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/benchkit"
)

// row is one cell of the table: a scenario (and foreign's hold) on one
// snapd version with one strategy, over its samples.
type row struct {
	Scenario string        `json:"scenario"`
	Hold     time.Duration `json:"-"`
	K        int           `json:"waiters_per_process,omitempty"`
	P        int           `json:"processes,omitempty"`
	Version  fake.Version  `json:"snapd"`
	Notices  bool          `json:"notices"`
	Strategy string        `json:"strategy"`
	Samples  int           `json:"samples"`
	// Calls and Failed are totals over the samples.
	Calls  int `json:"calls"`
	Failed int `json:"failed_calls"`
	// Makespan and Ideal (the change durations snapd must serialise
	// anyway) are medians over the samples, Ratio the median of each
	// sample's makespan over its ideal.
	Makespan time.Duration `json:"-"`
	Ideal    time.Duration `json:"-"`
	Ratio    float64       `json:"ratio_to_ideal"`
	// Requests and Changes are means per sample.
	Requests float64 `json:"requests_per_sample"`
	Changes  float64 `json:"changes_per_sample"`
	// Waited and WaitedRequests are totals over the samples.
	Waited         time.Duration   `json:"-"`
	WaitedRequests int             `json:"requests_while_waiting"`
	Wakes          []time.Duration `json:"-"`
	Errors         []string        `json:"harness_errors,omitempty"`
}

// WaitRate is snapd requests per second while calls waited, and false
// when no call waited.
func (r row) WaitRate() (float64, bool) {
	if r.Waited <= 0 {
		return 0, false
	}
	return float64(r.WaitedRequests) / r.Waited.Seconds(), true
}

// Wake returns the p-th percentile of the wake latencies.
func (r row) Wake(p float64) (time.Duration, bool) { return benchkit.Percentile(r.Wakes, p) }

// RequestsPerCall is the mean number of snapd requests per call.
func (r row) RequestsPerCall() float64 {
	return r.Requests * float64(r.Samples) / float64(r.Calls)
}

// param is what distinguishes cells of one scenario: foreign's hold.
func (r row) param() string {
	switch r.Scenario {
	case scForeign:
		return benchkit.FormatDuration(r.Hold, true)
	case scWaiters, scWaitersOwn:
		return fmt.Sprintf("K=%d P=%d", r.K, r.P)
	}
	return ""
}

// aggregate folds samples (in cell order) into rows.
func aggregate(samples []sample) []row {
	var rows []row
	var makespans, ideals []time.Duration
	var ratios []float64
	flush := func() {
		if n := len(rows); n > 0 {
			r := &rows[n-1]
			r.Makespan, _ = benchkit.Percentile(makespans, 50)
			r.Ideal, _ = benchkit.Percentile(ideals, 50)
			slices.Sort(ratios)
			r.Ratio = ratios[(len(ratios)-1)/2]
			r.Requests /= float64(r.Samples)
			r.Changes /= float64(r.Samples)
		}
		makespans, ideals, ratios = nil, nil, nil
	}
	for _, s := range samples {
		j := s.job
		if n := len(rows); n == 0 || rows[n-1].Scenario != j.scenario || rows[n-1].Hold != j.param ||
			rows[n-1].K != j.k || rows[n-1].P != j.p ||
			rows[n-1].Version != j.version || rows[n-1].Strategy != j.strategy {
			flush()
			rows = append(rows, row{Scenario: j.scenario, Hold: j.param, K: j.k, P: j.p, Version: j.version, Notices: hasNotices(j.version), Strategy: j.strategy})
		}
		r := &rows[len(rows)-1]
		if s.err != nil {
			r.Errors = append(r.Errors, s.err.Error())
		}
		m := measure(s)
		r.Samples++
		r.Calls += m.calls
		r.Failed += m.failed
		r.Requests += float64(m.requests)
		r.Changes += float64(m.changes)
		r.Waited += m.waited
		r.WaitedRequests += m.waitedReq
		r.Wakes = append(r.Wakes, m.wakes...)
		makespans = append(makespans, m.makespan)
		ideals = append(ideals, s.ideal)
		ratios = append(ratios, float64(m.makespan)/float64(s.ideal))
	}
	flush()
	return rows
}

// header says what the table measured and where its durations come from,
// in lines of at most 100 columns.
func (c config) header() []string {
	paras := []string{
		"snapsvc bench: real time, each sample on its own in-process fake snapd (github.com/snapsvc/snapsvc/fake)",
		fmt.Sprintf("services: start %v, stop %v (restart %v); foreign holds %s; bootstrap hold %v; late-socket delay %v (durations from real snapd: see cmd/bench/config.go)",
			c.start, c.stop, c.restart(), joinDurations(c.durations), c.hold, c.socketDelay),
		fmt.Sprintf("strategies: naive = one snapctl call; fixed = k8sd's RetryFor(5, 5s) around the snap command (100ms polls), pause 5s / scale %s = %v; backoff = backoff/v4 defaults around the snap command; snapsvc = the library (REST, file lock); snapsvc-snapctl = snapctl mode on the snap socket without snap-refresh-observe (blind); snapsvc-confined = REST without the state file",
			scaleString(c.scale), benchkit.FixedPauseAt(c.scale)),
		fmt.Sprintf("waiters: K callers in each of P processes restart kubelet while a foreign change holds the snap %v (waiters-own: a service of each process's own, so nothing merges); processes are Clients with lock registries of their own sharing one lock directory", c.waitersHold),
		fmt.Sprintf("snapd: 2.57.6 has no notices (snapsvc polls%s); 2.62+ has the notices long-poll", map[bool]string{true: " and watches the state file", false: ", state file not watched"}[c.stateFile]),
		fmt.Sprintf("samples: %d per cell (foreign, late-socket, uncontended), %d runs per cell (bootstrap, storm, waiters); makespan = median; wake = snap free (or socket up) -> our accepted request's arrival", c.samples, c.runs),
	}
	var lines []string
	for _, p := range paras {
		lines = append(lines, wrap(p, tableWidth, "  ")...)
	}
	return lines
}

// tableWidth is the most columns a line of the default output takes.
const tableWidth = 100

// wrap breaks s into lines of at most width columns, the lines after the
// first indented by indent.
func wrap(s string, width int, indent string) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(w) > width:
			lines = append(lines, line)
			line = indent + w
		default:
			line += " " + w
		}
	}
	return append(lines, line)
}

// The columns: every one (--wide, --markdown), and the two tables of the
// default output, each under 100 columns: what happened to the calls, and
// what they asked of snapd.
var (
	columns         = []string{"scenario", "hold", "snapd", "strategy", "n", "calls", "makespan", "xideal", "failed", "reqs", "reqs/call", "req/s waiting", "changes", "wake p50", "wake p99"}
	outcomeColumns  = []string{"scenario", "snapd", "strategy", "calls", "makespan", "xideal", "failed", "wake p50", "wake p99"}
	requestsColumns = []string{"scenario", "snapd", "strategy", "n", "reqs", "reqs/call", "req/s waiting", "changes"}
)

func (r row) cells() []string {
	rate, ok := r.WaitRate()
	rateS := "–"
	if ok {
		rateS = fmt.Sprintf("%.1f", rate)
	}
	p50, ok50 := r.Wake(50)
	p99, ok99 := r.Wake(99)
	return []string{
		r.Scenario, r.param(), string(r.Version), r.Strategy,
		fmt.Sprint(r.Samples), fmt.Sprint(r.Calls),
		benchkit.FormatDuration(r.Makespan, true), fmt.Sprintf("%.2f", r.Ratio),
		fmt.Sprint(r.Failed), fmt.Sprintf("%.1f", r.Requests), fmt.Sprintf("%.1f", r.RequestsPerCall()), rateS,
		fmt.Sprintf("%.1f", r.Changes), benchkit.FormatDuration(p50, ok50), benchkit.FormatDuration(p99, ok99),
	}
}

// pick returns the cells of r under names, the scenario and its hold
// (or K and P) in one cell.
func (r row) pick(names []string) []string {
	all := r.cells()
	out := make([]string, 0, len(names))
	for _, n := range names {
		i := slices.Index(columns, n)
		cell := all[i]
		if n == "scenario" && r.param() != "" {
			cell += " " + r.param()
		}
		out = append(out, cell)
	}
	return out
}

// writeTable prints the rows as aligned text, or markdown: by default two
// tables that fit 100 columns, with --wide (or --markdown) one with every
// column.
func (c config) writeTable(w io.Writer, rows []row) error {
	for _, l := range c.header() {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintln(w)
	switch {
	case c.markdown:
		fmt.Fprintf(w, "| %s |\n", strings.Join(columns, " | "))
		fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(columns)))
		for _, r := range rows {
			fmt.Fprintf(w, "| %s |\n", strings.Join(r.cells(), " | "))
		}
	case c.wide:
		if err := aligned(w, columns, rows, row.cells); err != nil {
			return err
		}
	default:
		if err := aligned(w, outcomeColumns, rows, func(r row) []string { return r.pick(outcomeColumns) }); err != nil {
			return err
		}
		fmt.Fprintln(w)
		if err := aligned(w, requestsColumns, rows, func(r row) []string { return r.pick(requestsColumns) }); err != nil {
			return err
		}
	}
	if err := c.writeWaiters(w, rows); err != nil {
		return err
	}
	for _, r := range rows {
		for _, e := range r.Errors {
			fmt.Fprintf(w, "harness error (%s %s %s %s): %s\n", r.Scenario, r.param(), r.Version, r.Strategy, e)
		}
	}
	fmt.Fprintln(w)
	for _, t := range checkTargets(rows) {
		for _, l := range wrap(t.String(), tableWidth, "  ") {
			fmt.Fprintln(w, l)
		}
	}
	return nil
}

// modeLabel names a snapsvc strategy on a snapd version as issue 35's
// table does: how it acts, and how it sees a blocker end.
func (c config) modeLabel(strategy string, v fake.Version) string {
	how := "REST"
	seen := "polling"
	switch {
	case strategy == benchkit.SnapsvcSnapctl:
		how, seen = "snapctl", "blind"
	case strategy == benchkit.SnapsvcConfined:
		how = "REST confined"
		if !hasNotices(v) {
			seen = "no state file"
		}
	case !hasNotices(v) && c.stateFile:
		seen = "state file"
	}
	if hasNotices(v) && strategy != benchkit.SnapsvcSnapctl {
		seen = "notices"
	}
	return fmt.Sprintf("%s %s (%s)", how, v, seen)
}

// writeWaiters prints the waiters scenarios' load by processes: for each
// scenario and K, a row per mode with snapd's requests per second while
// the blocker held at each P, and the last P's over the first's (issue
// 35's bound is 1.25).
func (c config) writeWaiters(w io.Writer, rows []row) error {
	order, cells := waitersCells(rows)
	if len(order) == 0 {
		return nil
	}
	var ks, ps []int
	for _, k := range order {
		mk, mp := axes(cells[k])
		for _, v := range mk {
			if !slices.Contains(ks, v) {
				ks = append(ks, v)
			}
		}
		for _, v := range mp {
			if !slices.Contains(ps, v) {
				ps = append(ps, v)
			}
		}
	}
	slices.Sort(ks)
	slices.Sort(ps)
	names := []string{"scenario", "K", "mode"}
	for _, p := range ps {
		names = append(names, fmt.Sprintf("P=%d", p))
	}
	names = append(names, fmt.Sprintf("P=%d/P=%d", ps[len(ps)-1], ps[0]))
	var lines [][]string
	for _, sc := range []string{scWaiters, scWaitersOwn} {
		for _, kk := range ks {
			for _, k := range order {
				if k.scenario != sc {
					continue
				}
				cell := cells[k]
				if _, ok := cell[[2]int{kk, ps[0]}]; !ok {
					continue
				}
				line := []string{sc, fmt.Sprint(kk), c.modeLabel(k.strategy, fake.Version(k.version))}
				for _, p := range ps {
					v, ok := cell[[2]int{kk, p}]
					line = append(line, map[bool]string{true: fmt.Sprintf("%.1f", v), false: "–"}[ok])
				}
				lo, okLo := cell[[2]int{kk, ps[0]}]
				hi, okHi := cell[[2]int{kk, ps[len(ps)-1]}]
				ratio := "–"
				if okLo && okHi && lo > 0 {
					ratio = fmt.Sprintf("%.2f", hi/lo)
				}
				lines = append(lines, append(line, ratio))
			}
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "waiters: snapd requests/s while the blocker held, by processes P (K callers in each)")
	if c.markdown {
		fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(names, " | "), strings.Repeat("---|", len(names)))
		for _, l := range lines {
			fmt.Fprintf(w, "| %s |\n", strings.Join(l, " | "))
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(names, "\t")+"\t")
	for _, l := range lines {
		fmt.Fprintln(tw, strings.Join(l, "\t")+"\t")
	}
	return tw.Flush()
}

// aligned prints one table: names, then each row's cells, right-aligned.
func aligned(w io.Writer, names []string, rows []row, cells func(row) []string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(names, "\t")+"\t")
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(cells(r), "\t")+"\t")
	}
	return tw.Flush()
}

// jsonRow is a row with durations in milliseconds.
type jsonRow struct {
	row
	HoldMs      float64   `json:"hold_ms,omitempty"`
	MakespanMs  float64   `json:"makespan_p50_ms"`
	IdealMs     float64   `json:"ideal_ms"`
	WaitedMs    float64   `json:"waited_ms"`
	WaitRate    *float64  `json:"requests_per_second_waiting"`
	ReqsPerCall float64   `json:"requests_per_call"`
	WakeP50Ms   *float64  `json:"wake_p50_ms"`
	WakeP99Ms   *float64  `json:"wake_p99_ms"`
	WakesMs     []float64 `json:"wakes_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// writeJSON prints one JSON document: the configuration, the rows and the
// targets.
func (c config) writeJSON(w io.Writer, rows []row) error {
	doc := struct {
		Header  []string  `json:"about"`
		Scale   float64   `json:"fixed_scale"`
		Rows    []jsonRow `json:"rows"`
		Targets []target  `json:"targets"`
	}{Header: c.header(), Scale: c.scale, Targets: checkTargets(rows)}
	for _, r := range rows {
		jr := jsonRow{row: r, HoldMs: ms(r.Hold), MakespanMs: ms(r.Makespan), IdealMs: ms(r.Ideal), WaitedMs: ms(r.Waited), ReqsPerCall: r.RequestsPerCall()}
		if rate, ok := r.WaitRate(); ok {
			jr.WaitRate = &rate
		}
		if p, ok := r.Wake(50); ok {
			v := ms(p)
			jr.WakeP50Ms = &v
		}
		if p, ok := r.Wake(99); ok {
			v := ms(p)
			jr.WakeP99Ms = &v
		}
		jr.WakesMs = make([]float64, len(r.Wakes))
		for i, d := range r.Wakes {
			jr.WakesMs[i] = ms(d)
		}
		doc.Rows = append(doc.Rows, jr)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}
