package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/fake"
)

// refreshable is k8s at store revision 10 with the store offering 11
// (rev: its apps, nil for the installed ones).
func refreshable(apps []fake.App) []fake.Option {
	return []fake.Option{
		fake.WithSnaps(fake.Snap{Name: "k8s", Version: "1.30", Revision: "10", Apps: []fake.App{{Name: "kube-apiserver", Daemon: "simple", Enabled: true, Active: true,
			StartDuration: 5 * time.Millisecond, StopDuration: 5 * time.Millisecond}}}),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11", Version: "1.31", Apps: apps}),
	}
}

// serviceReady answers 200 while srv's k8s.kube-apiserver is active, 503
// otherwise, and records when it first answered 200.
type serviceReady struct {
	*httptest.Server
	mu    sync.Mutex
	first time.Time
}

func newServiceReady(t *testing.T, srv *fake.Server) *serviceReady {
	r := &serviceReady{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if st, ok := srv.Service("k8s", "kube-apiserver"); !ok || !st.Active {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		r.mu.Lock()
		if r.first.IsZero() {
			r.first = time.Now()
		}
		r.mu.Unlock()
	}))
	t.Cleanup(r.Close)
	return r
}

func TestRefreshUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--bootstrap", "--channel", "beta", "k8s"},
		{"--bootstrap", "--refresh", "k8s", "etcd"},
		{"--bootstrap", "--refresh", "k8s.kubelet"},
		{"--bootstrap", "--refresh", "--reload", "k8s"},
		{"--bootstrap", "--refresh", "--refresh-file", "/tmp/k8s.snap", "--channel", "beta", "k8s"},
	} {
		var out, stderr bytes.Buffer
		if code := run(context.Background(), args, &out, &stderr); code != exitUsage {
			t.Errorf("%q: exit %d, want %d (%s)", args, code, exitUsage, stderr.String())
		}
	}
}

func TestRefreshBootstrap(t *testing.T) {
	srv := fake.NewServer(t, append([]fake.Option{fake.AllowNonRoot()}, refreshable(nil)...)...)
	for _, want := range []string{"done: change 1 Done\n", "done: no updates available; nothing was refreshed\n"} {
		var out, stderr bytes.Buffer
		if code := run(context.Background(), []string{"--bootstrap", "--socket", srv.SocketPath(), "--refresh", "k8s"}, &out, &stderr); code != exitOK || stderr.String() != want {
			t.Fatalf("exit %d, stderr %q, want %q", code, stderr.String(), want)
		}
	}
	if cs := srv.Changes(); len(cs) != 1 || cs[0].Kind != "refresh-snap" {
		t.Fatalf("changes %+v", cs)
	}
}

// TestThreeMachinesRefresh: three machines run the same refresh rollout at
// once against a real etcd with --max 1. Judged from each fake snapd's
// records: one refresh at a time, each machine's later than the previous
// machine's service answered ready (plus --settle). Then a revision whose
// service dies after it starts: the first machine's refresh is not ready,
// the key halts, and the other two refresh nothing.
func TestThreeMachinesRefresh(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := etcdtest.StartProcesses(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	eps := strings.Join(cl.Endpoints(), ",")

	type machine struct {
		srv           *fake.Server
		ready         *serviceReady
		out, stderr   bytes.Buffer
		code          int
		spawn, readyC time.Time
	}
	rollout := func(t *testing.T, prefix string, apps []fake.App, readyTimeout string, extra ...string) []*machine {
		ms := []*machine{{}, {}, {}}
		var wg sync.WaitGroup
		for i, m := range ms {
			m.srv = fake.NewServer(t, append([]fake.Option{fake.AllowNonRoot()}, refreshable(apps)...)...)
			m.ready = newServiceReady(t, m.srv)
			wg.Add(1)
			go func() {
				defer wg.Done()
				m.code = run(ctx, append([]string{"--endpoints", eps, "--prefix", prefix, "--max", "1", "--ttl", "3s",
					"--socket", m.srv.SocketPath(), "--ready-url", m.ready.URL + "/readyz", "--ready-interval", "10ms",
					"--ready-timeout", readyTimeout, "--settle", "50ms", "--holder", []string{"node-a", "node-b", "node-c"}[i], "--json",
					"--refresh", "k8s"}, extra...), &m.out, &m.stderr)
			}()
		}
		wg.Wait()
		return ms
	}

	t.Run("one at a time", func(t *testing.T) {
		ms := rollout(t, "/refresh-ok/", nil, "5s")
		for i, m := range ms {
			rs := m.srv.Changes()
			if m.code != exitOK || len(rs) != 1 || rs[0].Kind != "refresh-snap" || rs[0].Status != "Done" {
				t.Fatalf("machine %d: exit %d, changes %+v\n%s%s", i, m.code, rs, m.out.String(), m.stderr.String())
			}
			m.spawn, m.readyC = rs[0].SpawnTime, rs[0].ReadyTime
		}
		slices.SortFunc(ms, func(a, b *machine) int { return a.spawn.Compare(b.spawn) })
		for i := 1; i < len(ms); i++ {
			prev, next := ms[i-1], ms[i]
			prev.ready.mu.Lock()
			readyAt := prev.ready.first
			prev.ready.mu.Unlock()
			if next.spawn.Before(prev.readyC) || readyAt.IsZero() || !next.spawn.After(readyAt.Add(50*time.Millisecond)) {
				t.Fatalf("refresh %d spawned at %v; the one before was ready (change) at %v, answered ready at %v (+50ms settle)",
					i, next.spawn, prev.readyC, readyAt)
			}
		}
	})

	t.Run("not ready halts", func(t *testing.T) {
		// A halted key holds every machine (a waiter in line, a holder
		// at its fence) until an operator resumes it: --timeout ends them.
		dies := []fake.App{{Name: "kube-apiserver", Daemon: "simple", DiesAfterStart: true, StartDuration: 5 * time.Millisecond, StopDuration: 5 * time.Millisecond}}
		ms := rollout(t, "/refresh-halt/", dies, "300ms", "--timeout", "5s")
		refreshed, haltSeen := 0, 0
		for i, m := range ms {
			if m.code != exitFailed {
				t.Fatalf("machine %d: exit %d, want %d\n%s%s", i, m.code, exitFailed, m.out.String(), m.stderr.String())
			}
			switch n := len(m.srv.Changes()); n {
			case 1:
				refreshed++
				if !strings.Contains(m.out.String(), `"event":"halted"`) {
					t.Errorf("machine %d refreshed and failed, but reported no halt:\n%s", i, m.out.String())
				}
			case 0:
				if strings.Contains(m.out.String(), "halted") {
					haltSeen++
				}
			default:
				t.Fatalf("machine %d: %d changes", i, n)
			}
		}
		if refreshed != 1 || haltSeen == 0 {
			t.Fatalf("%d machines refreshed (want 1), %d of the others met the halt (want at least 1)", refreshed, haltSeen)
		}
	})
}
