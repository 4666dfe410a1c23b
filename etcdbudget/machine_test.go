package etcdbudget_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// A simulated machine is this test binary re-executed with machineEnv set:
// its own fake snapd with a k8s-like snap, a snapsvc client with the etcd
// budget, and a readiness probe that passes ReadyDelay after the restart's
// change is done. It restarts the service Restarts times and prints one
// JSON event per line on stdout.

const machineEnv = "ETCDBUDGET_TEST_MACHINE"

type machineConfig struct {
	Name        string        `json:"name"`
	Endpoints   []string      `json:"endpoints"`
	Key         string        `json:"key"`
	Max         int           `json:"max"`
	TTL         time.Duration `json:"ttl"`
	Unreachable time.Duration `json:"unreachable"`
	Restarts    int           `json:"restarts"`
	StepDur     time.Duration `json:"step"`        // stop and start durations of the service
	ReadyDelay  time.Duration `json:"ready-delay"` // service ready this long after its change
}

// event is one line a machine prints.
type event struct {
	Machine   string    `json:"m"`
	Ev        string    `json:"ev"` // budget kinds, "probe-ready", "change", "error", "done"
	T         time.Time `json:"t"`
	Change    string    `json:"chg,omitempty"`
	Spawn     time.Time `json:"spawn,omitzero"`
	Ready     time.Time `json:"ready,omitzero"`
	Err       string    `json:"err,omitempty"`
	Retryable bool      `json:"retryable,omitempty"`
	Holders   []string  `json:"holders,omitempty"`
}

type emitter struct {
	mu   sync.Mutex
	name string
	enc  *json.Encoder
}

func (e *emitter) emit(ev event) {
	ev.Machine = e.name
	if ev.T.IsZero() {
		ev.T = time.Now()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.enc.Encode(ev)
}

func maybeRunMachine() {
	raw := os.Getenv(machineEnv)
	if raw == "" {
		return
	}
	var cfg machineConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := runMachine(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "machine", cfg.Name+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runMachine(cfg machineConfig) error {
	out := &emitter{name: cfg.Name, enc: json.NewEncoder(os.Stdout)}
	app := fake.App{Name: "kube-apiserver", Daemon: "simple", Enabled: true, Active: true, StartDuration: cfg.StepDur, StopDuration: cfg.StepDur}
	srv, err := fake.New(fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{app, {Name: "kubelet", Daemon: "simple", Enabled: true, Active: true}}}))
	if err != nil {
		return err
	}
	defer srv.Close()
	cli, err := etcdtest.Client(cfg.Endpoints...)
	if err != nil {
		return err
	}
	defer cli.Close()
	b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Max: cfg.Max, TTL: cfg.TTL, Holder: cfg.Name, Unreachable: cfg.Unreachable})
	if err != nil {
		return err
	}
	// The service is ready ReadyDelay after its restart's change is done;
	// the probe records when it first saw that, per change.
	var mu sync.Mutex
	seen := map[string]bool{}
	ready := probe.Func("kube-apiserver readyz", func(context.Context) error {
		chgs := srv.Changes()
		if len(chgs) == 0 {
			return nil
		}
		last := chgs[len(chgs)-1]
		if !last.Ready || time.Since(last.ReadyTime) < cfg.ReadyDelay {
			return errors.New("not ready")
		}
		mu.Lock()
		defer mu.Unlock()
		if !seen[last.ID] {
			seen[last.ID] = true
			out.emit(event{Ev: "probe-ready", Change: last.ID})
		}
		return nil
	})
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
			Ready: func(string) probe.Probe { return ready },
			Probe: probe.Options{Interval: 5 * time.Millisecond, Timeout: time.Second},
			Progress: func(ev snapsvc.BudgetEvent) {
				e := event{Ev: ev.Kind, T: ev.Time, Holders: ev.Wait.Holders}
				if ev.Err != nil {
					e.Err = ev.Err.Error()
				}
				out.emit(e)
			},
		}))
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	for done := 0; done < cfg.Restarts; {
		res, err := c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
		var opErr *snapsvc.OpError
		if err != nil {
			retryable := errors.As(err, &opErr) && opErr.Retryable()
			out.emit(event{Ev: "error", Err: err.Error(), Retryable: retryable, Change: changeOf(opErr)})
			if retryable {
				time.Sleep(100 * time.Millisecond) // a controller's requeue
				continue
			}
			if opErr == nil || opErr.ChangeID == "" {
				return err
			}
			res = &snapsvc.Result{ChangeID: opErr.ChangeID}
		}
		if ci, ok := srv.ChangeByID(res.ChangeID); ok {
			out.emit(event{Ev: "change", Change: ci.ID, Spawn: ci.SpawnTime, Ready: ci.ReadyTime})
		}
		done++
	}
	out.emit(event{Ev: "done"})
	return nil
}

