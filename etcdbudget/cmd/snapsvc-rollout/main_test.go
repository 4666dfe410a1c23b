package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/snapsvc/snapsvc/cmd/clistyle/clistyletest"
	"github.com/snapsvc/snapsvc/etcdbudget/cmd/internal/demo"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/fake"
)

// buildFirst builds etcd's member binary before any test starts a
// cluster under a time bound (a cold build cache takes minutes), and only
// in the test binary's own run, not when a script runs it as a command.
type buildFirst struct{ m *testing.M }

func (b buildFirst) Run() int {
	etcdtest.BuildMember()
	return b.m.Run()
}

// TestMain lets the test binary act as the snapsvc-rollout and the
// rollout-demo commands inside scripts.
func TestMain(m *testing.M) {
	testscript.Main(buildFirst{m}, map[string]func(){
		"snapsvc-rollout": func() { os.Exit(realMain()) },
		"rollout-demo":    func() { os.Exit(demo.Main()) },
	})
}

// TestScripts runs testdata/script/*.txtar. Each script has a fake snapd
// with the k8s snap at $FAKE_SOCKET, and an environment without etcdctl's
// variables.
func TestScripts(t *testing.T) {
	testscript.Run(t, testscript.Params{
		Dir:                 "testdata/script",
		RequireExplicitExec: true,
		Setup: func(e *testscript.Env) error {
			srv, err := fake.New(k8s(), fake.AllowNonRoot())
			if err != nil {
				return err
			}
			e.Defer(func() { srv.Close() })
			e.Setenv("FAKE_SOCKET", srv.SocketPath())
			// The member binary TestMain built: a script's rollout-demo
			// must not build it again (the script's HOME and TMPDIR are
			// its own, so it would, from a cold cache, inside a timed
			// wait: issue 36).
			bin, err := etcdtest.MemberBinary()
			if err != nil {
				return err
			}
			e.Setenv("ETCDTEST_MEMBER_BIN", bin)
			// rollout-demo runs the member built above, unless a script
			// names an installed etcd (SNAPSVC_ETCD_SERVER: Debian's,
			// from .ci/etcd-server).
			e.Setenv("ROLLOUT_DEMO_ETCD", "build")
			e.Setenv("SNAPSVC_ETCD_SERVER", os.Getenv("SNAPSVC_ETCD_SERVER"))
			return nil
		},
		Condition: func(cond string) (bool, error) {
			if cond == "etcd-server" {
				return os.Getenv("SNAPSVC_ETCD_SERVER") != "", nil
			}
			return false, fmt.Errorf("unknown condition %q", cond)
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"exits":      clistyletest.Exits,
			"await-file": cmdAwaitFile,
			"source-env": cmdSourceEnv,
		},
	})
}

// awaitTimeout bounds await-file: a safety net against a hang, never a
// synchronisation (the member binary is built before the scripts run).
const awaitTimeout = 2 * time.Minute

// await-file FILE: wait until FILE exists (a background command writes it
// by renaming it into place, whole).
func cmdAwaitFile(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: await-file FILE")
	}
	path := ts.MkAbs(args[0])
	deadline := time.After(awaitTimeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		select {
		case <-deadline:
			ts.Fatalf("%s did not appear within %s", path, awaitTimeout)
		case <-time.After(20 * time.Millisecond): // polling the file system for the file
		}
	}
}

// source-env FILE: set the variables of FILE's "export NAME=VALUE" lines.
func cmdSourceEnv(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 1 {
		ts.Fatalf("usage: source-env FILE")
	}
	for _, line := range strings.Split(ts.ReadFile(args[0]), "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || !strings.HasPrefix(line, "export ") {
			ts.Fatalf("%s: not an export line: %q", args[0], line)
		}
		ts.Setenv(name, value)
	}
}

func k8s() fake.Option {
	return fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kube-apiserver", Daemon: "simple", Enabled: true, Active: true,
		StartDuration: 5 * time.Millisecond, StopDuration: 5 * time.Millisecond}}})
}

