package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/fake"
)

func TestMain(m *testing.M) {
	etcdtest.MaybeRunMember()
	etcdtest.BuildMember() // before any timed cluster start
	os.Exit(m.Run())
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
		m.srv = fake.NewServer(t, k8s())
		m.ready = newReadyServer(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.code = run(ctx, []string{"--endpoints", eps, "--key", "k8s.kube-apiserver", "--max", "1", "--ttl", "3s",
				"--socket", m.srv.SocketPath(), "--ready-url", m.ready.URL + "/readyz", "--ready-interval", "10ms",
				"--settle", "50ms", "--holder", []string{"node-a", "node-b"}[i], "--json", "k8s.kube-apiserver"}, &m.out, &m.stderr)
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
	srv := fake.NewServer(t, k8s())
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
		{"k8s.kube-apiserver"},                       // no endpoints
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
	srv := fake.NewServer(t, k8s())
	var out, stderr bytes.Buffer
	code := run(context.Background(), []string{"--endpoints", "http://127.0.0.1:1", "--unreachable", "1s", "--socket", srv.SocketPath(), "k8s.kube-apiserver"}, &out, &stderr)
	if code != exitRetryable || !strings.Contains(stderr.String(), "restart budget unavailable") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("restarted without a slot: %d changes", n)
	}
}
