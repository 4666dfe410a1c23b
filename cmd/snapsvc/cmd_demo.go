package main

import (
	"github.com/spf13/cobra"

	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// k8sSnap is a Kubernetes-like snap modelled on k8s-snap's snap.yaml:
// k8sd runs, the Kubernetes services are installed disabled and ordered by
// before/after. scale multiplies the start and stop durations (0: instant).
func k8sSnap(scale float64) fake.Snap {
	d := func(ms int) time.Duration { return time.Duration(float64(ms) * scale * float64(time.Millisecond)) }
	cp := []string{"kubelet", "kube-controller-manager", "kube-proxy", "kube-scheduler"}
	return fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "k8s"}, // the command, not a service
		{Name: "k8sd", Daemon: "simple", Enabled: true, Active: true},
		{Name: "containerd", Daemon: "notify", Before: []string{"kubelet"}, StartDuration: d(200), StopDuration: d(100)},
		{Name: "etcd", Daemon: "simple", Before: []string{"kube-apiserver"}, StartDuration: d(150), StopDuration: d(100)},
		{Name: "kube-apiserver", Daemon: "simple", Before: cp, StartDuration: d(300), StopDuration: d(100)},
		{Name: "kube-controller-manager", Daemon: "simple", After: []string{"kube-apiserver"}, StartDuration: d(100), StopDuration: d(50)},
		{Name: "kube-scheduler", Daemon: "simple", After: []string{"kube-apiserver"}, StartDuration: d(100), StopDuration: d(50)},
		{Name: "kube-proxy", Daemon: "simple", After: []string{"kube-apiserver"}, StartDuration: d(100), StopDuration: d(50)},
		{Name: "kubelet", Daemon: "simple", After: []string{"containerd"}, StartDuration: d(150), StopDuration: d(100)},
	}}
}

// bootstrapWho names the client that bootstraps the cluster. It stands
// for k8sd's bootstrap code and is a plain REST client on snapd's main
// socket, not a snap hook (no snapctl, no hook context).
const bootstrapWho = "k8sd bootstrap"

// controlPlane is what the bootstrap code starts after the datastore, in
// k8s-snap's order (snapd reorders one request by before/after anyway).
var controlPlane = []string{"k8s.containerd", "k8s.kube-controller-manager", "k8s.kube-proxy", "k8s.kube-scheduler", "k8s.kubelet", "k8s.kube-apiserver"}

// demoStep is one line of the demo's story.
// At is seconds since the demo started.
type demoStep struct {
	At   float64 `json:"at"`
	Who  string  `json:"who"`
	Text string  `json:"text"`
}

// demoReport is demo's --json shape (and what the summary prints).
type demoReport struct {
	Steps                  []demoStep        `json:"steps"`
	Changes                []demoChange      `json:"changes"`
	Services               []snapsvc.Service `json:"services"`
	Requests               map[string]int    `json:"requests"`
	Conflicts              int               `json:"conflicts"`
	ConflictsBetweenOurOwn int               `json:"conflicts-between-our-clients"`
	ForeignChange          string            `json:"foreign-change"`
	ForeignWaitedOut       bool              `json:"foreign-change-waited-out"`
	Elapsed                float64           `json:"elapsed"` // seconds
	OK                     bool              `json:"ok"`
}

type demoChange struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Status  string `json:"status"`
	Summary string `json:"summary"`
	By      string `json:"by"`
}

// demo is one run of the demonstration.
type demo struct {
	a     *app
	start time.Time
	mu    sync.Mutex
	steps []demoStep
	live  io.Writer // nil under --json
	// conflict is closed when a client first reports a conflict.
	conflict     chan struct{}
	conflictOnce sync.Once
	// apiserverUp is closed once "systemd" reported kube-apiserver active.
	apiserverUp chan struct{}
	ops         *sync.Map
}

