package etcdbudget_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/rollouttest"
)

// A simulated machine is this test binary re-executed with machineEnv set:
// a snapsvc client with the etcd budget, talking to the machine's fake
// snapd, with an HTTP readiness probe. It restarts the service Restarts
// times and prints one JSON event per line on stdout. The fake snapd and
// the readiness endpoint (ready ReadyDelay after the last change is done)
// live in the test process, a site per machine: killing or pausing the
// machine process does not stop a restart it sent, as on a real machine
// where snapd carries on, and the test rebuilds who was restarting or not
// ready from the sites' change records, outside the faulted processes.

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
	LockDelay   time.Duration `json:"lock-delay"`
	Socket      string        `json:"socket"`    // set by startMachine: the site's fake snapd
	ReadyURL    string        `json:"ready-url"` // set by startMachine: the site's readiness
	// Percent, when set, makes Max a percentage of the machines that
	// join within JoinPeriod (Controls.MaxUnavailable).
	Percent    int           `json:"percent,omitempty"`
	JoinPeriod time.Duration `json:"join-period,omitempty"`
	// WindowFile, when set, gives the machine the maintenance window
	// "daily 00:00-12:00 UTC" on a clock that reads inside it, or outside
	// while the file exists (the test opens and closes it).
	WindowFile string `json:"window-file,omitempty"`
	// FreezeFile, when it exists at a "fenced" event, makes the machine
	// remove it, print "frozen" and stop itself (SIGSTOP) right after its
	// fence, before its request: the test resumes it.
	FreezeFile string `json:"freeze-file,omitempty"`
	// Sites are the status URLs of every machine's site, by name: the
	// HolderReady probe asks a vanished holder's site whether its service
	// restarted after the holder's act and is ready again.
	Sites map[string]string `json:"sites,omitempty"`
}

// windowClock reads inside the window "daily 00:00-12:00 UTC" while
// file does not exist and outside it while it does; its timers also fire
// when that changes, so a wait for the window re-checks at once.
type windowClock struct {
	file        string
	base, start time.Time
}

func (c *windowClock) closed() bool {
	_, err := os.Stat(c.file)
	return err == nil
}

func (c *windowClock) Now() time.Time {
	t := c.base.Add(time.Since(c.start))
	if c.closed() {
		t = t.Add(12 * time.Hour)
	}
	return t
}

func (c *windowClock) NewTimer(d time.Duration) retry.Timer {
	t := &windowTimer{ch: make(chan time.Time, 1), stop: make(chan struct{})}
	closed := c.closed()
	go func() {
		deadline := time.NewTimer(d)
		defer deadline.Stop()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				return
			case now := <-deadline.C:
				t.ch <- now
				return
			case now := <-tick.C:
				if c.closed() != closed {
					t.ch <- now
					return
				}
			}
		}
	}()
	return t
}

type windowTimer struct {
	ch   chan time.Time
	stop chan struct{}
	once sync.Once
}

func (t *windowTimer) C() <-chan time.Time { return t.ch }
func (t *windowTimer) Stop() bool {
	t.once.Do(func() { close(t.stop) })
	return true
}

// siteStatus is what a site's /status answers.
type siteStatus struct {
	Spawn time.Time `json:"spawn"` // the last change's
	Ready bool      `json:"ready"`
}

