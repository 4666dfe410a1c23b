//go:build realsnapd

package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/testsupport/conformance"
)

// TestConformanceRealSnapd runs the fake's conformance suite
// (testsupport/conformance: golden cases captured from real snapd, replayed
// in capture order with Scenario257) against the real snapd under test, as
// a second target beside the fake. Every snapd version of the suite has
// golden cases of its own (conformanceGolden): a replay is compared with
// what the same snapd version answered.
//
// With SNAPSVC_REALSNAPD_RECORD=DIR it only records: it replays the
// scenario and writes what this snapd answered to DIR as a golden set
// (cases.tsv and NAME.json), compares nothing and passes. That is how
// testdata/conformance/2.68.3 was made.
func TestConformanceRealSnapd(t *testing.T) {
	e := loadEnv(t)
	short := strings.SplitN(e.Version, "-", 2)[0] // 2.57.6-1+deb12u1+b2 -> 2.57.6
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })

	target := &conformance.RealTarget{
		Main: e.Socket, Snap: e.SnapSocket, SnapCookie: e.cookie(t),
		PrepareFunc: func(ctx context.Context, step string) error {
			switch step {
			case "add-broken-app":
				return nil // svcdemo here has "broken" from the start (install-mode: disable)
			case conformance.StepSettle:
				select {
				case <-time.After(conformance.SettleDelay):
				case <-ctx.Done():
				}
				return ctx.Err()
			}
			return fmt.Errorf("unknown prepare step %q", step)
		},
	}
	if out := os.Getenv("SNAPSVC_REALSNAPD_RECORD"); out != "" {
		recordConformance(t, target, conformance.Settled(conformance.Scenario257), out, e.Version)
		return
	}
	g, ok := conformanceGolden[short]
	if !ok {
		t.Fatalf("no golden conformance cases for snapd %s: record them (SNAPSVC_REALSNAPD_RECORD) and add them to conformanceGolden", short)
	}
	dir := g.dir(t)
	scenario := conformance.Scenario257
	if g.scenario != nil {
		scenario = g.scenario()
	}
	t.Logf("snapd %s: replaying %s (%s)", e.Version, dir, g.source)
	conformance.Run(t, target, dir, conformance.Settled(scenario), g.notReproducible)
}

// goldenSet is where a snapd version's golden cases come from.
type goldenSet struct {
	source string
	// dir returns a directory holding cases.tsv and NAME.json for exactly
	// the cases of Scenario257.
	dir func(t *testing.T) string
	// scenario is the capture's order, if not Scenario257's.
	scenario func() []conformance.Step
	// notReproducible lists the cases this harness's real snapd answers
	// differently from the capture, with the reason.
	notReproducible map[string]string
}

var conformanceGolden = map[string]goldenSet{
	"2.57.6": {
		source: "the 2.57.6 capture (testsupport/conformance/testdata/2.57.6)",
		dir:    func(*testing.T) string { return conformance.GoldenDir("2.57.6") },
		notReproducible: map[string]string{
			"apps-snap":          extraApps,
			"apps-snap-services": extraApps,
			"apps-all-services":  extraApps,
			"snapctl-services":   extraApps,
		},
	},
	"2.68.3": {
		source: "recorded from real snapd 2.68.3 by this suite (integration/testdata/conformance/2.68.3)",
		dir:    func(*testing.T) string { return filepath.Join(integrationDir(), "testdata", "conformance", "2.68.3") },
	},
	"2.77.1": {
		source: "the Scenario257 cases of the 2.77.1 capture (testdata/snapd-golden/2.77.1)",
		dir: func(t *testing.T) string {
			return scenarioSubset(t, filepath.Join(integrationDir(), "..", "testdata", "snapd-golden", "2.77.1"), capture277Setup)
		},
		scenario: scenario277,
		notReproducible: map[string]string{
			"apps-snap": "svcdemo here has the helper app (snapsvc inside the snap); the capture's svcdemo had none",
		},
	},
}

const extraApps = "svcdemo here has the broken oneshot from the start and the helper app (snapsvc inside the snap); " +
	"the capture's svcdemo had neither at that point"

func integrationDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// scenario277 is Scenario257 in the order of the 2.77.1 capture, whose
// svcdemo had the broken app from the start: the failing start came right
// after post-start-gamma (change ids 18, 19), before the snapctl part, so
// the snapctl part's change lists hold its Error change.
func scenario277() []conformance.Step {
	var rest, failing []conformance.Step
	for i, st := range conformance.Scenario257 {
		if st.Op == "prepare" && st.Name == "add-broken-app" {
			rest, failing = conformance.Scenario257[:i], conformance.Scenario257[i+1:]
			break
		}
	}
	var out []conformance.Step
	for _, st := range rest {
		out = append(out, st)
		if st.Op == "wait" && st.Name == "post-start-gamma" {
			out = append(out, failing...)
		}
	}
	return out
}

// capture277Setup are the changes the 2.77.1 capture made before its
// scenario, which this replay does not make: a service-control change (7)
// and a second install of svcdemo from /root/snaps2 (8); the scenario's
// first change is 9 (change-stop-alpha-done). They are taken out of the
// captured change lists (GET /v2/changes?for=svcdemo) before comparing.
var capture277Setup = []string{"7", "8"}

// scenarioSubset links the cases of Scenario257 (the rows of the 2.57.6
// cases.tsv: the 2.77.1 capture repeated the 2.57.6 one and went on with
// notices, configure hooks, snapd restarts and installs, which this replay
// does not cover) from src into a temporary golden directory. Changes
// with an id in setup are dropped from the captured change lists.
func scenarioSubset(t *testing.T, src string, setup []string) string {
	t.Helper()
	want := map[string]bool{}
	for _, c := range mustLoadCases(t, conformance.GoldenDir("2.57.6")) {
		want[c.Name] = true
	}
	dst := t.TempDir()
	f, err := os.Open(filepath.Join(src, "cases.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for first := true; sc.Scan(); first = false {
		name := strings.SplitN(sc.Text(), "\t", 2)[0]
		if !first && !want[name] {
			continue
		}
		lines = append(lines, sc.Text())
		if !first {
			b, err := os.ReadFile(filepath.Join(src, name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dst, name+".json"), dropChanges(t, name, b, setup), 0o644); err != nil {
				t.Fatal(err)
			}
			delete(want, name)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(want) > 0 {
		t.Fatalf("%s lacks cases of Scenario257: %v", src, want)
	}
	if err := os.WriteFile(filepath.Join(dst, "cases.tsv"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

// dropChanges removes the changes with the given ids from a body whose
// result is a list of changes; other bodies are returned as they are.
func dropChanges(t *testing.T, name string, body []byte, ids []string) []byte {
	t.Helper()
	var env map[string]json.RawMessage
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var list []map[string]any
	if json.Unmarshal(env["result"], &list) != nil || len(list) == 0 || list[0]["kind"] == nil || list[0]["tasks"] == nil {
		return body // not a list of changes
	}
	var kept []map[string]any
	for _, c := range list {
		if !slices.Contains(ids, fmt.Sprint(c["id"])) {
			kept = append(kept, c)
		}
	}
	if len(kept) == len(list) {
		return body
	}
	res, err := json.Marshal(kept)
	if err != nil {
		t.Fatal(err)
	}
	env["result"] = res
	out, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mustLoadCases(t *testing.T, dir string) []*conformance.Case {
	t.Helper()
	cases, err := conformance.LoadCases(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cases
}

// recordConformance replays scenario against target and writes every
// answer, with the request rows of the 2.57.6 cases, to out.
func recordConformance(t *testing.T, target conformance.Target, scenario []conformance.Step, out, version string) {
	t.Helper()
	cases := mustLoadCases(t, conformance.GoldenDir("2.57.6"))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	results, err := conformance.Replay(ctx, target, cases, scenario)
	if err != nil {
		t.Fatalf("replay stopped: %v", err)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	sort.Slice(cases, func(i, j int) bool { return cases[i].Name < cases[j].Name })
	rows := []string{"name\tsocket\tmethod\tpath\trequest_body\thttp_status"}
	for _, c := range cases {
		r := results[c.Name]
		if r == nil || r.Err != nil {
			t.Fatalf("case %s: no answer recorded (%v)", c.Name, r)
		}
		rows = append(rows, strings.Join([]string{c.Name, c.Socket, c.Method, c.Path, c.Body, fmt.Sprint(r.Status)}, "\t"))
		if err := os.WriteFile(filepath.Join(out, c.Name+".json"), r.Body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(out, "cases.tsv"), []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %d answers of real snapd %s to %s (nothing compared)", len(cases), version, out)
}