// readyServer answers 200 and records when it was first asked after each
// change of srv became ready.
type readyServer struct {
	*httptest.Server
	mu    sync.Mutex
	first time.Time
}

func newReadyServer(t *testing.T) *readyServer {
	r := &readyServer{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r.mu.Lock()
		if r.first.IsZero() {
			r.first = time.Now()
		}
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	return r
}

func TestTwoMachinesRollOutOneAtATime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := etcdtest.StartProcesses(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	eps := strings.Join(cl.Endpoints(), ",")
	t.Run("one key", func(t *testing.T) {
		twoMachines(t, ctx, eps, []string{"--budget-key", "k8s.kube-apiserver", "k8s.kube-apiserver"}, []string{"--budget-key", "k8s.kube-apiserver", "k8s.kube-apiserver"})
	})
	// Without --key: a whole-snap restart on one machine and a restart of
	// one of its services on the other take the same slot (issue 26,
	// defect 4; before, "k8s" and "k8s.kube-apiserver" were two keys).
	t.Run("snap and service", func(t *testing.T) {
		twoMachines(t, ctx, eps, []string{"k8s"}, []string{"k8s.kube-apiserver"})
	})
}

// twoMachines runs two rollouts with args (after the common flags) at
// once, each on its own fake snapd and readiness endpoint, and checks
// they ran one after the other.
func twoMachines(t *testing.T, ctx context.Context, eps string, args ...[]string) {
	type machine struct {
		srv    *fake.Server
		ready  *readyServer
		out    bytes.Buffer
		stderr bytes.Buffer
		code   int
	}
	ms := []*machine{{}, {}}
	var wg sync.WaitGroup
	for i, m := range ms {
		m.srv = fake.NewServer(t, fake.AllowNonRoot(), k8s())
		m.ready = newReadyServer(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.code = run(ctx, append([]string{"--endpoints", eps, "--max", "1", "--ttl", "3s",
				"--socket", m.srv.SocketPath(), "--ready-url", m.ready.URL + "/readyz", "--ready-interval", "10ms",
				"--settle", "50ms", "--holder", []string{"node-a", "node-b"}[i], "--json"}, args[i]...), &m.out, &m.stderr)
		}()
	}
	wg.Wait()
	waited := 0
	for i, m := range ms {
		if m.code != exitOK {
			t.Fatalf("machine %d: exit %d\n%s%s", i, m.code, m.out.String(), m.stderr.String())
		}
		var last map[string]any
		for _, line := range strings.Split(strings.TrimSpace(m.out.String()), "\n") {
			var ev map[string]any
			if err := json.Unmarshal([]byte(line), &ev); err != nil {
				t.Fatalf("not JSON: %q", line)
			}
			// Durations are seconds in *_seconds fields, never Go's
			// strings (issue 44, item 4).
			if _, ok := ev["waited_seconds"].(float64); ev["event"] == "acquired" && !ok {
				t.Errorf("acquired event without waited_seconds: %q", line)
			}
			if _, ok := ev["held_seconds"].(float64); ev["event"] == "released" && !ok {
				t.Errorf("released event without held_seconds: %q", line)
			}
			if ev["waited"] != nil || ev["held"] != nil {
				t.Errorf("a duration as a string: %q", line)
			}
			if act, _ := ev["act"].(map[string]any); act != nil && (act["held"] != nil || act["held_seconds"] == nil) {
				t.Errorf("act without held_seconds: %q", line)
			}
			if ev["event"] == "waiting" {
				waited++
				other := []string{"node-b", "node-a"}[i]
				if hs, _ := ev["holders"].([]any); len(hs) != 1 || hs[0] != other {
					t.Errorf("machine %d waits behind %v, want %s", i, ev["holders"], other)
				}
			}
			last = ev
		}
		if _, ok := last["result"]; !ok {
			t.Fatalf("machine %d: last line %v, want the result", i, last)
		}
	}
	if waited == 0 {
		t.Fatal("neither machine waited for the other")
	}
	// Serial: the later restart's change began after the earlier
	// machine's service was seen ready (and settled).
	a, b := ms[0], ms[1]
	if a.srv.Changes()[0].SpawnTime.After(b.srv.Changes()[0].SpawnTime) {
		a, b = b, a
	}
	a.ready.mu.Lock()
	readyAt := a.ready.first
	a.ready.mu.Unlock()
	if readyAt.IsZero() || !b.srv.Changes()[0].SpawnTime.After(readyAt.Add(50*time.Millisecond)) {
		t.Fatalf("second restart at %v, first ready at %v (+50ms settle)", b.srv.Changes()[0].SpawnTime, readyAt)
	}
}

func TestBootstrapNeedsNoEtcd(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), k8s())
	var out, stderr bytes.Buffer
	if code := run(context.Background(), []string{"--bootstrap", "--socket", srv.SocketPath(), "k8s.kube-apiserver"}, &out, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if n := len(srv.Changes()); n != 1 {
		t.Fatalf("%d changes", n)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--endpoints", "http://127.0.0.1:1"},        // no names
		{"--endpoints", "http://127.0.0.1:1", "K8S"}, // bad name
		{"--endpoints", "http://127.0.0.1:1", "--max", "0", "k8s.kubelet"},
	} {
		var out, stderr bytes.Buffer
		if code := run(context.Background(), args, &out, &stderr); code != exitUsage {
			t.Errorf("%q: exit %d, want %d (%s)", args, code, exitUsage, stderr.String())
		}
	}
}

