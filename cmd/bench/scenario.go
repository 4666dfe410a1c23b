package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/benchkit"
)

// snapName is the snap every scenario works on.
const snapName = "k8s"

// hookServices are the services bootstrap's hook starts, one call each
// (k8sd's bootstrap starts the control plane's services one by one:
// canonical/k8s-snap src/k8s/pkg/snap/util/services.go).
var hookServices = []string{"containerd", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "k8s-apiserver-proxy"}

// stormServices are the services storm's five controllers restart.
var stormServices = []string{"kubelet", "kube-proxy", "kube-apiserver", "kube-scheduler", "kube-controller-manager"}

// waitersServices are the services waiters-own's processes restart,
// one each (the ninth process, if any, shares the first one's).
var waitersServices = append(slices.Clone(stormServices), "containerd", "etcd", "k8s-apiserver-proxy")

const (
	bootstrapRestarts = 10 // the controller's kubelet restarts in bootstrap
	stormRestarts     = 10 // each storm controller's restarts, all at once
)

// jobTimeout bounds one sample; a call still running then fails.
const jobTimeout = 5 * time.Minute

// job is one sample: one scenario, one strategy, one snapd version, on a
// fake of its own.
type job struct {
	scenario string
	param    time.Duration // foreign: the blocker's hold
	k, p     int           // waiters: callers per process, processes
	version  fake.Version
	strategy string
	index    int
}

// sample is what one job saw.
type sample struct {
	job      job
	t0       time.Time // when the callers began
	outs     []benchkit.Outcome
	ideal    time.Duration // the change durations snapd must serialise anyway
	base     fake.Counters // the counters at t0 (the harness's own changes and warm-up)
	socketUp time.Time     // late-socket: when the socket appeared
	freed    time.Time     // waiters: when the blocker was ready
	requests []fake.Request
	changes  []fake.ChangeInfo
	counters fake.Counters
	err      error // the harness failed (not a call)
}

// k8s is the snap of every scenario: the storm's services and the hook's,
// all simple daemons taking the configured times to start and stop; those
// named in active are enabled and active, the others stopped and
// disabled.
func (c config) k8s(active ...string) fake.Snap {
	sn := fake.Snap{Name: snapName}
	for _, name := range append(slices.Clone(stormServices), hookServices...) {
		on := slices.Contains(active, name)
		sn.Apps = append(sn.Apps, fake.App{Name: name, Daemon: "simple", Enabled: on, Active: on, StartDuration: c.start, StopDuration: c.stop})
	}
	sn.Apps = append(sn.Apps, fake.App{Name: "k8s"}) // the CLI, not a service
	return sn
}

func svc(name string) []string { return []string{snapName + "." + name} }

