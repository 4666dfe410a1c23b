// Package demo is the rollout-demo command: a rolling restart under an
// etcd restart budget, self-contained (a 3-member etcd on loopback,
// simulated machines, each with its own fake snapd), and with --serve the
// same etcd kept running for snapsvc-rollout to try against.
//
// It is a package, not the command's main, so that the tests of
// snapsvc-rollout can run both commands in one script.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Main runs the command line of this process and returns its exit code.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
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

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitInterrupted = 130
)

const intro = `rollout-demo shows a rolling restart under an etcd restart budget, with
nothing to bring: it starts a 3-member etcd cluster on loopback (etcd's own
server, each member a child process) and several simulated machines, each
with its own fake snapd serving a Kubernetes-like snap and a readiness check
that passes some time after kube-apiserver restarted. Every machine restarts
k8s.kube-apiserver under the budget; the timeline says who waited behind
whom, acquired, restarted, became ready and released, and how many machines
were restarting or not ready at once.

--serve starts the same etcd and keeps it running until Ctrl-C (or SIGTERM),
which stops it and removes its data: it prints the export line of
ETCDCTL_ENDPOINTS to paste into another shell, where snapsvc-rollout runs
against it (status, pause, resume, a rollout against fakesnapd).

The etcd is an installed one when there is one (etcd in PATH, or Debian's
etcd-server's /usr/bin/etcd; $ROLLOUT_DEMO_ETCD names another, "build"
forces the next choice); else, from a clone of the repository, it builds
etcd's server from the etcdmember module beside etcdbudget's test harness
the first time (a few minutes, cached), with the go command.`

var exits = clistyle.ExitCodes{
	{Code: exitOK, Text: "the rollout completed within its budget; with --serve, etcd was stopped by Ctrl-C or SIGTERM"},
	{Code: exitFailed, Text: "etcd did not start, or a machine's restart failed"},
	{Code: exitUsage, Text: "usage error"},
	{Code: exitInterrupted, Text: "interrupted (Ctrl-C, SIGTERM) before the rollout completed"},
}

// options are the command's flags.
type options struct {
	machines, max      int
	readyAfter, settle time.Duration
	serve              bool
	envFile            string
}

// Run runs one command line of rollout-demo and returns its exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	ran, code := false, exitOK
	root := &cobra.Command{
		Use:   "rollout-demo [--machines N] [--max N] [--ready-after D] [--settle D]\n  rollout-demo --serve [--env-file FILE]",
		Short: "A rolling restart under an etcd restart budget, self-contained; or an etcd to try snapsvc-rollout against",
		Long:  exits.Help(intro),
		Example: `  rollout-demo --machines 5 --max 2
  rollout-demo --serve                        # then in another shell: the export line it printed,
  snapsvc-rollout status k8s.kube-apiserver   # and snapsvc-rollout against that etcd`,
		Annotations:           map[string]string{clistyle.ManLong: exits.Man(intro)},
		Args:                  cobra.NoArgs,
		ValidArgsFunction:     cobra.NoFileCompletions,
		DisableFlagsInUseLine: true, // Use lists the flags
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.check(c); err != nil {
				return &clistyle.UsageError{Msg: err.Error(), Cmd: c.CommandPath()}
			}
			ran = true
			var err error
			if o.serve {
				err = serve(c.Context(), o.envFile, stdout, stderr)
			} else {
				err = demo(c.Context(), o, stdout)
			}
			switch {
			case err == nil:
			case errors.Is(err, context.Canceled) && c.Context().Err() != nil:
				fmt.Fprintln(stderr, "error: interrupted")
				code = exitInterrupted
			default:
				fmt.Fprintf(stderr, "error: %v\n", err)
				code = exitFailed
			}
			return nil
		},
	}
	clistyle.Apply(root)
	fs := root.Flags()
	fs.SortFlags = false
	fs.IntVar(&o.machines, "machines", 4, "simulated machines")
	fs.IntVar(&o.max, "max", 1, "machines that may restart at once")
	fs.DurationVar(&o.readyAfter, "ready-after", 300*time.Millisecond, "how long kube-apiserver takes to serve again after its restart")
	fs.DurationVar(&o.settle, "settle", 100*time.Millisecond, "slot kept this long after ready")
	fs.BoolVar(&o.serve, "serve", false, "start the 3-member etcd, print its ETCDCTL_ENDPOINTS and keep it running until Ctrl-C (no rollout)")
	fs.StringVar(&o.envFile, "env-file", "", "with --serve: also write the export line to `FILE` (for \". FILE\" in another shell; removed on exit)")
	_, err := clistyle.Execute(ctx, root, args, stdout, stderr, func() bool { return ran })
	var ue *clistyle.UsageError
	switch {
	case err == nil:
		return code
	case errors.As(err, &ue):
		ue.Fprint(stderr)
		return exitUsage
	}
	fmt.Fprintf(stderr, "error: %v\n", err)
	return exitFailed
}

// check refuses flags that do not go together or out of range.
func (o *options) check(c *cobra.Command) error {
	if o.serve {
		for _, name := range []string{"machines", "max", "ready-after", "settle"} {
			if c.Flags().Changed(name) {
				return fmt.Errorf("--serve runs no rollout: --%s does not go with it", name)
			}
		}
		return nil
	}
	switch {
	case o.envFile != "":
		return errors.New("--env-file goes with --serve")
	case o.machines < 1:
		return fmt.Errorf("--machines %d: must be at least 1", o.machines)
	case o.max < 1:
		return fmt.Errorf("--max %d: must be at least 1", o.max)
	case o.readyAfter < 0 || o.settle < 0:
		return errors.New("--ready-after and --settle must not be negative")
	}
	return nil
}

