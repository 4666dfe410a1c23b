//go:build realsnapd

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/snapsvc/snapsvc/testsupport/benchkit"
)

// TestBenchRealSnapd runs bench's foreign and bootstrap scenarios (go run
// ./cmd/bench) against the real snapd, with the same strategies
// (testsupport/benchkit: naive snapctl, k8sd's fixed loop at its real 5 s
// pause, backoff/v4's defaults, snapsvc), and prints the figures in the
// test log. snapd has no request log, so the wake latency is read from
// snapd's own timestamps: from the blocking change's ready-time to the
// spawn-time of the change the call then made.
//
// It asserts what must hold whatever the timing: snapsvc gets every call
// done, its change spawns after the blocker is ready, and a naive
// snapctl call during a foreign change is refused.
func TestBenchRealSnapd(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() {
		w.waitIdle(t)
		w.waitChange(t, w.setConf(t, map[string]any{"hook-sleep": 0}), time.Minute)
		w.ensureBaseline(t)
	})
	target := benchkit.Target{Socket: e.Socket, SnapSocket: e.SnapSocket, Cookie: e.cookie(t), LockDir: t.TempDir(), Snap: "svcdemo"}
	notices := "no notices: snapsvc polls"
	if versionAtLeast(e.Version, 2, 62) {
		notices = "notices long-poll"
	}
	// snapd's state file as the host sees it, watched by snapsvc as it
	// watches /var/lib/snapd/state.json by default.
	if state := filepath.Join("/proc", e.Leader, "root/var/lib/snapd/state.json"); e.Leader != "" {
		if _, err := os.Stat(state); err == nil {
			target.StateFile = state
			notices += ", state file watched"
		}
	}
	var rows []benchRow
	t.Run("foreign", func(t *testing.T) { rows = append(rows, benchForeign(t, e, w, target)...) })
	t.Run("bootstrap", func(t *testing.T) { rows = append(rows, benchBootstrap(t, e, w, target)...) })
	t.Run("insnap", func(t *testing.T) { rows = append(rows, benchInSnap(t, e, w)...) })

	var b strings.Builder
	fmt.Fprintf(&b, "real snapd %s (%s); fixed = k8sd's RetryFor(5, %v), unscaled\n", e.Version, notices, benchkit.FixedPause)
	fmt.Fprintf(&b, "snapsvc-snapctl: snapctl mode from the host with svcdemo's cookie (it cannot read changes on the snap socket: blind); snapsvc-confined: REST, no state file%s\n",
		map[bool]string{true: "", false: " (no notices on this snapd: blind)"}[versionAtLeast(e.Version, 2, 62)])
	fmt.Fprintf(&b, "insnap: snapsvc-helper inside svcdemo (snapctl mode; snap-refresh-observe %s)\n",
		map[bool]string{true: "connected: it lists the blocker and follows its notices", false: "absent on this snapd: blind"}[os.Getenv("SNAPSVC_REALSNAPD_OBSERVE") == "1"])
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tstrategy\tn\tcalls\tfailed\tmakespan p50\tx ideal\twake p50\twake max\tattempts/call")
	for _, r := range rows {
		p50, ok50 := benchkit.Percentile(r.wakes, 50)
		pmax, okmax := benchkit.Percentile(r.wakes, 100)
		span, _ := benchkit.Percentile(r.makespans, 50)
		ratio := "–"
		if r.ratio > 0 {
			ratio = fmt.Sprintf("%.2f", r.ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%.1f\n", r.scenario, r.strategy, r.samples, r.calls, r.failed,
			benchkit.FormatDuration(span, true), ratio, benchkit.FormatDuration(p50, ok50), benchkit.FormatDuration(pmax, okmax),
			float64(r.attempts)/float64(max(r.calls, 1)))
	}
	tw.Flush()
	t.Logf("benchmark against the real snapd:\n%s", b.String())
}

// benchRow is one line of the real-snapd table.
type benchRow struct {
	scenario, strategy string
	samples, calls     int
	failed, attempts   int
	makespans, wakes   []time.Duration
	ratio              float64 // bootstrap: median makespan over the ideal
}

func (r *benchRow) add(outs []benchkit.Outcome) {
	r.calls += len(outs)
	for _, o := range outs {
		r.attempts += o.Attempts
		if o.Failed() {
			r.failed++
		}
	}
}

// lag is how long after blocker was ready change id spawned.
func lag(t *testing.T, w *wire, blocker change, id string) time.Duration {
	t.Helper()
	return w.change(t, id).SpawnTime.Sub(blocker.ReadyTime)
}

