//go:build libsqlite3

package dqlitetest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/testsupport/rollouttest"
)

// A machine is this test binary re-executed with machineEnv set: a
// dqlite client (as a microcluster daemon's database handle) with a
// sqlbudget, and a snapsvc client on the machine's fake snapd, with an
// HTTP readiness probe. It restarts the service Restarts times and prints
// one JSON event per line. Its site (fake snapd and readiness endpoint)
// lives in the test process, so a machine killed or frozen does not stop
// a restart it sent, and the test rebuilds who was restarting or not
// ready from the sites' change records, outside the faulted processes.
const machineEnv = "DQLITETEST_MACHINE"

type machineConfig struct {
	Name       string        `json:"name"`
	Nodes      []string      `json:"nodes"`
	Key        string        `json:"key"`
	Max        int           `json:"max"`
	TTL        time.Duration `json:"ttl"`
	LockDelay  time.Duration `json:"lock-delay"`
	Restarts   int           `json:"restarts"`
	StepDur    time.Duration `json:"step"`
	ReadyDelay time.Duration `json:"ready-delay"`
	Settle     time.Duration `json:"settle"`
	Socket     string        `json:"socket"`
	ReadyURL   string        `json:"ready-url"`
}

// event is one line a machine or holder prints.
type event struct {
	Machine     string        `json:"m,omitempty"`
	Ev          string        `json:"ev"`
	T           time.Time     `json:"t"`
	Change      string        `json:"chg,omitempty"`
	Err         string        `json:"err,omitempty"`
	Retryable   bool          `json:"retryable,omitempty"`
	Holders     []string      `json:"holders,omitempty"`
	Waited      time.Duration `json:"waited,omitempty"`
	Held        time.Duration `json:"held,omitempty"`
	Lost        bool          `json:"lost,omitempty"`
	Unavailable bool          `json:"unavailable,omitempty"`
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
	db := openDB(cfg.Nodes)
	defer db.Close()
	b, err := sqlbudget.New(sqlbudget.Config{Tx: sqlbudget.DBTx(db), Max: cfg.Max, TTL: cfg.TTL, LockDelay: cfg.LockDelay,
		Holder: cfg.Name, ClockSkew: cfg.TTL / 10, Unreachable: 3 * cfg.TTL})
	if err != nil {
		return err
	}
	ready := &probe.HTTP{URL: cfg.ReadyURL}
	c, err := snapsvc.New(snapsvc.WithSocket(cfg.Socket), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
			Key:    func(string) string { return cfg.Key },
			Ready:  func(string) probe.Probe { return ready },
			Probe:  probe.Options{Interval: 5 * time.Millisecond, Timeout: time.Second},
			Settle: cfg.Settle,
			Progress: func(ev snapsvc.BudgetEvent) {
				e := event{Ev: ev.Kind, T: ev.Time, Holders: ev.Wait.Holders, Waited: ev.Waited, Held: ev.Held}
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
	failures := 0
	for done := 0; done < cfg.Restarts; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		res, err := c.Restart(ctx, []string{"microovn.ovn-northd"}, snapsvc.RestartOptions{})
		cancel()
		var opErr *snapsvc.OpError
		if err != nil {
			retryable := errors.As(err, &opErr) && opErr.Retryable()
			out.emit(event{Ev: "error", Err: err.Error(), Retryable: retryable})
			if opErr == nil || opErr.ChangeID == "" {
				// Nothing was sent (no slot, a fence that failed): a
				// daemon requeues the restart, as it does under faults.
				if failures++; failures > 50 {
					return err
				}
				time.Sleep(100 * time.Millisecond)
				continue
			}
			res = &snapsvc.Result{ChangeID: opErr.ChangeID} // sent: it happened
		}
		out.emit(event{Ev: "change", Change: res.ChangeID})
		done++
	}
	out.emit(event{Ev: "done"})
	return nil
}

// site is what outlives a machine process: its fake snapd and its
// service's readiness endpoint.
type site struct {
	srv        *fake.Server
	ready      *httptest.Server
	readyDelay time.Duration
}

func newSite(t *testing.T, stepDur, readyDelay time.Duration) *site {
	t.Helper()
	app := fake.App{Name: "ovn-northd", Daemon: "simple", Enabled: true, Active: true, StartDuration: stepDur, StopDuration: stepDur}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "microovn", Apps: []fake.App{app, {Name: "daemon", Daemon: "simple", Enabled: true, Active: true}}}))
	st := &site{srv: srv, readyDelay: readyDelay}
	st.ready = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if st.notReady(time.Now()) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(st.ready.Close)
	return st
}

// notReady reports whether the service is restarting or not ready at now.
func (st *site) notReady(now time.Time) bool {
	chgs := st.srv.Changes()
	if len(chgs) == 0 {
		return false
	}
	last := chgs[len(chgs)-1]
	return !last.Ready || now.Before(last.ReadyTime.Add(st.readyDelay))
}