func TestUnreachableEtcdIsRetryable(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), k8s())
	var out, stderr bytes.Buffer
	code := run(context.Background(), []string{"--endpoints", "http://127.0.0.1:1", "--unreachable", "1s", "--socket", srv.SocketPath(), "k8s.kube-apiserver"}, &out, &stderr)
	if code != exitRetryable || !strings.Contains(stderr.String(), "restart budget unavailable") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("restarted without a slot: %d changes", n)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A paused key's progress line says who paused it, not "held by paused
// by …"; the rollout goes on once resumed (issue 29, item 4).
func TestPausedProgressLine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := etcdtest.StartProcesses(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	eps := strings.Join(cl.Endpoints(), ",")
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"pause", "--create", "k8s.kube-apiserver", "--endpoints", eps, "--holder", "alice@ops-1", "--reason", "disk alarm"}, &out, &errb); code != exitOK {
		t.Fatalf("pause: %d %s", code, errb.String())
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), k8s())
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		var out bytes.Buffer
		done <- run(ctx, []string{"--endpoints", eps, "--ttl", "3s", "--socket", srv.SocketPath(), "--holder", "node-a", "k8s.kube-apiserver"}, &out, &stderr)
	}()
	for !strings.Contains(stderr.String(), "waiting for") {
		select {
		case code := <-done:
			t.Fatalf("ended (%d) while paused: %s", code, stderr.String())
		case <-time.After(10 * time.Millisecond): // polling the output, not a synchronisation
		}
	}
	line := stderr.String()
	if !strings.Contains(line, "waiting for k8s.kube-apiserver: paused by alice@ops-1 since ") || !strings.Contains(line, ": disk alarm") || strings.Contains(line, "held by paused") {
		t.Fatalf("progress line %q", line)
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("restarted while paused: %d changes", n)
	}
	if code := run(ctx, []string{"resume", "k8s.kube-apiserver", "--endpoints", eps}, &out, &errb); code != exitOK {
		t.Fatalf("resume: %d %s", code, errb.String())
	}
	if code := <-done; code != exitOK || len(srv.Changes()) != 1 {
		t.Fatalf("after resume: exit %d, %d changes: %s", code, len(srv.Changes()), stderr.String())
	}
	t.Logf("%s", stderr.String())
}
