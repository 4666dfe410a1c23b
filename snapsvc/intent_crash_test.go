package snapsvc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// The crash tests: a worker process asks for an operation WithIntents
// and is killed (SIGKILL, by itself, so that the point is exact) at a
// point of the intent's life, or after a random delay; then one or two
// replaying processes start. Judged from the fake snapd's change records:
// the operations done equal the operations asked (asked: the intent was
// recorded, so its record or its change exists), none doubled, none lost.

const intentWorkerEnv = "SNAPSVC_INTENT_WORKER"

// intentWorkerSpec is what an intent worker does.
type intentWorkerSpec struct {
	Socket, SnapSocket, Cookie, LockDir string
	Role                                string // "act" or "replay"
	Action                              string
	Names                               []string
	KillAt                              string        // an intent point, "request-out" or "answered"
	KillAfter                           time.Duration // > 0: killed this long after the call began
	Boot                                string        // this boot's id, as the worker sees it ("": the machine's)
}

// noCleanup stands for a test in a worker, which ends with the process.
type noCleanup struct{}

func (noCleanup) Cleanup(func()) {}

// intentPoints are the points of an intent's life a worker is killed at:
// the library's (intent.go) and, around the request to act, its
// transport's: "request-out" before snapd reads it, "answered" after
// snapd acted and answered, before the client reads the answer.
var intentPoints = []string{"before-record", "recorded", "sending", "request-out", "answered", "accepted", "outcome", "cleared"}

// runIntentWorker runs an intent worker, if this process is one.
func runIntentWorker() bool {
	raw := os.Getenv(intentWorkerEnv)
	if raw == "" {
		return false
	}
	var spec intentWorkerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "intent worker spec:", err)
		os.Exit(2)
	}
	die := func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL); select {} }
	point := func(p string) {
		if p == spec.KillAt {
			die()
		}
	}
	snapsvc.SetIntentPoint(point)
	if spec.Boot != "" {
		snapsvc.SetBootID(noCleanup{}, spec.Boot)
	}
	p := retry.DefaultPolicy()
	p.MaxElapsedTime = 30 * time.Second
	opts := []snapsvc.Option{snapsvc.WithLockDir(spec.LockDir), snapsvc.WithPolicy(p), snapsvc.WithIntents(),
		snapsvc.WithTransport(func(rt http.RoundTripper) http.RoundTripper {
			return actPoints{rt: rt, action: spec.Action, point: point}
		})}
	if spec.Cookie != "" {
		opts = append(opts, snapsvc.WithSnapSocket(spec.SnapSocket), snapsvc.WithCookie(spec.Cookie), snapsvc.WithSnap("k8s"), snapsvc.WithMode(snapsvc.ModeSnapctl))
	} else {
		opts = append(opts, snapsvc.WithSocket(spec.Socket), snapsvc.WithMode(snapsvc.ModeREST))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := snapsvc.New(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "intent worker:", err)
		os.Exit(2)
	}
	out := map[string]any{}
	switch spec.Role {
	case "act":
		if spec.KillAfter > 0 {
			time.AfterFunc(spec.KillAfter, die)
		}
		var res *snapsvc.Result
		switch spec.Action {
		case "restart":
			res, err = c.Restart(ctx, spec.Names, snapsvc.RestartOptions{})
		case "start":
			res, err = c.Start(ctx, spec.Names, snapsvc.StartOptions{})
		case "stop":
			res, err = c.Stop(ctx, spec.Names, snapsvc.StopOptions{})
		}
		out["result"], out["error"] = res, fmt.Sprint(err)
	case "replay":
		rs, err := c.Startup(ctx)
		var ds []string
		for _, r := range rs {
			ds = append(ds, string(r.Decision)+":"+fmt.Sprint(r.Err))
		}
		out["replayed"], out["error"] = ds, fmt.Sprint(err)
	}
	c.Close()
	json.NewEncoder(os.Stdout).Encode(out)
	os.Exit(0)
	return true
}

// actPoints calls point around a request to act.
type actPoints struct {
	rt     http.RoundTripper
	action string
	point  func(string)
}

func (a actPoints) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || r.Body == nil {
		return a.rt.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req struct {
		Action string   `json:"action"`
		Args   []string `json:"args"`
	}
	_ = json.Unmarshal(body, &req)
	acting := req.Action == a.action || (len(req.Args) > 0 && req.Args[0] == a.action)
	if acting {
		a.point("request-out")
	}
	resp, err := a.rt.RoundTrip(r)
	if acting && err == nil {
		// Read the answer whole first: snapd has acted and answered.
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		if rerr == nil {
			a.point("answered")
		}
	}
	return resp, err
}

