package snapsvc_test

// What the processes of one machine share (machinewait.go,
// machineflight.go), with real processes: the test binary started again as
// workers, each one Client and one call, on the test's fake snapd.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// machineWorkerEnv carries a worker's spec (JSON) to the test binary.
const machineWorkerEnv = "SNAPSVC_TEST_MACHINE_WORKER"

// workerSpec is what one worker process does.
type workerSpec struct {
	Socket     string        // snapd's socket (REST), or the snap socket (Cookie set)
	Cookie     string        // snapctl mode, as a snap's own process, with this cookie
	LockDir    string        // the machine's lock directory
	Agent      string        // the User-Agent of its requests
	Names      []string      // what it restarts
	MaxElapsed time.Duration // its policy's MaxElapsedTime (0: the default)
	Poll       time.Duration // WithPollInterval (0: the default)
}

// workerResult is what a worker's call returned.
type workerResult struct {
	Change    string
	Shared    bool
	Attempts  int
	Conflicts int
	Err       string
	GaveUp    bool
	Retryable bool
	Start     time.Time // when the call began
	End       time.Time // when it returned
}

// runMachineWorker runs one worker when the test binary was started as
// one, and reports whether it did. Its log goes to stderr (JSON lines, the
// parent waits on them), its result to stdout.
func runMachineWorker() bool {
	raw := os.Getenv(machineWorkerEnv)
	if raw == "" {
		return false
	}
	var spec workerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "worker spec:", err)
		os.Exit(2)
	}
	p := retry.DefaultPolicy()
	if spec.MaxElapsed > 0 {
		p.MaxElapsedTime = spec.MaxElapsed
	}
	mode := []snapsvc.Option{snapsvc.WithSocket(spec.Socket), snapsvc.WithMode(snapsvc.ModeREST)}
	if spec.Cookie != "" {
		mode = []snapsvc.Option{snapsvc.WithSnapSocket(spec.Socket), snapsvc.WithCookie(spec.Cookie), snapsvc.WithSnap("k8s"), snapsvc.WithMode(snapsvc.ModeSnapctl)}
	}
	// Its events go to stderr too, one JSON line each ({"event": kind}):
	// the states a parent waits for.
	var emu sync.Mutex
	events := snapsvc.WithObserver(func(ev snapsvc.Event) {
		emu.Lock()
		defer emu.Unlock()
		json.NewEncoder(os.Stderr).Encode(map[string]string{"event": ev.Kind.String()})
	})
	opts := []snapsvc.Option{snapsvc.WithLockDir(spec.LockDir), snapsvc.WithPolicy(p), snapsvc.WithTransport(userAgent(spec.Agent)), events,
		snapsvc.WithLogger(slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))}
	if spec.Poll > 0 {
		opts = append(opts, snapsvc.WithPollInterval(spec.Poll))
	}
	c, err := snapsvc.New(append(mode, opts...)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := workerResult{Start: time.Now()}
	res, err := c.Restart(ctx, spec.Names, snapsvc.RestartOptions{})
	out.End = time.Now()
	c.Close()
	if res != nil {
		out.Change, out.Shared, out.Attempts, out.Conflicts = res.ChangeID, res.Shared, res.Attempts, res.Conflicts
	}
	if err != nil {
		var oe *snapsvc.OpError
		out.Err, out.GaveUp = err.Error(), errors.Is(err, snapsvc.ErrGaveUp)
		out.Retryable = errors.As(err, &oe) && oe.Retryable()
	}
	json.NewEncoder(os.Stdout).Encode(out)
	os.Exit(0)
	return true
}

// worker is a running worker process.
type worker struct {
	name string
	cmd  *exec.Cmd
	logs *logWatch // its log lines, as they come
	out  bytes.Buffer
	done chan error // its exit
}