// holderReady asks the vanished holder's site whether its service
// restarted after the holder's act and is ready again.
func holderReady(sites map[string]string, out *emitter) func(context.Context, etcdbudget.VanishedHolder) bool {
	return func(ctx context.Context, v etcdbudget.VanishedHolder) bool {
		url, ok := sites[v.Holder]
		if !ok {
			return false
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var st siteStatus
		if json.NewDecoder(resp.Body).Decode(&st) != nil {
			return false
		}
		ok = st.Ready && st.Spawn.After(v.Acted)
		out.emit(event{Ev: "probe", Holders: []string{v.Holder}, Retryable: ok})
		return ok
	}
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
	cli, err := newClient(cfg.Endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()
	bcfg := etcdbudget.Config{Client: cli, TTL: cfg.TTL, Holder: cfg.Name, Unreachable: cfg.Unreachable, LockDelay: cfg.LockDelay}
	if cfg.Sites != nil {
		bcfg.HolderReady = holderReady(cfg.Sites, out)
	}
	ctl := etcdbudget.Controls{MaxUnavailable: etcdbudget.MaxUnavailable{Count: cfg.Max}}
	if cfg.Percent > 0 {
		ctl.MaxUnavailable, ctl.JoinPeriod = etcdbudget.MaxUnavailable{Percent: cfg.Percent}, cfg.JoinPeriod
	}
	if cfg.WindowFile != "" {
		if ctl.Window, err = etcdbudget.ParseWindow("daily 00:00-12:00 UTC"); err != nil {
			return err
		}
		ctl.Clock = &windowClock{file: cfg.WindowFile, base: time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC), start: time.Now()}
	}
	b, err := etcdbudget.NewControlled(bcfg, ctl)
	if err != nil {
		return err
	}
	defer b.Close()
	ready := &probe.HTTP{URL: cfg.ReadyURL}
	c, err := snapsvc.New(snapsvc.WithSocket(cfg.Socket), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
			Key:   func(string) string { return cfg.Key },
			Ready: func(string) probe.Probe { return ready },
			Probe: probe.Options{Interval: 5 * time.Millisecond, Timeout: time.Second},
			Progress: func(ev snapsvc.BudgetEvent) {
				e := event{Ev: ev.Kind, T: ev.Time, Holders: ev.Wait.Holders}
				if ev.Err != nil {
					e.Err = ev.Err.Error()
				}
				out.emit(e)
				if ev.Kind == snapsvc.BudgetFenced && cfg.FreezeFile != "" {
					if os.Remove(cfg.FreezeFile) == nil {
						// Frozen between the fence and the request.
						out.emit(event{Ev: "frozen"})
						syscall.Kill(os.Getpid(), syscall.SIGSTOP)
					}
				}
			},
		}))
	if err != nil {
		return err
	}
	defer c.Close()
	for done := 0; done < cfg.Restarts; {
		// Every call is bounded.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		res, err := c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
		cancel()
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
	app := fake.App{Name: "kube-apiserver", Daemon: "simple", Enabled: true, Active: true, StartDuration: stepDur, StopDuration: stepDur}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{app, {Name: "kubelet", Daemon: "simple", Enabled: true, Active: true}}}))
	st := &site{srv: srv, readyDelay: readyDelay}
	st.ready = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, notReady := st.notReadyUntil(time.Now())
		if r.URL.Path == "/status" {
			var ss siteStatus
			if chgs := st.srv.Changes(); len(chgs) > 0 {
				ss.Spawn = chgs[len(chgs)-1].SpawnTime
			}
			ss.Ready = !notReady
			json.NewEncoder(w).Encode(ss)
			return
		}
		if notReady {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(st.ready.Close)
	return st
}

// notReadyUntil reports whether the service is restarting or not ready
// at now, and until when (zero: not known yet).
func (st *site) notReadyUntil(now time.Time) (time.Time, bool) {
	chgs := st.srv.Changes()
	if len(chgs) == 0 {
		return time.Time{}, false
	}
	last := chgs[len(chgs)-1]
	if !last.Ready {
		return time.Time{}, true
	}
	until := last.ReadyTime.Add(st.readyDelay)
	return until, now.Before(until)
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
	site   *site
	events chan event
	exited chan error
	frozen chan struct{} // a "frozen" event: it stopped itself

	mu  sync.Mutex
	all []event
}

func startMachine(t *testing.T, cfg machineConfig) *machine {
	t.Helper()
	return startMachineAt(t, cfg, newSite(t, cfg.StepDur, cfg.ReadyDelay))
}

// startMachineAt starts a machine process on an existing site (a machine
// started again after it was killed).
func startMachineAt(t *testing.T, cfg machineConfig, st *site) *machine {
	t.Helper()
	cfg.Socket, cfg.ReadyURL = st.srv.SocketPath(), st.ready.URL
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
	m := &machine{name: cfg.Name, cmd: cmd, site: st, events: make(chan event, 10000), exited: make(chan error, 1), frozen: make(chan struct{}, 100)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev event
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				m.mu.Lock()
				m.all = append(m.all, ev)
				m.mu.Unlock()
				if ev.Ev == "frozen" {
					m.frozen <- struct{}{}
				}
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
			select {
			case err := <-m.exited:
				m.exited <- err
				if err != nil {
					t.Fatalf("machine %s: %v", m.name, err)
				}
			case <-ctx.Done():
				t.Fatalf("machine %s: its output ended but it did not exit: %v", m.name, ctx.Err())
			}
			return m.timeline()
		case <-ctx.Done():
			t.Fatalf("machine %s did not finish: %v", m.name, ctx.Err())
		}
	}
}

// restartIntervals rebuilds, from the sites' change records (not the
// budget's events, nor anything in the machine processes), when each
// machine's service was restarting or not yet ready (rollouttest).
func restartIntervals(t *testing.T, ms []*machine) []rollouttest.Interval {
	t.Helper()
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