// intentCase is one crash of the test.
type intentCase struct {
	mode      string // "rest" or "snapctl"
	action    string
	slow      bool // the services take a while to start and stop: the change runs for a while
	killAt    string
	killAfter time.Duration
	replayers int
}

func (c intentCase) String() string {
	at := c.killAt
	if at == "" {
		at = c.killAfter.String()
	}
	return fmt.Sprintf("%s/%s/slow=%t/%s/replayers=%d", c.mode, c.action, c.slow, at, c.replayers)
}

// intentCases are the 200 crashes: every point, in both modes, for the
// three actions, fast and slow, and for a start and a stop in snapctl
// mode without change listing; then random delays across an
// operation's life.
func intentCases(seed uint64) []intentCase {
	var cs []intentCase
	for _, mode := range []string{"rest", "snapctl"} {
		for _, action := range []string{"restart", "start", "stop"} {
			for _, slow := range []bool{false, true} {
				for _, p := range intentPoints {
					cs = append(cs, intentCase{mode: mode, action: action, slow: slow, killAt: p, replayers: 1 + len(cs)%2})
				}
			}
		}
	}
	// Snapctl where snapd lets the snap list no change: a start or stop
	// is settled by the services' state (a restart's outcome cannot be
	// learned there: docs/intents.md).
	for _, action := range []string{"start", "stop"} {
		for _, p := range intentPoints {
			cs = append(cs, intentCase{mode: "snapctl-unlisted", action: action, killAt: p, replayers: 1 + len(cs)%2})
		}
	}
	r := rand.New(rand.NewPCG(seed, 43))
	for len(cs) < 200 {
		mode := []string{"rest", "snapctl"}[r.IntN(2)]
		action := []string{"restart", "start", "stop"}[r.IntN(3)]
		cs = append(cs, intentCase{mode: mode, action: action, slow: true, killAfter: time.Duration(r.IntN(120)) * time.Millisecond, replayers: 1 + r.IntN(2)})
	}
	return cs
}

func TestIntentExactlyOnceAcrossKills(t *testing.T) {
	if testing.Short() {
		t.Skip("200 processes killed")
	}
	cases := intentCases(1)
	var mu sync.Mutex
	tally := map[string]int{}
	for _, tc := range cases {
		t.Run(tc.String(), func(t *testing.T) {
			t.Parallel()
			asked, done, decisions := runIntentCase(t, tc)
			if done != asked {
				t.Errorf("operations asked %d, done %d (replays: %q)", asked, done, decisions)
			}
			mu.Lock()
			tally[fmt.Sprintf("asked=%d", asked)]++
			for _, d := range decisions {
				tally[strings.SplitN(d, ":", 2)[0]]++
			}
			mu.Unlock()
		})
	}
	t.Cleanup(func() { t.Logf("200 crashes: %v", tally) })
}