// startWorker starts a worker doing spec.
func startWorker(t *testing.T, name string, spec workerSpec) *worker {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(spec)
	w := &worker{name: name, logs: newLogWatch(), done: make(chan error, 1)}
	w.cmd = exec.Command(exe, "-test.run=^$")
	w.cmd.Env = append(os.Environ(), machineWorkerEnv+"="+string(b))
	w.cmd.Stdout = &w.out
	stderr, err := w.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct {
				Msg   string `json:"msg"`
				Event string `json:"event"`
			}
			msg := sc.Text()
			if json.Unmarshal(sc.Bytes(), &line) == nil {
				msg = line.Msg + " " + sc.Text()
				if line.Event != "" {
					msg = "event " + line.Event
				}
			}
			w.logs.note(msg)
		}
	}()
	go func() {
		<-read // Wait closes the pipe: read it all first
		w.done <- w.cmd.Wait()
	}()
	t.Cleanup(func() {
		w.cmd.Process.Kill()
		<-w.done
	})
	return w
}

// awaitEvent waits for the worker's n-th event of kind, or its exit.
func (w *worker) awaitEvent(t *testing.T, ctx context.Context, kind snapsvc.EventKind, n int) {
	t.Helper()
	line := "event " + kind.String()
	for {
		seen := w.logs.seen(line)
		if w.logs.count(line) >= n {
			return
		}
		select {
		case <-seen:
		case err := <-w.done:
			w.done <- err
			t.Fatalf("worker %s exited (%v) before its event %s #%d; its log:\n%s", w.name, err, kind, n, w.logText())
		case <-ctx.Done():
			t.Fatalf("worker %s never had its event %s #%d; its log:\n%s", w.name, kind, n, w.logText())
		}
	}
}

// result waits for the worker's exit and returns its call's result.
func (w *worker) result(t *testing.T) workerResult {
	t.Helper()
	err := recvT(t, w.done)
	w.done <- err
	var r workerResult
	if err != nil || json.Unmarshal(w.out.Bytes(), &r) != nil {
		t.Fatalf("worker %s: %v, output %q; its log:\n%s", w.name, err, w.out.String(), w.logText())
	}
	return r
}

func (w *worker) logText() string {
	var b bytes.Buffer
	for _, l := range w.logs.all() {
		b.WriteString(l + "\n")
	}
	return b.String()
}

// acceptedAt returns when snapd got the request that made change id.
func acceptedAt(srv *fake.Server, id string) time.Time {
	for _, r := range srv.Requests() {
		if r.Change == id && r.Method == "POST" {
			return r.Time
		}
	}
	return time.Time{}
}

// kill -9 of the process that observes a blocker for the machine: the
// others never asked snapd anything while it observed; one of them takes
// over, and they see the blocker end within one poll interval; a call
// whose own bound ends meanwhile returns by it.
func TestMachineObserverKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(fake.Version257), fake.WithSnaps(k8sSnap(time.Millisecond)))
	ctx := ctxT(t)
	blk := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	const poll = 100 * time.Millisecond
	spec := func(agent, service string, bound time.Duration) workerSpec {
		return workerSpec{Socket: srv.SocketPath(), LockDir: filepath.Join(srv.Dir(), ".snapsvc-lock"), Agent: agent,
			Names: []string{"k8s." + service}, MaxElapsed: bound, Poll: poll}
	}
	a := startWorker(t, "a", spec("worker-a", "kubelet", 0))
	awaitWatcher(t, ctx, srv, "k8s")
	b := startWorker(t, "b", spec("worker-b", "containerd", 0))
	c := startWorker(t, "c", spec("worker-c", "kube-proxy", 1500*time.Millisecond))
	b.awaitEvent(t, ctx, snapsvc.EventConflict, 1) // following what a watches
	c.awaitEvent(t, ctx, snapsvc.EventConflict, 1)
	lateness := testclock.StartLateness()
	if err := a.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	for _, w := range []*worker{b, c} {
		if n := len(requestsOf(srv, "worker-"+w.name)); n != 0 {
			t.Errorf("worker %s sent %d requests while worker a observed", w.name, n)
		}
	}
	// c's bound ends while the blocker still holds, whoever observes.
	rc := c.result(t)
	bound := 1500 * time.Millisecond
	if !rc.GaveUp || !rc.Retryable || rc.Change != "" {
		t.Fatalf("worker c: %+v, want a retryable give-up", rc)
	}
	blk.Finish()
	rb := b.result(t)
	late := lateness.Stop()
	if rb.Err != "" || rb.Change == "" {
		t.Fatalf("worker b: %+v; its log:\n%s", rb, b.logText())
	}
	chg, _ := srv.ChangeByID(blk.ID())
	seen := acceptedAt(srv, rb.Change).Sub(chg.ReadyTime)
	took := rc.End.Sub(rc.Start)
	t.Logf("after the kill: worker c gave up %v into its %v bound; the blocker's end was seen, worker b's request accepted, %v after it (poll %v; timers up to %v late)",
		took, bound, seen, poll, late)
	if took > bound+scheduleEpsilon+late {
		t.Errorf("worker c returned %v after its call began, past its bound %v (+ %v, + lateness %v)", took, bound, scheduleEpsilon, late)
	}
	if seen > poll+scheduleEpsilon+late {
		t.Errorf("the blocker's end was seen %v after it, more than one poll (%v, + %v, + lateness %v)", seen, poll, scheduleEpsilon, late)
	}
	if b.logs.count("taking over")+c.logs.count("taking over") == 0 {
		t.Errorf("nobody took over from the killed observer")
	}
}