func changeOf(e *snapsvc.OpError) string {
	if e == nil {
		return ""
	}
	return e.ChangeID
}

// machine is a running machine process seen from the test.
type machine struct {
	name   string
	cmd    *exec.Cmd
	events chan event
	exited chan error

	mu  sync.Mutex
	all []event
}

func startMachine(t *testing.T, cfg machineConfig) *machine {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), machineEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &machine{name: cfg.Name, cmd: cmd, events: make(chan event, 10000), exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				m.mu.Lock()
				m.all = append(m.all, ev)
				m.mu.Unlock()
				m.events <- ev
			}
		}
		close(m.events)
		m.exited <- cmd.Wait()
	}()
	t.Cleanup(func() { m.kill() })
	return m
}

// kill sends SIGKILL (a no-op, os.ErrProcessDone, once m has exited).
func (m *machine) kill() {
	m.cmd.Process.Signal(syscall.SIGKILL)
}

func (m *machine) timeline() []event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.all)
}

// waitFor returns the first event of kind from m after the ones already
// read, failing the test if m ends first.
func (m *machine) waitFor(t *testing.T, ctx context.Context, kind string) event {
	t.Helper()
	for {
		select {
		case ev, ok := <-m.events:
			if !ok {
				t.Fatalf("machine %s ended before %q", m.name, kind)
			}
			if ev.Ev == kind {
				return ev
			}
		case <-ctx.Done():
			t.Fatalf("machine %s: no %q: %v", m.name, kind, ctx.Err())
		}
	}
}

// wait waits for m to exit and returns its events.
func (m *machine) wait(t *testing.T, ctx context.Context) []event {
	t.Helper()
	for {
		select {
		case _, ok := <-m.events:
			if ok {
				continue
			}
			if err := <-m.exited; err != nil {
				t.Fatalf("machine %s: %v", m.name, err)
			}
			return m.timeline()
		case <-ctx.Done():
			t.Fatalf("machine %s did not finish: %v", m.name, ctx.Err())
		}
	}
}

// interval is one restart as the machines' fake snapds and probes saw it:
// from the change's spawn until the probe first passed.
type interval struct {
	machine, change string
	from, to        time.Time
}

// restartIntervals rebuilds, from the fake snapds' change times and the
// probes' ready times (not the budget's own events), when each machine's
// service was restarting or not yet ready.
func restartIntervals(t *testing.T, timelines map[string][]event) []interval {
	t.Helper()
	var out []interval
	for name, evs := range timelines {
		readyAt := map[string]time.Time{}
		for _, ev := range evs {
			if ev.Ev == "probe-ready" {
				readyAt[ev.Change] = ev.T
			}
		}
		for _, ev := range evs {
			if ev.Ev != "change" {
				continue
			}
			to, ok := readyAt[ev.Change]
			if !ok {
				t.Fatalf("machine %s: change %s never seen ready by its probe", name, ev.Change)
			}
			out = append(out, interval{machine: name, change: ev.Change, from: ev.Spawn, to: to})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].from.Before(out[j].from) })
	return out
}

// maxConcurrent is the most intervals open at one instant (an interval
// ending at the instant another starts does not overlap it).
func maxConcurrent(ivs []interval) int {
	type edge struct {
		t     time.Time
		delta int
	}
	var edges []edge
	for _, iv := range ivs {
		edges = append(edges, edge{iv.from, +1}, edge{iv.to, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].t.Equal(edges[j].t) {
			return edges[i].delta < edges[j].delta
		}
		return edges[i].t.Before(edges[j].t)
	})
	cur, peak := 0, 0
	for _, e := range edges {
		cur += e.delta
		peak = max(peak, cur)
	}
	return peak
}

func makespan(ivs []interval) time.Duration {
	if len(ivs) == 0 {
		return 0
	}
	first, last := ivs[0].from, ivs[0].to
	for _, iv := range ivs {
		if iv.from.Before(first) {
			first = iv.from
		}
		if iv.to.After(last) {
			last = iv.to
		}
	}
	return last.Sub(first)
}