// startEtcd starts the 3-member cluster on loopback with an installed
// etcd when there is one (etcdBinary), else with the member binary built
// from the repository's source (minutes on a cold cache, Ctrl-C ends it);
// then the members have 2 minutes to serve.
func startEtcd(ctx context.Context) (*etcdtest.Processes, error) {
	if etcd := etcdBinary(); etcd != "" {
		etcdtest.UseInstalledEtcd(etcd)
	} else if _, err := etcdtest.MemberBinary(); err != nil {
		return nil, fmt.Errorf("rollout-demo needs etcd: install it (Debian: apt install etcd-server; its service may stay stopped), or run the demo from a clone of the repository, which builds etcd's server with the go command: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cl, err := etcdtest.StartProcesses(ctx, 3)
	if err != nil {
		return nil, fmt.Errorf("starting etcd: %w", err)
	}
	return cl, nil
}

// etcdBinary is the installed etcd server the demo runs, "" for none:
// $ROLLOUT_DEMO_ETCD when set ("" or "build": the member built from the
// repository), else etcd in PATH, else Debian's /usr/bin/etcd.
func etcdBinary() string {
	if v, ok := os.LookupEnv("ROLLOUT_DEMO_ETCD"); ok {
		if v == "build" {
			return ""
		}
		return v
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd"
	}
	return ""
}

// etcdDescription says which etcd the demo runs.
func etcdDescription() string {
	if etcd := etcdBinary(); etcd != "" {
		return "the installed " + etcd
	}
	return "etcd's server built from the repository"
}

// demo runs the rollout of every simulated machine and prints the
// timeline.
func demo(ctx context.Context, o options, w io.Writer) error {
	fmt.Fprintf(w, "starting a 3-member etcd cluster on loopback (%s) ...\n", etcdDescription())
	cl, err := startEtcd(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Fprintf(w, "etcd: %s\n%d machines restart k8s.kube-apiserver, budget %d, ready %s after the restart, settle %s\n\n",
		strings.Join(cl.Endpoints(), " "), o.machines, o.max, o.readyAfter, o.settle)
	tl := &timeline{start: time.Now()}
	var wg sync.WaitGroup
	errs := make(chan error, o.machines)
	for i := range o.machines {
		name := fmt.Sprintf("machine-%d", i+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := machine(ctx, name, cl.Endpoints(), o.max, o.readyAfter, o.settle, tl); err != nil {
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
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	tl.print(w)
	fmt.Fprintf(w, "\nrollout done in %s; at most %d machine(s) restarting or not yet ready at once (budget %d)\n",
		time.Since(tl.start).Round(time.Millisecond), tl.peak(), o.max)
	return nil
}

// serve starts the cluster, prints (and with envFile writes) the export
// line of its endpoints, and keeps it until ctx ends: then it stops every
// member, removes their data and the env file.
func serve(ctx context.Context, envFile string, stdout, stderr io.Writer) error {
	fmt.Fprintf(stderr, "rollout-demo: starting a 3-member etcd cluster on loopback (%s) ...\n", etcdDescription())
	cl, err := startEtcd(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	line := "export ETCDCTL_ENDPOINTS=" + strings.Join(cl.Endpoints(), ",")
	if envFile != "" {
		if err := writeAtomic(envFile, line+"\n"); err != nil {
			return err
		}
		defer os.Remove(envFile)
	}
	fmt.Fprintln(stdout, line)
	fmt.Fprintf(stderr, `rollout-demo: etcd serves until Ctrl-C, which stops it and removes its data.
In another shell, run the export line above%s, then for example:
  snapsvc-rollout status k8s.kube-apiserver
  snapsvc-rollout pause --create --reason "trying it" k8s.kube-apiserver   # --create: no machine used the key yet
  snapsvc-rollout resume k8s.kube-apiserver
  fakesnapd --dir /tmp/machine-1 &          # a fake snapd with a k8s snap, as one machine
  snapsvc-rollout --socket /tmp/machine-1/snapd.socket --settle 5s k8s.kube-apiserver
`, envHint(envFile))
	<-ctx.Done()
	fmt.Fprintln(stderr, "rollout-demo: stopping etcd and removing its data")
	return nil
}

func envHint(envFile string) string {
	if envFile == "" {
		return ""
	}
	return " (or: . " + envFile + ")"
}

// writeAtomic writes data to path through a temporary file and a rename,
// so a reader never sees it half written.
func writeAtomic(path, data string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, werr := tmp.WriteString(data)
	cerr := tmp.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return nil
}

// machine is one simulated machine: its own fake snapd, its own etcd
// client, the same rollout.
func machine(ctx context.Context, name string, endpoints []string, max int, readyAfter, settle time.Duration, tl *timeline) error {
	// The demo runs as whoever runs it, in place of the machines' root
	// daemons: the fake lets it restart without sudo.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
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
	res, err := c.Restart(ctx, []string{"k8s.kube-apiserver"}, snapsvc.RestartOptions{})
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