// Eight processes restart kubelet while a foreign change holds the snap:
// one change, all eight succeed with its id, kubelet restarted once, and
// the last of them returns at most 50 ms after the change is ready.
func TestMachineEightProcessesRestartOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(time.Millisecond)))
	ctx := ctxT(t)
	blk := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: "k8s"})
	var ws []*worker
	for i := range 8 {
		w := startWorker(t, fmt.Sprint(i), workerSpec{Socket: srv.SocketPath(), LockDir: filepath.Join(srv.Dir(), ".snapsvc-lock"),
			Agent: fmt.Sprintf("worker-%d", i), Names: []string{"k8s.kubelet"}})
		if i == 0 {
			awaitWatcher(t, ctx, srv, "k8s")
		} else {
			w.awaitEvent(t, ctx, snapsvc.EventJoined, 1)
		}
		ws = append(ws, w)
	}
	lateness := testclock.StartLateness()
	blk.Finish()
	var last time.Time
	var id string
	for _, w := range ws {
		r := w.result(t)
		if r.Err != "" || r.Change == "" {
			t.Fatalf("worker %s: %+v", w.name, r)
		}
		if id == "" {
			id = r.Change
		}
		if r.Change != id {
			t.Errorf("worker %s reports change %s, worker 0 %s", w.name, r.Change, id)
		}
		if r.End.After(last) {
			last = r.End
		}
	}
	late := lateness.Stop()
	if got := restartsOf(srv, "k8s.kubelet"); len(got) != 1 || got[0] != id {
		t.Fatalf("kubelet restarted by changes %v, want once, by %s", got, id)
	}
	chg, _ := srv.ChangeByID(id)
	after := last.Sub(chg.ReadyTime)
	t.Logf("change %s ready; the last of the 8 callers returned %v after (timers up to %v late meanwhile)", id, after, late)
	if after > 50*time.Millisecond+late {
		t.Errorf("the last caller returned %v after the change was ready, want at most 50ms (+ lateness %v)", after, late)
	}
}

