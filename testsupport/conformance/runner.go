package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Case is one captured request/response of cases.tsv.
type Case struct {
	Name   string
	Socket string // "snapd.socket" or "snapd-snap.socket"
	Method string
	Path   string // may hold <change-of:NAME>
	Body   string // may hold <cookie>
	Status int
	Golden []byte // the captured body
}

// LoadCases reads dir/cases.tsv and every dir/NAME.json.
func LoadCases(dir string) ([]*Case, error) {
	f, err := os.Open(filepath.Join(dir, "cases.tsv"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*Case
	sc := bufio.NewScanner(f)
	first := true
	for sc.Scan() {
		if first {
			first = false
			continue
		}
		cols := strings.Split(sc.Text(), "\t")
		if len(cols) != 6 {
			return nil, fmt.Errorf("cases.tsv: bad line %q", sc.Text())
		}
		st, err := strconv.Atoi(cols[5])
		if err != nil {
			return nil, fmt.Errorf("cases.tsv: bad status in %q", sc.Text())
		}
		c := &Case{Name: cols[0], Socket: cols[1], Method: cols[2], Path: cols[3], Body: cols[4], Status: st}
		if c.Golden, err = os.ReadFile(filepath.Join(dir, c.Name+".json")); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, sc.Err()
}

// Step is one action of a replay scenario.
type Step struct {
	Op   string // req | bg | collect | wait | inprogress | prepare | setup
	Name string // case name (or Prepare step)
}

func req(names ...string) []Step {
	var out []Step
	for _, n := range names {
		out = append(out, Step{"req", n})
	}
	return out
}

// blocking runs a request that answers only when its change is ready (snapctl
// service commands): send it, let the target's time run, collect it.
func blocking(name string) []Step { return []Step{{"bg", name}, {"collect", name}} }

func cat(parts ...[]Step) []Step {
	var out []Step
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Scenario257 replays the 2.57.6 capture in the order it was made (the
// change ids in the golden bodies give the order): REST reads, REST
// service commands with slow stops/starts and conflicts, snapctl, snapctl
// conflicts, and last the failing start (the capture added the "broken"
// app just before it).
var Scenario257 = cat(
	req("apps-snap", "apps-snap-services", "apps-one-app", "apps-two-apps", "apps-unknown-snap",
		"apps-unknown-app", "apps-all-services", "apps-bad-select"),
	req("post-stop-alpha"), []Step{{"wait", "post-stop-alpha"}}, req("change-stop-alpha-done", "apps-after-stop"),
	req("post-start-alpha"), []Step{{"wait", "post-start-alpha"}}, req("change-start-alpha-done"),
	req("post-restart-snap"), []Step{{"wait", "post-restart-snap"}}, req("change-restart-snap-done"),
	req("post-restart-reload"), []Step{{"wait", "post-restart-reload"}}, req("change-restart-reload-done"),
	req("post-stop-disable"), []Step{{"wait", "post-stop-disable"}}, req("change-stop-disable-done", "apps-after-disable"),
	req("post-start-enable"), []Step{{"wait", "post-start-enable"}}, req("change-start-enable-done"),
	req("post-bad-action", "post-no-names", "post-unknown-snap", "post-unknown-app", "post-non-service-app", "post-bad-json"),
	req("post-start-disable"), []Step{{"wait", "post-start-disable"}},
	req("change-not-found"),
	req("post-stop-gamma-slow", "change-stop-gamma-doing", "conflict-restart-alpha", "conflict-start-snap",
		"changes-in-progress", "changes-svcdemo"),
	[]Step{{"wait", "post-stop-gamma-slow"}}, req("change-stop-gamma-done"),
	req("post-start-slowstart", "change-start-slowstart-doing", "conflict-stop-beta"),
	[]Step{{"wait", "post-start-slowstart"}}, req("change-start-slowstart-done"),
	req("post-start-gamma"), []Step{{"wait", "post-start-gamma"}},
	// snapctl
	req("snapctl-services", "snapctl-services-mainsock", "snapctl-services-one"),
	blocking("snapctl-restart-beta"),
	req("changes-after-snapctl"),
	blocking("snapctl-stop-gamma-slow"),
	blocking("snapctl-restart-after-blocking-stop"),
	req("rest-restart-after-blocking-snapctl-stop"), []Step{{"wait", "rest-restart-after-blocking-snapctl-stop"}},
	req("snapctl-bad-cookie", "snapctl-no-args", "snapctl-unknown-cmd", "snapctl-other-snap-svc",
		"snapctl-get", "snapctl-set", "snapctl-get-after-set", "changes-after-snapctl2", "changes-final"),
	// snapctl conflicts while a snapctl stop blocks (gamma was stopped by
	// the previous part; the capture started it again between the parts)
	[]Step{{"setup", `POST /v2/apps {"action":"start","names":["svcdemo.gamma"]}`}},
	[]Step{{"bg", "snapctl-bg-stop-gamma-slow"}, {"inprogress", "snapctl-bg-stop-gamma-slow"}},
	req("changes-during-snapctl-stop", "snapctl-conflict-restart-alpha", "rest-conflict-during-snapctl"),
	[]Step{{"collect", "snapctl-bg-stop-gamma-slow"}},
	blocking("snapctl-start-gamma"),
	// failing start, all-or-nothing
	[]Step{{"prepare", "add-broken-app"}},
	req("post-start-broken"), []Step{{"wait", "post-start-broken"}}, req("change-start-broken-error", "apps-broken"),
)

// StepSettle is the Prepare step Settled inserts: the target lets
// SettleDelay pass (a real snapd by waiting, the fake by advancing its
// clock).
const StepSettle = "settle"

// SettleDelay is how long StepSettle lets pass. The capture read the "Doing"
// state of slow changes a second or more into them, once snapd had logged
// "Waiting for ... to stop." (about 1.03 s into a stop on 2.57.6 and
// 2.68.3); 1.5 s is what the integration suite measured as safe.
const SettleDelay = 1500 * time.Millisecond

// Settled returns scenario with a StepSettle after each step that starts a
// slow change whose "Doing" state the following cases read: the POSTs of
// post-stop-gamma-slow and post-start-slowstart, and the in-progress wait of
// snapctl-bg-stop-gamma-slow. A replay that reads at once would see no
// "Waiting for ... to stop." log yet.
func Settled(scenario []Step) []Step {
	var out []Step
	for _, st := range scenario {
		out = append(out, st)
		switch {
		case st.Op == "req" && (st.Name == "post-stop-gamma-slow" || st.Name == "post-start-slowstart"),
			st.Op == "inprogress" && st.Name == "snapctl-bg-stop-gamma-slow":
			out = append(out, Step{Op: "prepare", Name: StepSettle})
		}
	}
	return out
}

// Result is what a target answered for one case.
type Result struct {
	Case   *Case
	Status int
	Body   []byte
	Err    error
	Diffs  []string
}

type inflight struct {
	done chan struct{}
	res  *Result
}

// Replay runs scenario against target and returns the result per case name.
// It stops at the first step it cannot perform (returned as error).
func Replay(ctx context.Context, target Target, cases []*Case, scenario []Step) (map[string]*Result, error) {
	byName := map[string]*Case{}
	for _, c := range cases {
		byName[c.Name] = c
	}
	results := map[string]*Result{}
	bgs := map[string]*inflight{}
	changeOf := func(name string) (string, error) {
		r := results[name]
		if r == nil {
			return "", fmt.Errorf("no result for %s yet", name)
		}
		var env struct {
			Change string `json:"change"`
		}
		if err := json.Unmarshal(r.Body, &env); err != nil || env.Change == "" {
			return "", fmt.Errorf("%s did not answer with a change (status %d, %s)", name, r.Status, r.Body)
		}
		return env.Change, nil
	}
	send := func(c *Case) *Result {
		path := c.Path
		if i := strings.Index(path, "<change-of:"); i >= 0 {
			j := strings.Index(path[i:], ">")
			id, err := changeOf(path[i+len("<change-of:") : i+j])
			if err != nil {
				return &Result{Case: c, Err: err}
			}
			path = path[:i] + id + path[i+j+1:]
		}
		body := strings.ReplaceAll(c.Body, "<cookie>", target.Cookie())
		sock := target.MainSocket()
		if c.Socket == "snapd-snap.socket" {
			sock = target.SnapSocket()
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		st, b, err := Do(rctx, sock, c.Method, path, body)
		r := &Result{Case: c, Status: st, Body: b, Err: err}
		if err == nil {
			if st != c.Status {
				r.Diffs = append(r.Diffs, fmt.Sprintf("HTTP status %d, want %d", st, c.Status))
			}
			r.Diffs = append(r.Diffs, Compare(c.Golden, b)...)
		}
		return r
	}
	for _, s := range scenario {
		c := byName[s.Name]
		switch s.Op {
		case "req", "bg":
			if c == nil {
				return results, fmt.Errorf("scenario names unknown case %q", s.Name)
			}
			if s.Op == "req" {
				results[s.Name] = send(c)
				continue
			}
			in := &inflight{done: make(chan struct{})}
			bgs[s.Name] = in
			go func() {
				defer close(in.done)
				in.res = send(c)
			}()
		case "collect":
			in := bgs[s.Name]
			if err := target.Await(ctx, in.done); err != nil {
				return results, fmt.Errorf("waiting for %s: %w", s.Name, err)
			}
			results[s.Name] = in.res
		case "wait":
			id, err := changeOf(s.Name)
			if err != nil {
				return results, err
			}
			if err := target.WaitChangeReady(ctx, id); err != nil {
				return results, fmt.Errorf("waiting for change %s of %s: %w", id, s.Name, err)
			}
		case "inprogress":
			// wait for the change of background request s.Name; fail if
			// that request ends first
			wctx, cancel := context.WithCancel(ctx)
			if in := bgs[s.Name]; in != nil {
				go func() {
					select {
					case <-in.done:
						cancel()
					case <-wctx.Done():
					}
				}()
			}
			err := target.WaitInProgress(wctx)
			cancel()
			if err != nil {
				if in := bgs[s.Name]; in != nil && isClosed(in.done) {
					return results, fmt.Errorf("%s answered before its change was seen in progress: %d %s", s.Name, in.res.Status, in.res.Body)
				}
				return results, fmt.Errorf("waiting for a change in progress: %w", err)
			}
		case "setup":
			// a request the capture made without recording it; it must
			// succeed, and an async one is waited for
			f := strings.SplitN(s.Name, " ", 3)
			sock := target.MainSocket()
			st, b, err := Do(ctx, sock, f[0], f[1], f[2])
			if err != nil || st >= 400 {
				return results, fmt.Errorf("setup %s: %d %s %v", s.Name, st, b, err)
			}
			var env struct {
				Change string `json:"change"`
			}
			if json.Unmarshal(b, &env) == nil && env.Change != "" {
				if err := target.WaitChangeReady(ctx, env.Change); err != nil {
					return results, fmt.Errorf("setup %s: %w", s.Name, err)
				}
			}
		case "prepare":
			if err := target.Prepare(ctx, s.Name); err != nil {
				return results, fmt.Errorf("prepare %s: %w", s.Name, err)
			}
		default:
			return results, fmt.Errorf("bad step %q", s.Op)
		}
	}
	for name, in := range bgs { // never leave a request behind
		if _, ok := results[name]; !ok {
			<-in.done
		}
	}
	return results, nil
}

// Run replays the golden cases in dir against target with the scenario
// and checks each case in a subtest. notReproducible lists cases the
// target is known not to reproduce, with the reason; such a case must
// exist, and must still differ (so the list cannot silently go stale).
// Every other case of cases.tsv must be replayed and match.
func Run(t *testing.T, target Target, dir string, scenario []Step, notReproducible map[string]string) {
	t.Helper()
	cases, err := LoadCases(dir)
	if err != nil {
		t.Fatal(err)
	}
	inTSV := map[string]bool{}
	for _, c := range cases {
		inTSV[c.Name] = true
	}
	for name := range notReproducible {
		if !inTSV[name] {
			t.Errorf("notReproducible lists %q, which is not a case", name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	results, err := Replay(ctx, target, cases, scenario)
	if err != nil {
		t.Errorf("replay stopped: %v", err)
	}
	sort.Slice(cases, func(i, j int) bool { return cases[i].Name < cases[j].Name })
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			r := results[c.Name]
			reason, known := notReproducible[c.Name]
			switch {
			case r == nil && known:
				t.Logf("not replayed: %s", reason)
			case r == nil:
				t.Errorf("case %s is not in the scenario and not listed as not reproducible", c.Name)
			case r.Err != nil:
				t.Errorf("%s %s: %v", c.Method, c.Path, r.Err)
			case len(r.Diffs) > 0 && known:
				t.Logf("differs as expected (%s): %s", reason, strings.Join(r.Diffs, "; "))
			case len(r.Diffs) > 0:
				t.Errorf("%s %s (%s) differs from real snapd:\n  %s\n  got: %s", c.Method, c.Path, c.Socket, strings.Join(r.Diffs, "\n  "), r.Body)
			case known:
				t.Errorf("case %s is listed as not reproducible (%s) but now matches: remove it from the list", c.Name, reason)
			}
		})
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
