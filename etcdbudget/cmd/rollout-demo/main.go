// Command rollout-demo shows a rolling restart under an etcd restart
// budget, self-contained: it starts a 3-member etcd cluster on loopback
// (in this process, go.etcd.io/etcd/server/v3/embed), and several
// simulated machines, each with its own fake snapd serving a
// Kubernetes-like snap and a readiness check that passes some time after
// kube-apiserver restarted. Every machine runs the same rollout: restart
// k8s.kube-apiserver under the budget. It prints the timeline: who
// waited behind whom, acquired, restarted, became ready and released.
//
//	go run ./etcdbudget/cmd/rollout-demo [--machines 4] [--max 1] [--ready-after 300ms]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "rollout-demo:", err)
		os.Exit(1)
	}
}

// timeline collects events from every machine, and the intervals in
// which each machine's kube-apiserver was restarting or not yet ready (from
// its fake snapd's change and its readiness check, not the budget).
type timeline struct {
	mu        sync.Mutex
	start     time.Time
	lines     []line
	intervals [][2]time.Time
}

type line struct {
	at      time.Time
	machine string
	text    string
}

func (t *timeline) say(at time.Time, machine, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, line{at, machine, fmt.Sprintf(format, args...)})
}

// print writes the events in time order.
func (t *timeline) print(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sort.SliceStable(t.lines, func(i, j int) bool { return t.lines[i].at.Before(t.lines[j].at) })
	for _, l := range t.lines {
		fmt.Fprintf(w, "%8s  %-10s %s\n", fmt.Sprintf("+%.3fs", l.at.Sub(t.start).Seconds()), l.machine, l.text)
	}
}

// peak is the most machines restarting or not yet ready at one instant.
func (t *timeline) peak() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	peak := 0
	for _, a := range t.intervals {
		n := 0
		for _, b := range t.intervals {
			if !b[0].After(a[0]) && b[1].After(a[0]) {
				n++
			}
		}
		peak = max(peak, n)
	}
	return peak
}

func run(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("rollout-demo", flag.ContinueOnError)
	machines := fs.Int("machines", 4, "simulated machines")
	max := fs.Int("max", 1, "machines that may restart at once")
	readyAfter := fs.Duration("ready-after", 300*time.Millisecond, "how long kube-apiserver takes to serve again after its restart")
	settle := fs.Duration("settle", 100*time.Millisecond, "slot kept this long after ready")
	version := fs.Bool("version", false, "print the version and exit")
	fs.SetOutput(w) // --help on stdout; errors are returned
	fs.Usage = func() {
		fmt.Fprintln(w, "usage: rollout-demo [--machines N] [--max N] [--ready-after D] [--settle D]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version {
		v := "(devel)"
		if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
			v = bi.Main.Version
		}
		fmt.Fprintf(w, "rollout-demo %s (github.com/snapsvc/snapsvc/etcdbudget, %s)\n", v, runtime.Version())
		return nil
	}
	fmt.Fprintln(w, "starting a 3-member etcd cluster on loopback ...")
	cl, err := etcdtest.StartEmbedded(3)
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Fprintf(w, "etcd: %s\n%d machines restart k8s.kube-apiserver, budget %d, ready %s after the restart, settle %s\n\n",
		strings.Join(cl.Endpoints(), " "), *machines, *max, *readyAfter, *settle)
	tl := &timeline{start: time.Now()}
	var wg sync.WaitGroup
	errs := make(chan error, *machines)
	for i := range *machines {
		name := fmt.Sprintf("machine-%d", i+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := machine(name, cl.Endpoints(), *max, *readyAfter, *settle, tl); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if err := errors.Join(all...); err != nil {
		return err
	}
	tl.print(w)
	fmt.Fprintf(w, "\nrollout done in %s; at most %d machine(s) restarting or not yet ready at once (budget %d)\n",
		time.Since(tl.start).Round(time.Millisecond), tl.peak(), *max)
	return nil
}

// machine is one simulated machine: its own fake snapd, its own etcd
// client, the same rollout.
func machine(name string, endpoints []string, max int, readyAfter, settle time.Duration, tl *timeline) error {
	srv, err := fake.New(fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kube-apiserver", Daemon: "simple", Enabled: true, Active: true, StartDuration: 50 * time.Millisecond, StopDuration: 50 * time.Millisecond},
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
	}}))
	if err != nil {
		return err
	}
	defer srv.Close()
	cli, err := etcdtest.Client(endpoints...)
	if err != nil {
		return err
	}
	defer cli.Close()
	b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Max: max, TTL: 5 * time.Second, Holder: name})
	if err != nil {
		return err
	}
	// kube-apiserver's /readyz on this machine: ready readyAfter after
	// its last restart's change is done.
	var readyAt time.Time
	readyz := probe.Func(name+" /readyz", func(context.Context) error {
		chgs := srv.Changes()
		if n := len(chgs); n > 0 && (!chgs[n-1].Ready || time.Since(chgs[n-1].ReadyTime) < readyAfter) {
			return errors.New("503 not ready")
		}
		readyAt = time.Now()
		return nil
	})
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{
			Ready:  func(string) probe.Probe { return readyz },
			Probe:  probe.Options{Interval: 20 * time.Millisecond},
			Settle: settle,
			Progress: func(ev snapsvc.BudgetEvent) {
				switch ev.Kind {
				case "waiting":
					tl.say(ev.Time, name, "waits: slot held by %s, %d ahead", strings.Join(ev.Wait.Holders, ", "), ev.Wait.Ahead)
				case "acquired":
					tl.say(ev.Time, name, "acquired the slot after %s; restarting", ev.Waited.Round(time.Millisecond))
				case "ready":
					tl.say(ev.Time, name, "kube-apiserver ready; settling %s", settle)
				case "released":
					tl.say(ev.Time, name, "released the slot (held %s)", ev.Held.Round(time.Millisecond))
				case "lost":
					tl.say(ev.Time, name, "LOST the slot: %v", ev.Err)
				}
			},
		}))
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := c.Restart(context.Background(), []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
	if err != nil {
		return err
	}
	if ci, ok := srv.ChangeByID(res.ChangeID); ok {
		tl.say(ci.SpawnTime, name, "snapd change %s (restart) began", ci.ID)
		tl.say(ci.ReadyTime, name, "snapd change %s %s", ci.ID, ci.Status)
		tl.mu.Lock()
		tl.intervals = append(tl.intervals, [2]time.Time{ci.SpawnTime, readyAt})
		tl.mu.Unlock()
	}
	return nil
}