// kill -9 of the process that leads identical restarts while it waits
// for a blocker (its request refused, not sent again yet): its joiners
// act themselves, and merge among themselves: one change for the three.
func TestMachineFlightLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(time.Millisecond)))
	ctx := ctxT(t)
	blk := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	spec := func(i int) workerSpec {
		return workerSpec{Socket: srv.SocketPath(), LockDir: filepath.Join(srv.Dir(), ".snapsvc-lock"),
			Agent: fmt.Sprintf("worker-%d", i), Names: []string{"k8s.kubelet"}}
	}
	leader := startWorker(t, "leader", spec(0))
	awaitWatcher(t, ctx, srv, "k8s")
	var ws []*worker
	for i := 1; i <= 3; i++ {
		w := startWorker(t, fmt.Sprint(i), spec(i))
		w.awaitEvent(t, ctx, snapsvc.EventJoined, 1)
		ws = append(ws, w)
	}
	if err := leader.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// One of them leads now (its flight's record made, as it waits the
	// blocker out), and the two others joined it.
	dir := lockDirOf(srv)
	if err := snapsvc.AwaitLockDir(ctx, dir, func() bool {
		rejoined := 0
		for _, w := range ws {
			if w.logs.count("event joined") >= 2 {
				rejoined++
			}
		}
		return rejoined == 2 && snapsvc.Flights(dir, "k8s") == 1 && snapsvc.Watching(dir, "k8s")
	}); err != nil {
		for _, w := range ws {
			t.Logf("worker %s's log:\n%s", w.name, w.logText())
		}
		t.Fatalf("after the leader's kill, not one leader and two joiners: %v", err)
	}
	blk.Finish()
	var id string
	for _, w := range ws {
		r := w.result(t)
		if r.Err != "" || r.Change == "" || (id != "" && r.Change != id) {
			t.Fatalf("worker %s: %+v (change %s before)", w.name, r, id)
		}
		id = r.Change
	}
	if got := restartsOf(srv, "k8s.kubelet"); len(got) != 1 {
		t.Errorf("kubelet restarted by changes %v, want once", got)
	}
}

// Inside a strictly confined snap: snapctl, without snap-refresh-observe
// (blind: the blocker cannot be listed), the lock directory under
// $SNAP_COMMON. Four processes restart four services while a blocker
// holds the snap: one retries on the blind cadence, the others send
// nothing until it got through; then four processes restart kubelet
// behind another blocker: one change.
func TestMachineSnapctlProcessesShare(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnapSocketObserveDenied(), fake.WithSnaps(k8sSnap(time.Millisecond)))
	ctx := ctxT(t)
	lockDir := filepath.Join(t.TempDir(), "var", "snap", "k8s", "common", ".snapsvc-lock") // $SNAP_COMMON/.snapsvc-lock
	spec := func(agent, service string) workerSpec {
		return workerSpec{Socket: srv.SnapSocketPath(), Cookie: srv.Cookie("k8s"), LockDir: lockDir, Agent: agent, Names: []string{"k8s." + service}}
	}
	blk := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	services := []string{"kubelet", "containerd", "kube-proxy", "kube-apiserver"}
	var ws []*worker
	for i, s := range services {
		w := startWorker(t, s, spec("worker-"+s, s))
		if i == 0 {
			awaitWatcherIn(t, ctx, lockDir, "k8s")
		} else {
			w.awaitEvent(t, ctx, snapsvc.EventConflict, 1) // following what the first watches
		}
		ws = append(ws, w)
	}
	// The watcher retries blind; the others wait.
	refused := len(srv.Requests())
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Requests() >= refused+3 }); err != nil {
		t.Fatal(err)
	}
	for _, s := range services[1:] {
		if n := len(requestsOf(srv, "worker-"+s)); n != 0 {
			t.Errorf("%s sent %d requests while another process waited the blocker out", s, n)
		}
	}
	blk.Finish()
	for _, w := range ws {
		if r := w.result(t); r.Err != "" {
			t.Fatalf("worker %s: %+v", w.name, r)
		}
	}
	for _, s := range services {
		if got := restartsOf(srv, "k8s."+s); len(got) != 1 {
			t.Errorf("%s restarted by changes %v, want once", s, got)
		}
	}

	blk = srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	ws = nil
	for i := range 4 {
		w := startWorker(t, fmt.Sprint(i), spec(fmt.Sprintf("merge-%d", i), "kubelet"))
		if i == 0 {
			awaitWatcherIn(t, ctx, lockDir, "k8s")
		} else {
			w.awaitEvent(t, ctx, snapsvc.EventJoined, 1)
		}
		ws = append(ws, w)
	}
	blk.Finish()
	for _, w := range ws {
		if r := w.result(t); r.Err != "" || (w.name != "0" && !r.Shared) {
			t.Fatalf("worker %s: %+v", w.name, r)
		}
	}
	if got := restartsOf(srv, "k8s.kubelet"); len(got) != 2 {
		t.Errorf("kubelet restarted by changes %v, want twice in all (once per part)", got)
	}
}