// machine is a running machine (or holder) process seen from the test.
type machine struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	site   *site
	events chan event
	exited chan error

	mu  sync.Mutex
	all []event
}

func startMachine(t *testing.T, cfg machineConfig, st *site) *machine {
	t.Helper()
	if st == nil {
		st = newSite(t, cfg.StepDur, cfg.ReadyDelay)
	}
	cfg.Socket, cfg.ReadyURL = st.srv.SocketPath(), st.ready.URL
	raw, _ := json.Marshal(cfg)
	m := startProcess(t, cfg.Name, machineEnv, string(raw))
	m.site = st
	return m
}

func startProcess(t *testing.T, name, env, raw string) *machine {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+raw)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m := &machine{name: name, cmd: cmd, stdin: stdin, events: make(chan event, 10000), exited: make(chan error, 1)}
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
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Process.Signal(syscall.SIGCONT)
	})
	return m
}

func (m *machine) freeze() error { return syscall.Kill(m.cmd.Process.Pid, syscall.SIGSTOP) }

func (m *machine) thaw() error { return syscall.Kill(m.cmd.Process.Pid, syscall.SIGCONT) }

func (m *machine) send(t *testing.T, line string) {
	t.Helper()
	if _, err := fmt.Fprintln(m.stdin, line); err != nil {
		t.Fatal(err)
	}
}

func (m *machine) timeline() []event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.all)
}

// waitFor returns the next event of kind, failing if m ends first.
func (m *machine) waitFor(t *testing.T, ctx context.Context, kind string) event {
	t.Helper()
	for {
		select {
		case ev, ok := <-m.events:
			if !ok {
				t.Fatalf("%s ended before %q", m.name, kind)
			}
			if ev.Ev == kind {
				return ev
			}
		case <-ctx.Done():
			t.Fatalf("%s: no %q: %v", m.name, kind, ctx.Err())
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
				t.Fatalf("%s: %v", m.name, err)
			}
			return m.timeline()
		case <-ctx.Done():
			t.Fatalf("%s did not finish: %v", m.name, ctx.Err())
		}
	}
}

// restartIntervals rebuilds, from the sites' change records (not from
// anything the machine processes say), when each machine's service was
// restarting or not ready (rollouttest).
func restartIntervals(ms []*machine) []rollouttest.Interval {
	var sites []rollouttest.Site
	seen := map[*site]bool{}
	for _, m := range ms {
		if !seen[m.site] {
			seen[m.site] = true
			sites = append(sites, rollouttest.Site{Machine: m.name, Server: m.site.srv, ReadyDelay: m.site.readyDelay})
		}
	}
	return rollouttest.Intervals(sites)
}

// A holder is this test binary re-executed with holderEnv set: a dqlite
// client with a sqlbudget that takes a slot, prints "acquired", then
// obeys "fence", "ready" and "release" on stdin, printing one event
// each. Tests freeze (SIGSTOP) or kill it.
const holderEnv = "DQLITETEST_HOLDER"

type holderConfig struct {
	Nodes     []string      `json:"nodes"`
	Key       string        `json:"key"`
	Name      string        `json:"name"`
	TTL       time.Duration `json:"ttl"`
	LockDelay time.Duration `json:"lock-delay"`
}

func maybeRunHolder() {
	raw := os.Getenv(holderEnv)
	if raw == "" {
		return
	}
	var cfg holderConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := runHolder(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runHolder(cfg holderConfig) error {
	db := openDB(cfg.Nodes)
	defer db.Close()
	b, err := sqlbudget.New(sqlbudget.Config{Tx: sqlbudget.DBTx(db), Holder: cfg.Name, TTL: cfg.TTL, LockDelay: cfg.LockDelay, ClockSkew: cfg.TTL / 10})
	if err != nil {
		return err
	}
	out := &emitter{name: cfg.Name, enc: json.NewEncoder(os.Stdout)}
	ctx := context.Background()
	s, err := b.Acquire(ctx, cfg.Key, nil)
	if err != nil {
		return err
	}
	out.emit(event{Ev: "acquired"})
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var err error
		switch sc.Text() {
		case "fence":
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = s.(budget.Fencer).Fence(fctx)
			cancel()
		case "ready":
			err = s.(budget.Readier).MarkReady(ctx)
		case "release":
			err = s.Release(ctx)
		default:
			continue
		}
		ev := event{Ev: sc.Text()}
		if err != nil {
			ev.Err = err.Error()
			ev.Lost = errors.Is(err, budget.ErrSlotLost)
			ev.Unavailable = errors.Is(err, budget.ErrUnavailable)
		}
		out.emit(ev)
	}
	return nil
}