// runIntentCase runs one crash and its replay, and returns the
// operations asked (0 or 1), those done, and the replays' decisions.
func runIntentCase(t *testing.T, tc intentCase) (asked, done int, decisions []string) {
	t.Helper()
	d := time.Duration(0)
	if tc.slow {
		d = 40 * time.Millisecond
	}
	opts := []fake.Option{fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(d))}
	if tc.mode == "snapctl-unlisted" {
		opts = append(opts, fake.WithoutRefreshObserve())
	}
	srv, err := fake.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	names := []string{"k8s.kubelet"}
	switch tc.action {
	case "start":
		srv.SetService("k8s", "kubelet", fake.AppState{Enabled: true, Active: false})
	case "stop":
		srv.SetService("k8s", "kubelet", fake.AppState{Enabled: true, Active: true})
	}
	spec := intentWorkerSpec{Socket: srv.SocketPath(), LockDir: filepath.Join(srv.Dir(), "locks"), Action: tc.action, Names: names}
	if tc.mode != "rest" {
		spec.SnapSocket, spec.Cookie = srv.SnapSocketPath(), srv.Cookie("k8s")
	}
	before := serviceChanges(srv)
	act := spec
	act.Role, act.KillAt, act.KillAfter = "act", tc.killAt, tc.killAfter
	killed := runIntentProc(t, act)
	// Asked: the intent was recorded (its record, or the change it
	// made, remains).
	recs := snapsvc.IntentFiles(spec.LockDir)
	made := serviceChanges(srv) - before
	if len(recs) > 0 || made > 0 {
		asked = 1
	}
	if !killed {
		// Not killed (a random delay past the call's end): it finished.
		if len(recs) != 0 {
			t.Errorf("a call that returned left intents %q", recs)
		}
	}
	replay := spec
	replay.Role = "replay"
	var wg sync.WaitGroup
	outs := make([]string, tc.replayers)
	for i := range tc.replayers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = runIntentReplay(t, replay)
		}()
	}
	wg.Wait()
	for _, o := range outs {
		var r struct {
			Replayed []string `json:"replayed"`
		}
		_ = json.Unmarshal([]byte(o), &r)
		decisions = append(decisions, r.Replayed...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	if left := snapsvc.IntentFiles(spec.LockDir); len(left) != 0 {
		t.Errorf("intents left after the replay: %q (replays: %q)", left, outs)
	}
	done = serviceChanges(srv) - before
	st, _ := srv.Service("k8s", "kubelet")
	if asked == 1 && st.Active != (tc.action != "stop") {
		t.Errorf("kubelet active=%t after an asked %s", st.Active, tc.action)
	}
	return asked, done, decisions
}

// serviceChanges counts the fake's service-control changes.
func serviceChanges(srv *fake.Server) int {
	n := 0
	for _, c := range srv.Changes() {
		if c.Kind == "service-control" {
			n++
		}
	}
	return n
}

// runIntentProc runs a worker and reports whether it was killed.
func runIntentProc(t *testing.T, spec intentWorkerSpec) (killed bool) {
	t.Helper()
	raw, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), intentWorkerEnv+"="+string(raw), "GORACE=atexit_sleep_ms=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err == nil {
		return false
	}
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	t.Fatalf("worker %s: %v\n%s", spec.Role, err, stderr.String())
	return false
}

// runIntentReplay runs a replaying worker and returns what it printed.
func runIntentReplay(t *testing.T, spec intentWorkerSpec) string {
	raw, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), intentWorkerEnv+"="+string(raw), "GORACE=atexit_sleep_ms=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Errorf("replay worker: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// Intents of an earlier boot, across kills. A stop whose change snapd made
// before the reboot is done, though the reboot started the service again
// (as it would have without the crash); a stop never sent is carried out
// in this boot, once, even when its first replay is killed after deciding
// to send it.
func TestIntentOfAnEarlierBootAcrossKills(t *testing.T) {
	for _, tc := range []struct {
		killAt      string // the first process's death
		replayKill  string // the first replay's death ("": none)
		wantChanges int
		wantActive  bool
	}{
		{killAt: "answered", wantChanges: 1, wantActive: true},
		{killAt: "recorded", replayKill: "request-out", wantChanges: 1, wantActive: false},
		{killAt: "recorded", replayKill: "replay-taken", wantChanges: 1, wantActive: false},
	} {
		t.Run(tc.killAt+"/"+tc.replayKill, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
			spec := intentWorkerSpec{Socket: srv.SocketPath(), LockDir: filepath.Join(srv.Dir(), "locks"), Action: "stop", Names: []string{"k8s.kubelet"}}
			act := spec
			act.Role, act.KillAt, act.Boot = "act", tc.killAt, "boot-1"
			if !runIntentProc(t, act) {
				t.Fatal("the worker was not killed")
			}
			// The reboot starts the enabled service again.
			srv.SetService("k8s", "kubelet", fake.AppState{Enabled: true, Active: true})
			replay := spec
			replay.Role, replay.Boot = "replay", "boot-2"
			if tc.replayKill != "" {
				replay.KillAt = tc.replayKill
				if !runIntentProc(t, replay) {
					t.Fatal("the first replay was not killed")
				}
				replay.KillAt = ""
			}
			out := runIntentReplay(t, replay)
			if err := srv.WaitIdle(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			if st, _ := srv.Service("k8s", "kubelet"); st.Active != tc.wantActive {
				t.Errorf("kubelet active=%t, want %t (%s)", st.Active, tc.wantActive, out)
			}
			if n := serviceChanges(srv); n != tc.wantChanges {
				t.Errorf("%d changes, want %d (%s)", n, tc.wantChanges, out)
			}
			if left := snapsvc.IntentFiles(spec.LockDir); len(left) != 0 {
				t.Errorf("intents left: %q", left)
			}
		})
	}
}