// run carries out one job.
func (c config) run(j job) (s sample) {
	s.job = j
	active := []string{"kubelet"}
	switch j.scenario {
	case scStorm:
		active = stormServices
	case scWaitersOwn:
		active = waitersServices
	}
	// The bench runs as whoever runs it; the daemons it stands for run
	// as root.
	opts := []fake.Option{fake.AllowNonRoot(), fake.WithVersion(j.version), fake.WithSnaps(c.k8s(active...))}
	if j.scenario == scLateSocket {
		opts = append(opts, fake.WithoutListening())
	}
	if c.stateFile {
		opts = append(opts, fake.WithStateFile())
	}
	if j.strategy == benchkit.SnapsvcSnapctl {
		// A snap without snap-refresh-observe (and every snap on 2.57,
		// whose snap socket lists no changes): snapsvc waits blind.
		opts = append(opts, fake.WithSnapSocketObserveDenied())
	}
	srv, err := fake.New(opts...)
	if err != nil {
		s.err = err
		return s
	}
	defer srv.Close()
	target := benchkit.Target{Socket: srv.SocketPath(), SnapSocket: srv.SnapSocketPath(), Cookie: srv.Cookie(snapName), StateFile: srv.StateFile(), Snap: snapName}
	newStrategy := func() benchkit.Strategy {
		st, err := benchkit.New(j.strategy, target, benchkit.Config{Scale: c.scale})
		if err != nil {
			panic(err) // names are checked by parseFlags
		}
		return st
	}
	ctx, cancel := context.WithTimeout(context.Background(), jobTimeout)
	defer cancel()
	restart := func(name string) benchkit.Call { return benchkit.Call{Action: "restart", Names: svc(name)} }

	switch j.scenario {
	case scForeign:
		st := newStrategy()
		defer st.Close()
		// A caller that has made a call before (a controller, not a
		// hook's first call): what it learns once (whether snapd has
		// notices) is not counted against the wait.
		if o := st.Sequence(ctx, restart("kubelet")); o[0].Failed() {
			s.err = fmt.Errorf("warm-up restart: %w", o[0].Err)
		}
		// The caller meets the blocker at a moment of its life spread
		// evenly over the samples (the first 90 % of it, so that there is
		// something left to wait for): in real life the two are not in
		// step, and a poll's phase must not line up with the blocker's end.
		blk := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: snapName})
		tm := time.AfterFunc(j.param, blk.Finish)
		into := time.Duration(0.9 * float64(j.param) * (float64(j.index) + 0.5) / float64(c.samples))
		time.Sleep(into)
		s.base, s.t0 = srv.Counters(), time.Now()
		s.outs = st.Sequence(ctx, restart("kubelet"))
		if !tm.Stop() {
			<-blk.Ready()
		}
		s.ideal = j.param - into + c.restart()

	case scBootstrap:
		hook, ctl := newStrategy(), newStrategy()
		defer hook.Close()
		defer ctl.Close()
		blk := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: snapName})
		calls := make([]benchkit.Call, len(hookServices))
		for i, name := range hookServices {
			calls[i] = benchkit.Call{Action: "start", Names: svc(name), Enable: true}
		}
		var hookOuts, ctlOuts []benchkit.Outcome
		var wg sync.WaitGroup
		wg.Add(2)
		s.base, s.t0 = srv.Counters(), time.Now()
		tm := time.AfterFunc(c.hold, blk.Finish)
		go func() { defer wg.Done(); hookOuts = hook.Sequence(ctx, calls...) }()
		go func() {
			defer wg.Done()
			for range bootstrapRestarts {
				ctlOuts = append(ctlOuts, ctl.Sequence(ctx, restart("kubelet"))...)
			}
		}()
		wg.Wait()
		if !tm.Stop() {
			<-blk.Ready()
		}
		s.outs = append(hookOuts, ctlOuts...)
		s.ideal = c.hold + time.Duration(len(hookServices))*c.start + bootstrapRestarts*c.restart()

	case scStorm:
		var mu sync.Mutex
		var wg sync.WaitGroup
		s.base, s.t0 = srv.Counters(), time.Now()
		for _, name := range stormServices {
			ctl := newStrategy()
			defer ctl.Close()
			for range stormRestarts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					o := ctl.Sequence(ctx, restart(name))
					mu.Lock()
					s.outs = append(s.outs, o...)
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		s.ideal = time.Duration(len(stormServices)) * c.restart()

	case scLateSocket:
		st := newStrategy()
		defer st.Close()
		done := make(chan []benchkit.Outcome, 1)
		s.base, s.t0 = srv.Counters(), time.Now()
		go func() { done <- st.Sequence(ctx, restart("kubelet")) }()
		select {
		case s.outs = <-done: // gave up before the socket appeared
		case <-time.After(c.socketDelay):
		}
		s.socketUp = time.Now()
		if err := srv.StartListening(); err != nil {
			s.err = fmt.Errorf("fake snapd: %w", err)
		}
		if s.outs == nil {
			s.outs = <-done
		}
		s.ideal = c.socketDelay + c.restart()

	case scWaiters, scWaitersOwn:
		// P processes: Clients whose sockets are other paths to the fake's
		// (symlinks in a directory of their own), so each has a lock
		// registry of its own as another process has, sharing one lock
		// directory (the file locks and what the processes share through
		// it); K callers in each, restarting kubelet (waiters-own: a
		// service of each process's own).
		var procs []benchkit.Strategy
		for i := range j.p {
			dir, err := os.MkdirTemp("", "bench-proc")
			if err != nil {
				s.err = err
				return s
			}
			defer os.RemoveAll(dir)
			pt := target
			pt.Socket, pt.SnapSocket = filepath.Join(dir, "snapd.socket"), filepath.Join(dir, "snapd-snap.socket")
			pt.LockDir = filepath.Join(srv.Dir(), ".snapsvc-lock")
			for _, l := range [][2]string{{srv.SocketPath(), pt.Socket}, {srv.SnapSocketPath(), pt.SnapSocket}} {
				if err := os.Symlink(l[0], l[1]); err != nil {
					s.err = err
					return s
				}
			}
			st, err := benchkit.New(j.strategy, pt, benchkit.Config{Scale: c.scale})
			if err != nil {
				s.err = fmt.Errorf("process %d: %w", i, err)
				return s
			}
			defer st.Close()
			// A process that has made a call before.
			if o := st.Sequence(ctx, restart("kubelet")); o[0].Failed() {
				s.err = fmt.Errorf("process %d: warm-up restart: %w", i, o[0].Err)
			}
			procs = append(procs, st)
		}
		blk := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: snapName})
		var mu sync.Mutex
		var wg sync.WaitGroup
		s.base, s.t0 = srv.Counters(), time.Now()
		tm := time.AfterFunc(c.waitersHold, blk.Finish)
		for i, st := range procs {
			name := "kubelet"
			if j.scenario == scWaitersOwn {
				name = waitersServices[i%len(waitersServices)]
			}
			for range j.k {
				wg.Add(1)
				go func() {
					defer wg.Done()
					o := st.Sequence(ctx, restart(name))
					mu.Lock()
					s.outs = append(s.outs, o...)
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		if !tm.Stop() {
			<-blk.Ready()
		}
		for _, ch := range srv.Changes() {
			if ch.ID == blk.ID() {
				s.freed = ch.ReadyTime
			}
		}
		s.ideal = c.waitersHold + c.restart()

	case scUncontended:
		// A caller that has made a call before: what it learns once
		// (whether snapd has notices) is not counted against the call.
		st := newStrategy()
		defer st.Close()
		if o := st.Sequence(ctx, restart("kubelet")); o[0].Failed() {
			s.err = fmt.Errorf("warm-up restart: %w", o[0].Err)
		}
		s.base, s.t0 = srv.Counters(), time.Now()
		s.outs = st.Sequence(ctx, restart("kubelet"))
		s.ideal = c.restart()
	}
	s.counters = srv.Counters()
	for _, r := range srv.Requests() {
		if !r.Time.Before(s.t0) {
			s.requests = append(s.requests, r)
		}
	}
	s.changes = srv.Changes()
	return s
}

// jobs lists every job of scenario sc, cell by cell.
func (c config) jobs(sc string) []job {
	var out []job
	params := []time.Duration{0}
	n := c.samples
	type kp struct{ k, p int }
	cells := []kp{{}}
	switch sc {
	case scForeign:
		params = c.durations
	case scBootstrap, scStorm:
		n = c.runs
	case scWaiters, scWaitersOwn:
		n, cells = c.runs, nil
		for _, p := range c.waitersP {
			for _, k := range c.waitersK {
				cells = append(cells, kp{k, p})
			}
		}
	}
	for _, p := range params {
		for _, cell := range cells {
			for _, v := range c.versions {
				for _, st := range c.strategies {
					if isWaiters(sc) && !benchkit.IsSnapsvc(st) {
						continue // the others neither share nor watch anything
					}
					for i := range n {
						out = append(out, job{scenario: sc, param: p, k: cell.k, p: cell.p, version: v, strategy: st, index: i})
					}
				}
			}
		}
	}
	return out
}

// runAll runs jobs, c.parallel at a time, and returns their samples in
// the jobs' order.
func (c config) runAll(jobs []job) []sample {
	out := make([]sample, len(jobs))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(c.parallel, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = c.run(jobs[i])
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}