// A watcher that is stopped (SIGSTOP: Ctrl-Z, a debugger, a frozen
// cgroup) still holds its record's lock, and its facts still say busy:
// a process that came once snapd had finished the blocker sent nothing and
// gave up at its 2 s bound naming a change that had finished before it
// began. A stopped watcher beats no more: the newcomer deposes it once it
// has seen its beat stand still for peerSilence, makes its change, and the
// watcher, let go on, finds its place taken and makes its own.
func TestMachineStoppedWatcherIsDeposed(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithVersion(fake.Version257), fake.WithSnaps(k8sSnap(time.Millisecond)))
	ctx := ctxT(t)
	blk := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	spec := func(agent, service string, bound time.Duration) workerSpec {
		return workerSpec{Socket: srv.SocketPath(), LockDir: lockDirOf(srv), Agent: agent, Names: []string{"k8s." + service}, MaxElapsed: bound}
	}
	a := startWorker(t, "a", spec("worker-a", "kubelet", 0))
	awaitWatcher(t, ctx, srv, "k8s")
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer a.cmd.Process.Signal(syscall.SIGCONT)
	blk.Finish()
	const bound = 3 * time.Second
	b := startWorker(t, "b", spec("worker-b", "containerd", bound))
	rb := b.result(t)
	if rb.Err != "" || rb.Change == "" {
		t.Fatalf("worker b, with worker a stopped: %+v; want its restart within its %v bound; its log:\n%s", rb, bound, b.logText())
	}
	t.Logf("worker b made change %s %v after its call began", rb.Change, rb.End.Sub(rb.Start))
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if ra := a.result(t); ra.Err != "" || ra.Change == "" || ra.Change == rb.Change {
		t.Fatalf("worker a, let go on: %+v; want a change of its own; its log:\n%s", ra, a.logText())
	}
}

// The snap's lock, held by a process that was then stopped while its own
// change runs: the others waited for the lock until their bound. A holder
// that beats no more is deposed like a watcher: the newcomer takes the
// lock, meets the stopped process's change as a conflict (snapd's own
// record of it), waits it out and makes its change.
func TestMachineStoppedLockHolderIsDeposed(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	mc := fake.NewManualClock(stepT0)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithClock(mc), fake.WithSnaps(slowKubelet()))
	ctx := ctxT(t)
	spec := func(agent, service string, bound time.Duration) workerSpec {
		return workerSpec{Socket: srv.SocketPath(), LockDir: lockDirOf(srv), Agent: agent, Names: []string{"k8s." + service}, MaxElapsed: bound}
	}
	a := startWorker(t, "a", spec("worker-a", "kubelet", 0))
	running := waitNewChange(ctx, t, srv) // a holds the snap's lock while its change runs
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer a.cmd.Process.Signal(syscall.SIGCONT)
	const bound = 5 * time.Second
	b := startWorker(t, "b", spec("worker-b", "kube-proxy", bound))
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Conflicts() > 0 }); err != nil { // b refused: it holds the lock now
		t.Fatalf("worker b never met worker a's change: %v; its log:\n%s", err, b.logText())
	}
	if err := srv.AdvanceUntilReady(ctx, running); err != nil {
		t.Fatal(err)
	}
	rb := b.result(t)
	if rb.Err != "" || rb.Change == "" || rb.Change == running {
		t.Fatalf("worker b, with worker a stopped holding the snap's lock: %+v; its log:\n%s", rb, b.logText())
	}
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if ra := a.result(t); ra.Err != "" || ra.Change != running {
		t.Fatalf("worker a, let go on: %+v; want its change %s; its log:\n%s", ra, running, a.logText())
	}
}