// benchForeign restarts svcdemo.alpha while a foreign change holds the
// snap: a configure-snap change (the configure hook sleeping 1 s) and a
// service-control change (gamma's slow stop). The call starts at a
// moment spread over the samples within the blocker's first 100 ms, so
// that a 100 ms poll's phase is not in step with the blocker's end.
func benchForeign(t *testing.T, e env, w *wire, target benchkit.Target) []benchRow {
	type blocker struct {
		name  string
		start func() string // makes the blocking change, returns its id
		after func()        // undoes it
	}
	blockers := []blocker{
		{"configure-snap (hook 1s)", func() string { return w.setConf(t, map[string]any{"hook-sleep": 1}) }, func() {}},
		{fmt.Sprintf("service-control (stop %v)", e.Slow), func() string {
			r := w.postApps(t, "stop", []string{"svcdemo.gamma"}, nil)
			if r.StatusCode != 202 {
				t.Fatalf("stop gamma: %s", r.Raw)
			}
			return r.Change
		}, func() { w.serviceOp(t, "start", []string{"svcdemo.gamma"}, nil, "Done") }},
	}
	samples := map[string]int{benchkit.Snapsvc: 5, benchkit.Naive: 1, benchkit.Fixed: 1, benchkit.Backoff: 1,
		benchkit.SnapsvcSnapctl: 10, benchkit.SnapsvcConfined: 5}
	restart := benchkit.Call{Action: "restart", Names: []string{"svcdemo.alpha"}}
	var rows []benchRow
	for _, b := range blockers {
		for _, name := range benchkit.Names {
			st, err := benchkit.New(name, target, benchkit.Config{Scale: 1})
			if err != nil {
				t.Fatal(err)
			}
			r := benchRow{scenario: "foreign " + b.name, strategy: name}
			n := samples[name]
			for i := range n {
				w.waitIdle(t)
				id := b.start()
				// Not synchronisation: when, in the blocker's life, the
				// caller arrives.
				time.Sleep(100 * time.Millisecond * time.Duration(2*i+1) / time.Duration(2*n))
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				outs := st.Sequence(ctx, restart)
				cancel()
				blk := w.waitChange(t, id, 2*time.Minute)
				b.after()
				o := outs[0]
				r.samples++
				r.add(outs)
				r.makespans = append(r.makespans, o.End.Sub(o.Start))
				own := o.ChangeID
				if own == "" && !o.Failed() && name != benchkit.Naive {
					own = firstServiceChangeAfter(t, w, blk.ID) // snapctl names no change
				}
				if !o.Failed() && own != "" && o.Conflicts > 0 {
					r.wakes = append(r.wakes, lag(t, w, blk, own))
				}
				switch {
				case benchkit.IsSnapsvc(name) && (o.Failed() || o.Conflicts < 1):
					t.Errorf("%s: %s %+v: want done after a conflict", b.name, name, o)
				case benchkit.IsSnapsvc(name) && lag(t, w, blk, own) < 0:
					t.Errorf("%s: %s's change %s spawned before blocker %s was ready", b.name, name, own, blk.ID)
				case name == benchkit.Naive && (!o.Failed() || o.Conflicts != 1):
					t.Errorf("%s: naive snapctl during change %s: %+v, want refused", b.name, blk.ID, o)
				}
			}
			st.Close()
			rows = append(rows, r)
		}
	}
	return rows
}