func (d *demo) say(who, format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := demoStep{At: time.Since(d.start).Round(time.Millisecond).Seconds(), Who: who, Text: fmt.Sprintf(format, args...)}
	d.steps = append(d.steps, st)
	if d.live != nil {
		fmt.Fprintf(d.live, "%6.3fs  %-14s %s\n", st.At, st.Who, st.Text)
	}
}

// logger is a client's logger: its records become steps (and, with -v,
// slog text on stderr too).
func (d *demo) logger(who string) *slog.Logger {
	h := slog.Handler(&readableHandler{who: who, ops: d.ops, sink: func(msg, line string) {
		if strings.HasPrefix(msg, "conflict") {
			d.conflictOnce.Do(func() { close(d.conflict) })
		}
		d.say(who, "│ %s", line)
	}})
	if d.a.verbose {
		h = teeHandler{h, slog.NewTextHandler(d.a.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}).WithAttrs([]slog.Attr{slog.String("client", who)})}
	}
	return slog.New(h)
}

func (a *app) demoCmd() *cobra.Command {
	var scale float64
	c := &cobra.Command{
		Use: "demo [--scale F]",
		Example: `  snapsvc demo               # about 10 seconds, no snapd needed
  snapsvc demo --scale 0.2   # faster`,
		Short: "Demonstrate the library against an in-process fake snapd",
		Long: `The demo command starts a fake snapd with a Kubernetes-like snap in this
process and plays a cluster bootstrap against it: the services started in
order while an operator's "snap set" holds the snap, the conflict waited out,
then a summary. It needs no snapd and no root.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if scale < 0 {
				return usagef("--scale must not be negative")
			}
			return a.do(c, func(ctx context.Context) error {
				rep, err := runDemo(ctx, a, scale)
				switch {
				case a.json && err != nil && rep != nil:
					// One document: the error, with the report in it.
					return &detailError{err: err, detail: rep}
				case a.json && err == nil:
					a.printJSON(rep)
				}
				return err
			})
		},
	}
	c.Flags().Float64Var(&scale, "scale", 1, "multiply the simulated service start/stop times by this `factor`")
	return c
}

func runDemo(ctx context.Context, a *app, scale float64) (*demoReport, error) {
	d := &demo{a: a, start: time.Now(), conflict: make(chan struct{}), apiserverUp: make(chan struct{}), ops: &sync.Map{}}
	if !a.json {
		d.live = a.stdout
	}
	dur := func(ms int) time.Duration { return time.Duration(float64(ms) * scale * float64(time.Millisecond)) }
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second+dur(10000))
		defer cancel()
	}

	// The demo runs as whoever runs it, in place of a root daemon: the
	// fake lets it restart without sudo.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(scale)))
	if err != nil {
		return nil, fmt.Errorf("demo: starting the fake snapd: %w", err)
	}
	defer srv.Close()
	d.say("snapd", "fake snapd %s listening on %s", srv.Version(), srv.SocketPath())
	d.say("snapd", "snap k8s installed: k8sd running, Kubernetes services disabled")

	// A foreign change holds the snap: someone ran "snap set k8s ..." and
	// its configure hook is still running.
	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
	d.say("snap set", "change %s (configure-snap) holds k8s while its configure hook runs", held.ID())

	newClient := func(who string) (*snapsvc.Client, error) {
		return snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithLogger(d.logger(who)))
	}
	d.say(bootstrapWho, "k8sd's bootstrap code, here a plain REST client on %s (not a snap hook)", srv.SocketPath())
	boot, err := newClient(bootstrapWho)
	if err != nil {
		return nil, err
	}
	defer boot.Close()
	ctrl, err := newClient("controller")
	if err != nil {
		return nil, err
	}
	defer ctrl.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	var bootResults []*snapsvc.Result
	byChange := map[string]string{held.ID(): "snap set"}
	var byMu sync.Mutex
	record := func(who string, res *snapsvc.Result) {
		byMu.Lock()
		defer byMu.Unlock()
		byChange[res.ChangeID] = who
	}

	// "systemd": print service state transitions as the fake makes them.
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		d.watchServices(ctx, srv)
	}()

	// The foreign change ends a moment after a client ran into it (or
	// after a while, should nobody do so).
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-d.conflict:
		case <-time.After(5 * time.Second): // not scaled: a fallback, never the plan
		case <-ctx.Done():
			return
		}
		select {
		case <-time.After(dur(400)):
		case <-ctx.Done():
			return
		}
		held.Finish()
		d.say("snap set", "configure hook done: change %s %s", held.ID(), held.Info().Status)
	}()

	// The bootstrap code: datastore first, then the control plane in one
	// request, as k8sd does.
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.say(bootstrapWho, "start --enable k8s.etcd (the datastore)")
		res, err := boot.Start(ctx, []string{"k8s.etcd"}, snapsvc.StartOptions{Enable: true})
		if err != nil {
			errs[0] = fmt.Errorf("%s: %w", bootstrapWho, err)
			return
		}
		record(bootstrapWho, res)
		bootResults = append(bootResults, res)
		d.say(bootstrapWho, "datastore started: change %s %s after %d attempt(s), waited for %v", res.ChangeID, res.Status, res.Attempts, res.WaitedFor)
		d.say(bootstrapWho, "start --enable %s (one request)", strings.Join(controlPlane, " "))
		res, err = boot.Start(ctx, controlPlane, snapsvc.StartOptions{Enable: true})
		if err != nil {
			errs[0] = fmt.Errorf("%s: %w", bootstrapWho, err)
			return
		}
		record(bootstrapWho, res)
		bootResults = append(bootResults, res)
		d.say(bootstrapWho, "control plane started: change %s %s", res.ChangeID, res.Status)
	}()

	// The node-configuration controller: once the API server is up it
	// restarts kubelet, while the bootstrap's start is still running (the race
	// of canonical/k8s-snap PR #630).
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-d.apiserverUp:
		case <-ctx.Done():
			errs[1] = fmt.Errorf("controller: waiting for kube-apiserver: %w", context.Cause(ctx))
			return
		}
		var running []string
		for _, ci := range srv.Changes() {
			if !ci.Ready {
				running = append(running, ci.ID)
			}
		}
		d.say("controller", "kube-apiserver is up → restart k8s.kubelet")
		if len(running) > 0 {
			d.say("controller", "  change %s of the bootstrap still runs: the library holds this call back in-process instead of letting snapd refuse it", strings.Join(running, ","))
		}
		res, err := ctrl.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		if err != nil {
			errs[1] = fmt.Errorf("controller: %w", err)
			return
		}
		record("controller", res)
		d.say("controller", "kubelet restarted: change %s %s, %d conflict(s) from snapd", res.ChangeID, res.Status, res.Conflicts)
	}()

	wg.Wait()
	cancel()
	<-watchDone
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	// The summary, from the fake's own records.
	rep := &demoReport{ForeignChange: held.ID(), Requests: map[string]int{}}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	svcs, err := boot.Services(rctx, "k8s")
	if err != nil {
		return nil, err
	}
	rep.Services = svcs
	for _, ci := range srv.Changes() {
		rep.Changes = append(rep.Changes, demoChange{ID: ci.ID, Kind: ci.Kind, Status: ci.Status, Summary: ci.Summary, By: byChange[ci.ID]})
	}
	counters := srv.Counters()
	rep.Requests = counters.Requests
	for _, r := range srv.Requests() {
		if r.Method == "POST" && r.Path == "/v2/apps" && r.Status >= 400 && strings.Contains(r.Message, "change in progress") {
			rep.Conflicts++
			if strings.Contains(r.Message, `"service-control"`) {
				rep.ConflictsBetweenOurOwn++
			}
		}
	}
	if len(bootResults) > 0 {
		rep.ForeignWaitedOut = slices.Contains(bootResults[0].WaitedFor, held.ID())
	}
	rep.Elapsed = time.Since(d.start).Round(time.Millisecond).Seconds()
	allUp := true
	for _, s := range svcs {
		allUp = allUp && s.Active
	}
	rep.OK = allUp && rep.ConflictsBetweenOurOwn == 0 && rep.ForeignWaitedOut
	rep.Steps = d.steps
	if !a.json {
		d.printSummary(rep)
	}
	if !rep.OK {
		return rep, fmt.Errorf("demo: unexpected outcome (all services active: %t, conflicts between our clients: %d, foreign change waited out: %t)", allUp, rep.ConflictsBetweenOurOwn, rep.ForeignWaitedOut)
	}
	return rep, nil
}

// watchServices prints every service state transition of snap k8s until
// ctx ends.
func (d *demo) watchServices(ctx context.Context, srv *fake.Server) {
	names := []string{}
	for _, app := range k8sSnap(0).Apps {
		if app.Daemon != "" {
			names = append(names, app.Name)
		}
	}
	last := map[string]fake.AppState{}
	for _, n := range names {
		last[n], _ = srv.Service("k8s", n)
	}
	for {
		var changed []string
		now := map[string]fake.AppState{}
		err := srv.WaitFor(ctx, func(v fake.View) bool {
			changed = changed[:0]
			for _, n := range names {
				st, _ := v.Service("k8s", n)
				now[n] = st
				if st != last[n] {
					changed = append(changed, n)
				}
			}
			return len(changed) > 0
		})
		if err != nil {
			return
		}
		for _, n := range changed {
			st := now[n]
			what := "inactive"
			if st.Active {
				what = "active"
			}
			if st.Enabled != last[n].Enabled {
				if st.Enabled {
					what += ", enabled"
				} else {
					what += ", disabled"
				}
			}
			d.say("systemd", "k8s.%s %s", n, what)
			last[n] = st
			if n == "kube-apiserver" && st.Active {
				select {
				case <-d.apiserverUp:
				default:
					close(d.apiserverUp)
				}
			}
		}
	}
}

func (d *demo) printSummary(rep *demoReport) {
	w := d.a.stdout
	fmt.Fprintf(w, "\nChanges:\n")
	tw := d.a.table()
	for _, c := range rep.Changes {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t(%s)\n", c.ID, c.Status, c.Kind, c.Summary, c.By)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nServices of k8s:\n")
	tw = d.a.table()
	for _, s := range rep.Services {
		startup, current := "disabled", "inactive"
		if s.Enabled {
			startup = "enabled"
		}
		if s.Active {
			current = "active"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", s.FullName(), startup, current)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nsnapd (the fake) counted:\n")
	fmt.Fprintf(w, "  POST /v2/apps requests:             %d\n", rep.Requests["POST /v2/apps"])
	fmt.Fprintf(w, "  conflicts answered by snapd:        %d (all with the foreign change %s)\n", rep.Conflicts, rep.ForeignChange)
	fmt.Fprintf(w, "  conflicts between our two clients:  %d\n", rep.ConflictsBetweenOurOwn)
	fmt.Fprintf(w, "  foreign change waited out:          %t\n", rep.ForeignWaitedOut)
	fmt.Fprintf(w, "  took:                               %.3fs\n", rep.Elapsed)
}

// teeHandler sends records to two handlers.
type teeHandler struct{ a, b slog.Handler }

func (t teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return t.a.Enabled(ctx, l) || t.b.Enabled(ctx, l)
}

func (t teeHandler) Handle(ctx context.Context, r slog.Record) error {
	var errA, errB error
	if t.a.Enabled(ctx, r.Level) {
		errA = t.a.Handle(ctx, r.Clone())
	}
	if t.b.Enabled(ctx, r.Level) {
		errB = t.b.Handle(ctx, r)
	}
	return errors.Join(errA, errB)
}

func (t teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{t.a.WithAttrs(as), t.b.WithAttrs(as)}
}

func (t teeHandler) WithGroup(name string) slog.Handler {
	return teeHandler{t.a.WithGroup(name), t.b.WithGroup(name)}
}