// benchBootstrap is bench's bootstrap at svcdemo's size: a hook starts
// alpha and beta (stopped and disabled first) one call each while a
// controller restarts alpha 5 times and a configure-snap change (the hook
// sleeping 2 s) holds the snap. The ideal is the sum of the durations of
// the changes snapd had to run anyway: the configure change and the
// change that did each call.
func benchBootstrap(t *testing.T, e env, w *wire, target benchkit.Target) []benchRow {
	runs := map[string]int{benchkit.Snapsvc: 3, benchkit.Naive: 1, benchkit.Fixed: 1, benchkit.Backoff: 1,
		benchkit.SnapsvcSnapctl: 1, benchkit.SnapsvcConfined: 1}
	hookCalls := []benchkit.Call{
		{Action: "start", Names: []string{"svcdemo.alpha"}, Enable: true},
		{Action: "start", Names: []string{"svcdemo.beta"}, Enable: true},
	}
	const restarts = 5
	var rows []benchRow
	for _, name := range benchkit.Names {
		r := benchRow{scenario: "bootstrap (2 starts, 5 restarts, 2s configure)", strategy: name}
		var ratios []float64
		for range runs[name] {
			w.waitIdle(t)
			w.serviceOp(t, "stop", []string{"svcdemo.alpha", "svcdemo.beta"}, map[string]any{"disable": true}, "Done")
			hook, err := benchkit.New(name, target, benchkit.Config{Scale: 1})
			if err != nil {
				t.Fatal(err)
			}
			ctl, err := benchkit.New(name, target, benchkit.Config{Scale: 1})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			cfg := w.setConf(t, map[string]any{"hook-sleep": 2})
			t0 := time.Now()
			hookDone := make(chan []benchkit.Outcome, 1)
			go func() { hookDone <- hook.Sequence(ctx, hookCalls...) }()
			var outs []benchkit.Outcome
			for range restarts {
				outs = append(outs, ctl.Sequence(ctx, benchkit.Call{Action: "restart", Names: []string{"svcdemo.alpha"}})...)
			}
			outs = append(<-hookDone, outs...)
			cancel()
			hook.Close()
			ctl.Close()
			blk := w.waitChange(t, cfg, time.Minute)
			end := t0
			ideal := blk.ReadyTime.Sub(blk.SpawnTime)
			for _, o := range outs {
				if o.End.After(end) {
					end = o.End
				}
				if !o.Failed() && o.ChangeID != "" && !o.Shared {
					c := w.change(t, o.ChangeID)
					ideal += c.ReadyTime.Sub(c.SpawnTime)
				}
				if benchkit.IsSnapsvc(name) && o.Failed() {
					t.Errorf("bootstrap: snapsvc failed %s: %v", o.Call, o.Err)
				}
			}
			r.samples++
			r.add(outs)
			r.makespans = append(r.makespans, end.Sub(t0))
			ratios = append(ratios, float64(end.Sub(t0))/float64(ideal))
			t.Logf("bootstrap %s: makespan %v, ideal %v (configure change %v)", name, end.Sub(t0).Round(time.Millisecond), ideal.Round(time.Millisecond), blk.ReadyTime.Sub(blk.SpawnTime).Round(time.Millisecond))
		}
		if len(ratios) > 0 {
			slices.Sort(ratios)
			r.ratio = ratios[(len(ratios)-1)/2]
		}
		rows = append(rows, r)
	}
	return rows
}

// firstServiceChangeAfter returns the first service-control change made
// after change id (the call's own, where its answer named none: snapctl).
func firstServiceChangeAfter(t *testing.T, w *wire, id string) string {
	t.Helper()
	var all []change
	decode(t, w.do(t, "GET", "/v2/changes?select=all", nil), &all)
	own := ""
	for _, c := range all {
		if c.Kind == "service-control" && lessChangeID(id, c.ID) && (own == "" || lessChangeID(c.ID, own)) {
			own = c.ID
		}
	}
	if own == "" {
		t.Fatalf("no service-control change after %s", id)
	}
	return own
}

// benchInSnap is foreign's configure-hook blocker (1 s) met by snapsvc
// inside the snap (snapsvc-helper, integration/insnap, in snapctl mode as
// any process of a snap runs it): 10 samples, the helper started at a
// moment spread over the blocker's first 300 ms. The wake is from the
// blocker's ready-time to the spawn-time of the helper's change. The
// helper's own start (snap run, snap-confine) is part of its makespan,
// not of the wake.
func benchInSnap(t *testing.T, e env, w *wire) []benchRow {
	const n = 10
	r := benchRow{scenario: "insnap configure-snap (hook 1s)", strategy: "snapsvc in snap"}
	for i := range n {
		w.waitIdle(t)
		id := w.setConf(t, map[string]any{"hook-sleep": 1})
		// Not synchronisation: when, in the blocker's life, the helper
		// starts.
		time.Sleep(300 * time.Millisecond * time.Duration(2*i+1) / time.Duration(2*n))
		start := time.Now()
		out, err := e.helper(t, "restart", "svcdemo.alpha")
		end := time.Now()
		blk := w.waitChange(t, id, 2*time.Minute)
		r.samples++
		r.calls++
		r.makespans = append(r.makespans, end.Sub(start))
		if err != nil || out.Result == nil {
			r.failed++
			t.Errorf("helper restart during configure change %s: %v: %+v", id, err, out)
			continue
		}
		r.attempts += out.Result.Attempts
		if out.Result.Conflicts < 1 {
			t.Logf("sample %d: the helper met no conflict (it started after the hook): %+v", i, out.Result)
			continue
		}
		own := firstServiceChangeAfter(t, w, blk.ID)
		l := lag(t, w, blk, own)
		if l < 0 {
			t.Errorf("helper's change %s spawned before blocker %s was ready", own, blk.ID)
		}
		r.wakes = append(r.wakes, l)
	}
	w.waitChange(t, w.setConf(t, map[string]any{"hook-sleep": 0}), time.Minute)
	return []benchRow{r}
}
