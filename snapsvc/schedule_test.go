package snapsvc_test

// The randomized schedule test: seeded schedules of concurrent callers,
// foreign changes and faults on the fake, with snapsvc's promises checked
// for every call from the fake's own record of what happened.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// Schedules and the seed of the first; SNAPSVC_SCHEDULES and
// SNAPSVC_SCHEDULE_SEED change them (a failing seed is printed so it can
// be replayed alone: SNAPSVC_SCHEDULES=1 SNAPSVC_SCHEDULE_SEED=N).
func scheduleRange(t *testing.T) (first uint64, n int) {
	first, n = 1, 1000
	if testing.Short() {
		n = 100
	}
	if v := os.Getenv("SNAPSVC_SCHEDULES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			t.Fatalf("SNAPSVC_SCHEDULES: %v", err)
		}
	}
	if v := os.Getenv("SNAPSVC_SCHEDULE_SEED"); v != "" {
		var err error
		if first, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("SNAPSVC_SCHEDULE_SEED: %v", err)
		}
	}
	return first, n
}

// callBound is the most any call may take: the policy's time (2s) or the
// call's deadline plus the look-up after an interrupted request (2s),
// with room for a loaded machine. A call past it is a hang.
const callBound = 20 * time.Second

// scheduleServices are the k8s services schedules act on.
var scheduleServices = []string{"containerd", "kubelet", "kube-proxy", "kube-apiserver"}

// sig is what a call asks: action, flags and the set of names.
type sig struct {
	action                  string
	enable, disable, reload bool
	names                   string // sorted, comma-separated
}

func (s sig) String() string {
	flags := ""
	switch {
	case s.enable:
		flags = " --enable"
	case s.disable:
		flags = " --disable"
	case s.reload:
		flags = " --reload"
	}
	return s.action + flags + " " + s.names
}

// sigOfRequest returns what a request to act asks: the body of a POST
// /v2/apps, or of a POST /v2/snapctl running a service command.
func sigOfRequest(r fake.Request) (sig, bool) {
	if r.Path == "/v2/snapctl" {
		return sigOfSnapctl(r.Body)
	}
	return sigOf(r.Body)
}

// sigOfSnapctl parses the body of a POST /v2/snapctl running a service
// command ("restart --reload k8s.kubelet").
func sigOfSnapctl(body string) (sig, bool) {
	var req struct {
		Args []string `json:"args"`
	}
	if json.Unmarshal([]byte(body), &req) != nil || len(req.Args) < 2 {
		return sig{}, false
	}
	g := sig{action: req.Args[0]}
	if g.action != "start" && g.action != "stop" && g.action != "restart" {
		return sig{}, false
	}
	var names []string
	for _, a := range req.Args[1:] {
		switch a {
		case "--enable":
			g.enable = true
		case "--disable":
			g.disable = true
		case "--reload":
			g.reload = true
		default:
			names = append(names, a)
		}
	}
	sort.Strings(names)
	g.names = strings.Join(slices.Compact(names), ",")
	return g, true
}

// sigOf parses the body of a POST /v2/apps.
func sigOf(body string) (sig, bool) {
	var inst struct {
		Action                  string
		Names                   []string
		Enable, Disable, Reload bool
	}
	if json.Unmarshal([]byte(body), &inst) != nil {
		return sig{}, false
	}
	names := slices.Clone(inst.Names)
	sort.Strings(names)
	names = slices.Compact(names)
	return sig{inst.Action, inst.Enable, inst.Disable, inst.Reload, strings.Join(names, ",")}, true
}

func (s sig) body() string {
	b, _ := json.Marshal(map[string]any{"action": s.action, "names": strings.Split(s.names, ","),
		"enable": s.enable, "disable": s.disable, "reload": s.reload})
	return string(b)
}

// call is one operation (or, with wait set, one WaitIdle) of a schedule
// and what came of it.
type call struct {
	wait     bool // a WaitIdle of snap k8s, not an operation
	client   int
	delay    time.Duration // after the schedule starts
	timeout  time.Duration // 0: no deadline of its own
	sig      sig
	start    time.Time
	end      time.Time
	res      *snapsvc.Result
	err      error
	overtime bool
	took     time.Duration // wall time from the call to its return
	// stacks: the process's goroutines when the call was still running
	// past its bound and the epsilon (what held it up, for the failure).
	stacks atomic.Pointer[string]
}

// bound is the most the call may take: its deadline, or its client's
// policy's MaxElapsedTime when that comes first (a wait: its deadline, or
// callBound), schedule epsilon aside.
func (cl *call) bound(s *schedule) time.Duration {
	b := s.policies[cl.client].MaxElapsedTime
	if cl.wait {
		b = callBound
	}
	if cl.timeout > 0 && cl.timeout < b {
		b = cl.timeout
	}
	return b
}

// triedAny reports whether the call made any attempt to act (its result's
// or error's count).
func (cl *call) triedAny(s *schedule) bool {
	var oe *snapsvc.OpError
	return cl.res != nil && cl.res.Attempts > 0 || errors.As(cl.err, &oe) && oe.Attempts > 0
}

// overshoot is how long past its bound the call returned (0: within).
func (cl *call) overshoot(s *schedule) time.Duration { return max(cl.took-cl.bound(s), 0) }

// scheduleEpsilon is how far past its bound any call of a schedule may
// return: the README's stated epsilon.
const scheduleEpsilon = 50 * time.Millisecond

// schedule is one seeded run.
type schedule struct {
	seed       uint64
	rng        *rand.Rand
	version    fake.Version
	late       time.Duration // the socket appears this late (0: at once)
	stateFile  bool          // the fake keeps a state file the clients watch
	apps       []fake.App
	clients    int
	separate   []bool // client i has a registry of its own (another "process")
	calls      []*call
	faults     []string // what was injected, for the counts and the report
	clientList []*snapsvc.Client
	policies   []retry.Policy // each client's own
	skew       time.Duration  // snapd's clock is this far off the client's
	step       time.Duration  // ... then steps by this much (the machine's wall clock: NTP, a VM resumed)
	stepAt     time.Duration  // ... this far into the run
	clock      *scheduleClock // snapd's clock, which says when each of its readings was on the client's
	holds      []hold
	snapctl    bool          // the clients act through snapctl, from inside the snap
	blindCtl   bool          // ... without snap-refresh-observe: snapd refuses them its changes
	away       time.Duration // snapd stops listening this long, awayAt into the run (0: never)
	awayAt     time.Duration
	budget     *schedBudget  // every client's restart budget (nil: none)
	stopsToo   bool          // the budget also takes stops (BudgetOptions.StopsAndStarts)
	probes     bool          // the budget checks the services' readiness (BudgetOptions.Ready)
	maxHold    time.Duration // BudgetOptions.MaxHold, short enough to run out while changes run (0: the default)
	unbudgeted []bool        // client i has no restart budget (the others' do)
	closing    bool          // a client is closed mid-run (its slots are abandoned while their change may run)
	slots      slotLog       // when each budget slot was held
	sends      sendLog       // every request to act the clients tried to send
	mu         sync.Mutex
}

// sendLog records, on the client side, every request to act a client
// tried to send, and whether its send-by (a budget fence's confirmation)
// kept it from being written: snapd's record misses the first kind when
// snapd is away, and never sees the second.
type sendLog struct {
	mu    sync.Mutex
	sends []send
}

type send struct {
	client  int
	at      time.Time
	req     fake.Request // Method, Path and Body only
	refused bool         // not written: its send-by had passed
	failed  bool         // no answer came (the round trip failed)
}

// tried reports whether client tried to send a request doing g at or
// after from that its send-by did not keep from being written.
func (l *sendLog) tried(client int, g sig, from time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, sd := range l.sends {
		if sd.client != client || sd.refused || sd.at.Before(from) {
			continue
		}
		if sg, ok := sigOfRequest(sd.req); ok && sg == g {
			return true
		}
	}
	return false
}

// record wraps client i's transport to record its requests to act.
func (l *sendLog) record(i int) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method != "POST" || r.Body == nil {
				return rt.RoundTrip(r)
			}
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return nil, err
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			at := time.Now()
			rsp, err := rt.RoundTrip(r)
			l.mu.Lock()
			l.sends = append(l.sends, send{client: i, at: at, req: fake.Request{Method: r.Method, Path: r.URL.Path, Body: string(body)},
				refused: err != nil && strings.Contains(err.Error(), "send-by time had passed"), failed: err != nil})
			l.mu.Unlock()
			return rsp, err
		})
	}
}

// dims names the dimensions the schedule exercises (the summary counts
// schedules per dimension).
func (s *schedule) dims() []string {
	var d []string
	switch {
	case s.snapctl && s.blindCtl:
		d = append(d, "snapctl without snap-refresh-observe")
	case s.snapctl:
		d = append(d, "snapctl with snap-refresh-observe")
	case s.version == fake.Version257:
		d = append(d, "REST without notices")
	default:
		d = append(d, "REST with notices")
	}
	if s.stateFile && !s.snapctl {
		d = append(d, "state file watched")
	}
	if s.skew != 0 {
		d = append(d, map[bool]string{false: "clock skew, REST", true: "clock skew, snapctl"}[s.snapctl])
	}
	if s.step != 0 {
		d = append(d, map[bool]string{false: "snapd's clock steps back", true: "snapd's clock steps forward"}[s.step > 0])
	}
	if s.away > 0 {
		d = append(d, "snapd away longer than a MaxUnreachable")
		if s.budget != nil {
			d = append(d, "snapd away during budget holds")
		}
	}
	waits, policies := 0, map[time.Duration]bool{}
	for _, cl := range s.calls {
		if cl.wait {
			waits++
			policies[s.policies[cl.client].MaxUnreachable] = true
		}
	}
	if waits > 1 && len(policies) > 1 {
		d = append(d, "shared waits, callers with different policies")
	}
	if groups := s.identical(); len(groups) > 0 {
		d = append(d, "identical restarts from several clients")
		if slices.ContainsFunc(groups, func(g identicalGroup) bool { return g.separate }) {
			d = append(d, "identical restarts from several processes")
		}
	}
	if s.budget != nil {
		d = append(d, "budget: "+s.budget.behaviour)
		if s.probes {
			d = append(d, "budget: readiness probes")
		}
		if s.maxHold > 0 {
			d = append(d, "budget: MaxHold while changes run")
		}
		if slices.Contains(s.unbudgeted, true) {
			d = append(d, "budget: some clients unbudgeted")
			for _, g := range s.identical() {
				if slices.ContainsFunc(g.calls, func(cl *call) bool { return s.unbudgeted[cl.client] }) &&
					slices.ContainsFunc(g.calls, func(cl *call) bool { return !s.unbudgeted[cl.client] }) {
					d = append(d, "budget: budgeted and unbudgeted identical restarts")
					break
				}
			}
		}
		if s.stopsToo && s.stopThenFailedStart() {
			d = append(d, "budget: a failed start after a kept stop")
		}
	}
	if s.closing {
		d = append(d, "Close mid-run")
	}
	return d
}

// identicalGroup is one request that several clients of a schedule make.
type identicalGroup struct {
	sig      sig
	calls    []*call
	separate bool // from clients of more than one process
}

// identical returns the schedule's requests made by more than one client.
func (s *schedule) identical() []identicalGroup {
	by := map[sig][]*call{}
	var order []sig
	for _, cl := range s.calls {
		if cl.wait {
			continue
		}
		if by[cl.sig] == nil {
			order = append(order, cl.sig)
		}
		by[cl.sig] = append(by[cl.sig], cl)
	}
	var out []identicalGroup
	for _, g := range order {
		if len(by[g]) < 2 {
			continue
		}
		grp := identicalGroup{sig: g, calls: by[g]}
		for _, cl := range by[g] {
			grp.separate = grp.separate || s.separate[cl.client]
		}
		out = append(out, grp)
	}
	return out
}

// hold is an answer held until release after the schedule's start.
type hold struct {
	ch      chan struct{}
	release time.Duration
}

// scheduleCounts are printed at the end.
type scheduleCounts struct {
	schedules, calls, succeeded, failed, faults, checks, foreignIdentical, outcomeUnknown, merged int
	waits, budgetedChanges, worstBlindWindow                                                      int
	// The invariants: each must stay 0.
	overBound, releasedEarly, grantsWithoutChange, doubled int
	// What the budget did: grants (unbudgeted among them), refusals, and
	// changes whose slot the budget took away while they ran.
	grants, unbudgetedGrants, refusals, lostCovers int
	// Issue 41: slots abandoned (Close, MaxHold), stops whose services
	// stayed down until a start (or the end) judged, and budgeted
	// restarts merged into another budgeted one, judged by their own slot.
	abandoned, keptStops, joinedBudgeted int
	maxOvershoot, maxLateness            time.Duration
	dims                                 map[string]int
}

// add adds c's counts to t.
func (t *scheduleCounts) add(c scheduleCounts) {
	t.schedules++
	t.calls += c.calls
	t.succeeded += c.succeeded
	t.failed += c.failed
	t.faults += c.faults
	t.checks += c.checks
	t.foreignIdentical += c.foreignIdentical
	t.merged += c.merged
	t.outcomeUnknown += c.outcomeUnknown
	t.waits += c.waits
	t.budgetedChanges += c.budgetedChanges
	t.overBound += c.overBound
	t.releasedEarly += c.releasedEarly
	t.grantsWithoutChange += c.grantsWithoutChange
	t.doubled += c.doubled
	t.grants += c.grants
	t.unbudgetedGrants += c.unbudgetedGrants
	t.refusals += c.refusals
	t.lostCovers += c.lostCovers
	t.abandoned += c.abandoned
	t.keptStops += c.keptStops
	t.joinedBudgeted += c.joinedBudgeted
	t.worstBlindWindow = max(t.worstBlindWindow, c.worstBlindWindow)
	t.maxOvershoot = max(t.maxOvershoot, c.maxOvershoot)
	t.maxLateness = max(t.maxLateness, c.maxLateness)
	if t.dims == nil {
		t.dims = map[string]int{}
	}
	for d, n := range c.dims {
		t.dims[d] += n
	}
}

func TestRandomizedSchedules(t *testing.T) {
	first, n := scheduleRange(t)
	var total scheduleCounts
	// The runtime's network poller opens its descriptors on first use, for
	// good: start it before counting, or a replay of one seed (the first
	// network use of its process) counts them as a leak.
	if l, err := net.Listen("unix", filepath.Join(t.TempDir(), "warm")); err == nil {
		l.Close()
	}
	before := leakCounts()
	for seed := first; seed < first+uint64(n); seed++ {
		c, err := runSchedule(t, seed)
		if err != nil {
			t.Fatalf("schedule seed %d: %v\nreplay: SNAPSVC_SCHEDULES=1 SNAPSVC_SCHEDULE_SEED=%d go test -race -run TestRandomizedSchedules ./snapsvc", seed, err, seed)
		}
		total.add(c)
	}
	t.Logf("schedules %d, calls %d (%d succeeded, %d of them merged into an identical restart; %d failed, %d with an unknown outcome; %d shared waits), faults %d, foreign identical changes %d, checks %d",
		total.schedules, total.calls, total.succeeded, total.merged, total.failed, total.outcomeUnknown, total.waits, total.faults, total.foreignIdentical, total.checks)
	t.Logf("calls over their bound: %d (max overshoot %v, epsilon %v plus the machine's timer lateness, at most %v); slots released while their change ran or before it was ready: %d of %d budgeted changes; grants without their change: %d of %d grants (%d unbudgeted; %d refusals); doubled restarts: %d; changes whose slot the budget took away while they ran: %d; worst 1 s window of a blind wait: %d requests (limit 20)",
		total.overBound, total.maxOvershoot.Round(time.Millisecond), scheduleEpsilon, total.maxLateness.Round(time.Millisecond), total.releasedEarly, total.budgetedChanges,
		total.grantsWithoutChange, total.grants, total.unbudgetedGrants, total.refusals, total.doubled, total.lostCovers, total.worstBlindWindow)
	t.Logf("budget, issue 41: slots abandoned (Close, MaxHold, a lost slot beside them) %d; budgeted stops whose slot stayed held while their service was down %d; budgeted restarts merged into another budgeted one, covered by their own slot %d",
		total.abandoned, total.keptStops, total.joinedBudgeted)
	var dims []string
	for d := range total.dims {
		dims = append(dims, d)
	}
	sort.Strings(dims)
	var b strings.Builder
	for _, d := range dims {
		fmt.Fprintf(&b, "\n  %4d  %s", total.dims[d], d)
	}
	t.Logf("schedules per dimension:%s", b.String())
	if after := settledLeakCounts(before); after.exceeds(before) {
		t.Errorf("leak over the schedules: before %+v, after %+v", before, after)
	}
	if n >= 100 && (total.succeeded == 0 || total.failed == 0 || total.faults == 0) {
		t.Fatalf("schedules too tame to show anything: %+v", total)
	}
	if n >= 1000 {
		for _, d := range scheduleDimensions {
			if total.dims[d] == 0 {
				t.Errorf("no schedule of %d exercised %q", n, d)
			}
		}
	}
}

// scheduleDimensions are the dimensions a full run must exercise.
var scheduleDimensions = []string{
	"REST with notices", "REST without notices", "state file watched",
	"snapctl with snap-refresh-observe", "snapctl without snap-refresh-observe",
	"clock skew, REST", "clock skew, snapctl", "snapd's clock steps back", "snapd's clock steps forward",
	"snapd away longer than a MaxUnreachable", "snapd away during budget holds",
	"shared waits, callers with different policies", "Close mid-run",
	"identical restarts from several clients", "identical restarts from several processes",
	"budget: " + budgetGrant, "budget: " + budgetUnbudgeted, "budget: " + budgetFailOpen, "budget: " + budgetLost,
	"budget: " + budgetSlowFence, "budget: " + budgetExpired, "budget: " + budgetRefused, "budget: " + budgetSlowFree,
	"budget: readiness probes",
}

func runSchedule(t *testing.T, seed uint64) (scheduleCounts, error) {
	s := planSchedule(seed)
	opts := []fake.Option{fake.AllowNonRoot(), fake.WithVersion(s.version), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: s.apps})}
	if s.blindCtl {
		opts = append(opts, fake.WithSnapSocketObserveDenied())
	}
	s.clock = newScheduleClock(s.skew, s.step)
	opts = append(opts, fake.WithClock(s.clock))
	if s.stateFile {
		opts = append(opts, fake.WithStateFile())
	}
	if s.late > 0 {
		opts = append(opts, fake.WithoutListening())
	}
	srv, err := fake.New(opts...)
	if err != nil {
		return scheduleCounts{}, err
	}
	defer srv.Close()
	clients, err := s.newClients(t, srv)
	if err != nil {
		return scheduleCounts{}, err
	}
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	s.clientList = clients
	if s.skew != 0 {
		// A daemon that has run a while: each client has made changes of
		// its own, and learned from them how snapd's clock reads (in
		// snapctl mode it finds its second by snapd's change counter,
		// which the first's listing told it).
		warm := 1
		if s.snapctl {
			warm = 2
		}
		for i, c := range clients {
			for range warm {
				if _, err := c.Restart(context.Background(), []string{"k8s.k8s-warm"}, snapsvc.RestartOptions{}); err != nil {
					return scheduleCounts{}, fmt.Errorf("client %d's warm-up change: %w", i, err)
				}
			}
		}
	}
	held := s.injectFaults(srv)
	base := time.Now()
	if s.step != 0 {
		s.faults = append(s.faults, fmt.Sprintf("snapd's clock steps %v at %v", s.step, s.stepAt))
		s.clock.stepAt(base.Add(s.stepAt))
	}
	lateness := testclock.StartLateness()
	var wg sync.WaitGroup
	// The workload: calls, foreign changes and daemon-level faults, each
	// at its time after the start.
	s.plantEvents(srv, base, &wg)
	for _, cl := range s.calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d := time.Until(base.Add(cl.delay)); d > 0 {
				time.Sleep(d) // the workload's own timing, not synchronisation
			}
			s.run(srv, clients[cl.client], cl)
		}()
	}
	wg.Wait()
	late := lateness.Stop()
	for _, ch := range held {
		s.release(ch)
	}
	// Let every request be handled (one acted on late, FaultLate, is
	// logged once handled, maybe after the call that sent it adopted its
	// change) and every change end before reading the record.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.InFlight() == 0 }); err != nil {
		return scheduleCounts{}, fmt.Errorf("requests still in flight: %v", err)
	}
	srv.ClearFaults()
	for _, ci := range srv.Changes() {
		if !ci.Ready {
			if fc := srv.Change(ci.ID); fc != nil {
				fc.Finish()
			}
		}
	}
	if err := srv.WaitIdle(ctx); err != nil {
		return scheduleCounts{}, fmt.Errorf("snapd never idle: %v", err)
	}
	counts, err := s.check(srv, late)
	if err != nil || s.budget == nil {
		return counts, err
	}
	// Close waits for the releases it owns (each well under its
	// ReleaseTimeout here): after it, no slot may still be held.
	for _, c := range clients {
		c.Close()
	}
	s.budget.close()
	left, abandoned := s.budget.stillHeld()
	if left > 0 {
		return counts, fmt.Errorf("restart budget: %d slot(s) still held after every client was closed, neither released nor abandoned (faults %v)", left, s.faults)
	}
	counts.abandoned += abandoned
	counts.checks++
	return counts, nil
}

// planSchedule draws a schedule from seed.
func planSchedule(seed uint64) *schedule {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	s := &schedule{seed: seed, rng: rng}
	s.version = []fake.Version{fake.Version257, fake.Version268, fake.Version277}[rng.IntN(3)]
	s.stateFile = rng.IntN(2) == 0
	if rng.IntN(3) == 0 {
		// Inside the snap: snapctl, with or without snap-refresh-observe
		// (on 2.57 the snap socket refuses the changes to everyone).
		s.snapctl = true
		s.blindCtl = s.version == fake.Version257 || rng.IntN(2) == 0
		s.stateFile = false // a confined snap cannot see /var/lib/snapd
	}

	if rng.IntN(8) == 0 {
		s.late = time.Duration(1+rng.IntN(30)) * time.Millisecond
	} else if rng.IntN(8) == 0 {
		// snapd goes away mid-run for longer than some clients'
		// MaxUnreachable (50 ms or 500 ms), while their changes, and
		// budget slots held in the background, go on.
		s.away, s.awayAt = time.Duration(100+rng.IntN(500))*time.Millisecond, time.Duration(rng.IntN(30))*time.Millisecond
	} else if rng.IntN(4) == 0 {
		// snapd's clock ahead or behind the client's, by up to a second.
		// Each client has made a change of its own before the workload
		// (a daemon that has run a while): it has learned how snapd's
		// clock reads. (Before that it takes snapd's clock to read its
		// own, as on one machine they do.)
		s.skew = time.Duration(rng.IntN(2001)-1000) * time.Millisecond
	}
	// The machine's wall clock steps mid-run (an NTP step, a VM resumed):
	// snapd stamps its changes by it, where the clients must decide by
	// their monotonic clocks. Here snapd's clock alone steps, which covers
	// the real case's every comparison of a time read before the step
	// with one read after it. Drawn from a stream of its own.
	if st := rand.New(rand.NewPCG(seed, seed^0x57e9)); st.IntN(6) == 0 {
		s.step = []time.Duration{-5 * time.Minute, -3 * time.Second, -400 * time.Millisecond, 400 * time.Millisecond, 3 * time.Second, 5 * time.Minute}[st.IntN(6)]
		s.stepAt = time.Duration(st.IntN(30)) * time.Millisecond
	}
	s.apps = append(s.apps, fake.App{Name: "k8s-warm", Daemon: "simple", Enabled: true, Active: true})
	for _, name := range scheduleServices {
		a := fake.App{Name: name, Daemon: "simple", Enabled: rng.IntN(2) == 0, Active: rng.IntN(2) == 0,
			StartDuration: time.Duration(rng.IntN(3)) * time.Millisecond, StopDuration: time.Duration(rng.IntN(3)) * time.Millisecond}
		if rng.IntN(6) == 0 {
			// A slow service: a call's deadline may fire mid-change.
			a.StartDuration, a.StopDuration = time.Duration(rng.IntN(40))*time.Millisecond, time.Duration(rng.IntN(40))*time.Millisecond
		}
		if rng.IntN(12) == 0 {
			a.FailStart = fake.SystemctlJobFailed("k8s", name)
		}
		s.apps = append(s.apps, a)
	}
	s.clients = 1 + rng.IntN(3)
	for i := 0; i < s.clients; i++ {
		s.separate = append(s.separate, i > 0 && rng.IntN(2) == 0)
		// Each client its own bounds: callers that share a wait apply
		// their own to what it observes.
		p := testPolicy()
		p.MaxUnreachable = []time.Duration{50 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second}[rng.IntN(3)]
		p.MaxElapsedTime = []time.Duration{time.Second, 2 * time.Second}[rng.IntN(2)]
		s.policies = append(s.policies, p)
	}
	seen := map[sig]bool{}
	for n := 1 + rng.IntN(5); len(s.calls) < n; {
		g := s.randomSig()
		if seen[g] {
			continue // distinct calls, so the record tells whose change is whose
		}
		seen[g] = true
		cl := &call{client: rng.IntN(s.clients), delay: time.Duration(rng.IntN(20)) * time.Millisecond, sig: g}
		if rng.IntN(5) == 0 {
			cl.timeout = time.Duration(1+rng.IntN(40)) * time.Millisecond
		}
		s.calls = append(s.calls, cl)
	}
	// The same restart from two or three clients (other processes, where
	// they are separate): they may merge, in the process (processflight.go) or
	// through the lock directory (machineflight.go), and each must still
	// keep every promise. Drawn from a stream of its own, so that the rest
	// of each seed's schedule is what it was before.
	if dup := rand.New(rand.NewPCG(seed, seed^0xd0b1e)); s.clients > 1 && dup.IntN(3) == 0 {
		g := sig{action: "restart", names: "k8s." + scheduleServices[dup.IntN(len(scheduleServices))], reload: dup.IntN(4) == 0}
		if !seen[g] {
			seen[g] = true
			for i := range min(s.clients, 2+dup.IntN(2)) {
				cl := &call{client: i, delay: time.Duration(dup.IntN(20)) * time.Millisecond, sig: g}
				if dup.IntN(5) == 0 {
					cl.timeout = time.Duration(1+dup.IntN(40)) * time.Millisecond
				}
				s.calls = append(s.calls, cl)
			}
		}
	}
	// Callers waiting for the snap to be idle, from clients with their
	// own policies: they share one wait where their clients can.
	for n := rng.IntN(4); n > 0; n-- {
		s.calls = append(s.calls, &call{wait: true, client: rng.IntN(s.clients), delay: time.Duration(rng.IntN(20)) * time.Millisecond,
			timeout: time.Duration(20+rng.IntN(300)) * time.Millisecond})
	}
	if rng.IntN(3) == 0 {
		// A restart budget, one behaviour of the budgetBehaviours per
		// schedule; every call must keep its promises under each.
		s.budget = newSchedBudget(budgetBehaviours[rng.IntN(len(budgetBehaviours))], rng.Uint64(), &s.slots)
		s.stopsToo = rng.IntN(2) == 0
		s.probes = rng.IntN(3) == 0
		// Issue 41's dimensions, from a stream of their own (the rest of
		// each seed's schedule is what it was): a MaxHold that runs out
		// while changes run, clients without a budget beside budgeted
		// ones (whose identical restarts must not merge into theirs), and
		// a start that fails after a budgeted stop kept its slot.
		dim := rand.New(rand.NewPCG(seed, seed^0x41))
		if dim.IntN(3) == 0 {
			s.maxHold = time.Duration(10+dim.IntN(40)) * time.Millisecond
		}
		s.unbudgeted = make([]bool, s.clients)
		if s.clients > 1 && dim.IntN(3) == 0 {
			s.unbudgeted[dim.IntN(s.clients)] = true
		}
		stopSig := sig{action: "stop", names: "k8s." + scheduleServices[dim.IntN(len(scheduleServices))]}
		startSig := sig{action: "start", names: stopSig.names}
		if s.stopsToo && dim.IntN(3) == 0 && !seen[stopSig] && !seen[startSig] { // distinct calls (the judge tells changes apart by them)
			seen[stopSig], seen[startSig] = true, true
			name := strings.TrimPrefix(stopSig.names, "k8s.")
			for i := range s.apps {
				if s.apps[i].Name == name {
					s.apps[i].Active, s.apps[i].FailStart = true, fake.SystemctlJobFailed("k8s", name)
				}
			}
			client := dim.IntN(s.clients)
			s.calls = append(s.calls,
				&call{client: client, sig: stopSig, delay: time.Duration(dim.IntN(10)) * time.Millisecond},
				&call{client: client, sig: startSig, delay: time.Duration(10+dim.IntN(20)) * time.Millisecond})
		}
	}
	return s
}

// stopThenFailedStart reports whether a client stops a service whose start
// fails, and starts it after.
func (s *schedule) stopThenFailedStart() bool {
	for _, a := range s.apps {
		if a.FailStart == "" {
			continue
		}
		stopped := map[int]bool{}
		for _, cl := range s.calls {
			if cl.sig.action == "stop" && cl.sig.names == "k8s."+a.Name {
				stopped[cl.client] = true
			}
			if cl.sig.action == "start" && cl.sig.names == "k8s."+a.Name && stopped[cl.client] {
				return true
			}
		}
	}
	return false
}

func (s *schedule) randomSig() sig {
	rng := s.rng
	var names []string
	if rng.IntN(6) == 0 {
		names = []string{"k8s"}
	} else {
		for _, n := range scheduleServices {
			if rng.IntN(3) == 0 {
				names = append(names, "k8s."+n)
			}
		}
		if len(names) == 0 {
			names = []string{"k8s." + scheduleServices[rng.IntN(len(scheduleServices))]}
		}
	}
	sort.Strings(names)
	g := sig{names: strings.Join(names, ",")}
	switch rng.IntN(6) {
	case 0:
		g.action = "start"
	case 1:
		g.action, g.enable = "start", true
	case 2:
		g.action = "stop"
	case 3:
		g.action, g.disable = "stop", true
	case 4:
		g.action = "restart"
	default:
		g.action, g.reload = "restart", true
	}
	return g
}

// testPolicy keeps schedules short: every bound is small, so a hang shows
// as a call past callBound.
func testPolicy() retry.Policy {
	return retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxConflictInterval: 5 * time.Millisecond,
		MaxElapsedTime: 2 * time.Second, MaxUnreachable: 500 * time.Millisecond, RedialInterval: 2 * time.Millisecond}
}

func (s *schedule) newClients(t *testing.T, srv *fake.Server) ([]*snapsvc.Client, error) {
	var out []*snapsvc.Client
	for i := 0; i < s.clients; i++ {
		sock := srv.SocketPath()
		if s.snapctl {
			sock = srv.SnapSocketPath()
		}
		if s.separate[i] {
			// Another path to the same socket: a lock registry of its own,
			// as another process has, sharing the file locks.
			dir, err := os.MkdirTemp("", "snapsvc-proc")
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			target := sock
			sock = filepath.Join(dir, filepath.Base(target))
			if err := os.Symlink(target, sock); err != nil {
				return nil, err
			}
		}
		opts := []snapsvc.Option{snapsvc.WithPolicy(s.policies[i]), snapsvc.WithPollInterval(2 * time.Millisecond),
			snapsvc.WithLockDir(filepath.Join(srv.Dir(), ".locks")), snapsvc.WithTransport(chain(userAgent(clientAgent(i)), s.sends.record(i))),
			snapsvc.WithWallClock(s.clock.wall)}
		if s.snapctl {
			// Inside the snap: snapctl on the snap socket, which is also
			// where the changes are read from (and refused, without
			// snap-refresh-observe); no state file.
			opts = append(opts, snapsvc.WithSnapSocket(sock), snapsvc.WithCookie(srv.Cookie("k8s")), snapsvc.WithSnap("k8s"), snapsvc.WithMode(snapsvc.ModeSnapctl))
		} else {
			opts = append(opts, snapsvc.WithSocket(sock), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithStateFile(srv.StateFile()))
		}
		if os.Getenv("SNAPSVC_SCHEDULE_LOG") != "" {
			// Replaying a seed: the library's log on stderr.
			opts = append(opts, snapsvc.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("client", i)))
		}
		if s.budget != nil && !s.unbudgeted[i] {
			bo := snapsvc.BudgetOptions{StopsAndStarts: s.stopsToo, MaxHold: s.maxHold}
			if s.probes {
				// A service is ready once snapd reports it active (stops
				// under StopsAndStarts keep their slots for the start).
				bo.Ready = func(name string) probe.Probe {
					snap, app, _ := strings.Cut(name, ".")
					return probe.Func("active "+name, func(context.Context) error {
						if app == "" {
							return nil
						}
						if st, ok := srv.Service(snap, app); !ok || !st.Active {
							return errors.New(name + " not active")
						}
						return nil
					})
				}
				bo.Probe = probe.Options{Interval: 5 * time.Millisecond, MaxWait: time.Second}
			}
			opts = append(opts, snapsvc.WithRestartBudget(s.budget, bo))
		}
		c, err := snapsvc.New(opts...)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// clientAgent is the User-Agent of client i's requests, so the fake's
// record tells whose request each is.
func clientAgent(i int) string { return fmt.Sprintf("snapsvc-client-%d", i) }

// userAgent wraps a transport to send ua.
func userAgent(ua string) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			r = r.Clone(r.Context())
			r.Header.Set("User-Agent", ua)
			return rt.RoundTrip(r)
		})
	}
}

// chain applies the transport wrappers in order (the first outermost).
func chain(wraps ...func(http.RoundTripper) http.RoundTripper) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		for i := len(wraps) - 1; i >= 0; i-- {
			rt = wraps[i](rt)
		}
		return rt
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// injectFaults breaks some answers. It returns the channels holding
// answers, closed at the end.
func (s *schedule) injectFaults(srv *fake.Server) []chan struct{} {
	rng := s.rng
	var held []chan struct{}
	nth := func(k int) func(fake.Request) bool {
		n := 0
		var mu sync.Mutex
		return func(fake.Request) bool {
			mu.Lock()
			defer mu.Unlock()
			n++
			return n == k
		}
	}
	if s.budget != nil {
		s.faults = append(s.faults, "slow budget releases")
	}
	for i := rng.IntN(4); i > 0; i-- {
		var f fake.Fault
		switch rng.IntN(11) {
		case 10:
			// A wedged snapd (accepts, never answers) for up to 100 ms,
			// on every path or on the POSTs only. A wedge for good (past
			// the policy's 2 s) is left out to keep the run short:
			// TestPolicyBoundAgainstWedgedSnapd covers it.
			ch := make(chan struct{})
			held = append(held, ch)
			s.holds = append(s.holds, hold{ch, time.Duration(rng.IntN(100)) * time.Millisecond})
			f = fake.Fault{Kind: fake.FaultWedge, Hold: ch}
			if rng.IntN(2) == 0 {
				f.Method, f.Path = "POST", "/v2/apps"
			}
		case 0, 1, 2:
			f = fake.Fault{Method: "POST", Path: "/v2/apps", Kind: []fake.FaultKind{fake.FaultDrop, fake.FaultCut, fake.FaultGarble, fake.FaultReject}[rng.IntN(4)]}
		case 3:
			f = fake.Fault{Method: "POST", Path: "/v2/apps", Kind: fake.FaultReply, Status: 500, Body: fake.ErrorBody(500, "", "internal error")}
		case 4:
			ch := make(chan struct{})
			held = append(held, ch)
			s.holds = append(s.holds, hold{ch, time.Duration(rng.IntN(30)) * time.Millisecond})
			// Held answers, and requests snapd acts on up to 30 ms after
			// their connection broke (FaultLate).
			f = fake.Fault{Method: "POST", Path: "/v2/apps", Hold: ch, Kind: []fake.FaultKind{0, fake.FaultDrop, fake.FaultLate}[rng.IntN(3)]}
		case 5:
			f = fake.Fault{Method: "GET", Path: "/v2/changes/", Kind: []fake.FaultKind{fake.FaultDrop, fake.FaultGarble, fake.FaultCut}[rng.IntN(3)]}
		case 6:
			f = fake.Fault{Method: "GET", Path: "/v2/changes", Kind: []fake.FaultKind{fake.FaultDrop, fake.FaultGarble}[rng.IntN(2)]}
		case 7:
			f = fake.Fault{Method: "GET", Path: "/v2/notices", Kind: fake.FaultReply, Body: fake.SyncBody([]any{})}
		case 8:
			f = fake.Fault{Method: "GET", Path: "/v2/notices", Kind: fake.FaultReply, Status: 500,
				Body: fake.ErrorBody(500, "", []string{"internal error", "request canceled"}[rng.IntN(2)])}
		default:
			f = fake.Fault{Method: "GET", Path: "/v2/notices", Kind: fake.FaultDrop}
		}
		f.Match = nth(1 + rng.IntN(4))
		f.Times = 1 + rng.IntN(2)
		if f.Hold != nil && f.Kind != fake.FaultWedge {
			f.Times = 1
		}
		srv.InjectFault(f)
		s.faults = append(s.faults, f.Kind.String()+" "+f.Method+" "+f.Path)
	}
	return held
}

// release closes a hold channel once (the end of the schedule closes the
// rest).
func (s *schedule) release(ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// plantEvents schedules foreign changes and daemon-level faults.
func (s *schedule) plantEvents(srv *fake.Server, base time.Time, wg *sync.WaitGroup) {
	rng := s.rng
	at := func(d time.Duration, f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w := time.Until(base.Add(d)); w > 0 {
				time.Sleep(w) // the workload's own timing
			}
			f()
		}()
	}
	for _, h := range s.holds {
		at(h.release, func() { s.release(h.ch) })
	}
	if s.late > 0 {
		s.faults = append(s.faults, "late socket")
		at(s.late, func() { srv.StartListening() })
	}
	for i := rng.IntN(3); i > 0; i-- {
		d, hold, fail := time.Duration(rng.IntN(25))*time.Millisecond, time.Duration(1+rng.IntN(15))*time.Millisecond, rng.IntN(4) == 0
		kind := []string{"configure-snap", "auto-refresh", "service-control"}[rng.IntN(3)]
		s.faults = append(s.faults, "foreign "+kind)
		at(d, func() {
			chg := srv.AddChange(fake.ChangeSpec{Kind: kind, Snap: "k8s"})
			time.Sleep(hold) // the foreign change's own duration
			if fail {
				chg.Fail("foreign failure")
			} else {
				chg.Finish()
			}
		})
	}
	// Identical foreign requests just before or just after a call's start.
	for _, cl := range s.calls {
		if cl.wait || rng.IntN(4) != 0 {
			continue
		}
		d := cl.delay + time.Duration(rng.IntN(5))*time.Millisecond - 2*time.Millisecond
		if d < 0 {
			d = 0
		}
		s.faults = append(s.faults, "foreign identical "+cl.sig.String())
		body := cl.sig.body()
		at(d, func() { postApps(srv.SocketPath(), body) })
	}
	if s.away > 0 {
		s.faults = append(s.faults, fmt.Sprintf("snapd away %v", s.away))
		at(s.awayAt, srv.StopListening)
		at(s.awayAt+s.away, func() { srv.StartListening() })
	}
	if rng.IntN(6) == 0 {
		// Close racing the calls: the Client stays usable, and nothing
		// it opened outlives the schedule (the leak check).
		i := rng.IntN(s.clients)
		s.closing = true
		s.faults = append(s.faults, fmt.Sprintf("client %d closed", i))
		at(time.Duration(rng.IntN(25))*time.Millisecond, func() { s.clientList[i].Close() })
	}
	switch rng.IntN(8) {
	case 0:
		s.faults = append(s.faults, "connections dropped")
		at(time.Duration(rng.IntN(25))*time.Millisecond, srv.DropConnections)
	case 1:
		s.faults = append(s.faults, "maintenance")
		kind := []string{"daemon-restart", "system-restart"}[rng.IntN(2)]
		at(time.Duration(rng.IntN(15))*time.Millisecond, func() { srv.BeginMaintenance(kind, "daemon is restarting") })
		at(time.Duration(15+rng.IntN(15))*time.Millisecond, srv.EndMaintenance)
	case 2:
		if s.late == 0 {
			s.faults = append(s.faults, "snapd restart")
			down := time.Duration(1+rng.IntN(20)) * time.Millisecond
			at(time.Duration(rng.IntN(25))*time.Millisecond, func() { <-srv.RestartDaemon(down) })
		}
	}
}

// run makes one call and records it.
func (s *schedule) run(srv *fake.Server, c *snapsvc.Client, cl *call) {
	ctx := context.WithValue(context.Background(), callKey{}, cl)
	if cl.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cl.timeout)
		defer cancel()
	}
	names := strings.Split(cl.sig.names, ",")
	cl.start = time.Now()
	type outcome struct {
		res *snapsvc.Result
		err error
	}
	done := make(chan outcome, 1)
	overdue := time.AfterFunc(cl.bound(s)+scheduleEpsilon, func() { st := goroutineStacks(); cl.stacks.Store(&st) })
	go func() {
		var o outcome
		start := time.Now()
		defer func() { cl.took = time.Since(start); overdue.Stop(); done <- o }()
		switch {
		case cl.wait:
			o.err = c.WaitIdle(ctx, "k8s")
		case cl.sig.action == "start":
			o.res, o.err = c.Start(ctx, names, snapsvc.StartOptions{Enable: cl.sig.enable})
		case cl.sig.action == "stop":
			o.res, o.err = c.Stop(ctx, names, snapsvc.StopOptions{Disable: cl.sig.disable})
		default:
			o.res, o.err = c.Restart(ctx, names, snapsvc.RestartOptions{Reload: cl.sig.reload})
		}
	}()
	select {
	case o := <-done:
		cl.res, cl.err = o.res, o.err
	case <-time.After(callBound):
		cl.overtime = true
		o := <-done
		cl.res, cl.err = o.res, o.err
	}
	cl.end = time.Now()
}

// stateHeldDuring reports whether the services cl names were all in the
// state it asks for at some moment between its start and its end (the
// fake's clock), by the fake's history of each.
func (s *schedule) stateHeldDuring(srv *fake.Server, cl *call) bool {
	var apps []string
	for _, n := range strings.Split(cl.sig.names, ",") {
		if _, app, ok := strings.Cut(n, "."); ok {
			apps = append(apps, app)
			continue
		}
		for _, a := range s.apps {
			if a.Daemon != "" {
				apps = append(apps, a.Name)
			}
		}
	}
	want := func(st fake.AppState) bool {
		if cl.sig.action == "start" {
			return st.Active && (!cl.sig.enable || st.Enabled)
		}
		return !st.Active && (!cl.sig.disable || !st.Enabled)
	}
	// The moments to try: the start, and every change of a named service
	// during the call.
	hist := map[string][]fake.ServiceStateAt{}
	moments := []time.Time{cl.start}
	for _, app := range apps {
		h := s.history(srv, "k8s", app)
		hist[app] = h
		for _, e := range h {
			if e.At.After(cl.start) && !e.At.After(cl.end) {
				moments = append(moments, e.At)
			}
		}
	}
	at := func(h []fake.ServiceStateAt, t time.Time) fake.AppState {
		var st fake.AppState
		for _, e := range h {
			if e.At.After(t) {
				break
			}
			st = e.AppState
		}
		return st
	}
	for _, t := range moments {
		all := true
		for _, app := range apps {
			all = all && want(at(hist[app], t))
		}
		if all {
			return true
		}
	}
	return false
}

// check verifies every call of the schedule against the fake's record.
func (s *schedule) check(srv *fake.Server, late time.Duration) (scheduleCounts, error) {
	counts := scheduleCounts{schedules: 1, faults: len(s.faults), maxLateness: late, dims: map[string]int{}}
	for _, d := range s.dims() {
		counts.dims[d]++
	}
	changes := s.changes(srv)
	// Which request made each change: snapd makes the change while it
	// handles the POST, whatever becomes of the answer.
	creator := map[string]fake.Request{}
	requests := s.requests(srv)
	for _, r := range requests {
		if r.Method == "POST" && (r.Path == "/v2/apps" || r.Path == "/v2/snapctl") && r.Made != "" {
			if _, ok := sigOfRequest(r); ok {
				creator[r.Made] = r
			}
		}
	}
	claimed := map[string]int{}
	fail := func(i int, format string, a ...any) (scheduleCounts, error) {
		cl := s.calls[i]
		return counts, fmt.Errorf("call %d (%s, client %d, timeout %v): %s\nresult %+v\nerror %v\nfaults %v",
			i, cl.sig, cl.client, cl.timeout, fmt.Sprintf(format, a...), cl.res, cl.err, s.faults)
	}
	for i, cl := range s.calls {
		counts.calls++
		if cl.overtime {
			return fail(i, "did not return within %v", callBound)
		}
		counts.maxOvershoot = max(counts.maxOvershoot, cl.overshoot(s))
		// A call may return past its bound by the epsilon, and by however
		// late the machine's own timers fired meanwhile, once for each timer
		// the call wakes from in turn (a busy machine delays every
		// goroutine, the call's as much as the test's).
		if cl.overshoot(s) > scheduleEpsilon+latenessSteps*late {
			counts.overBound++
			return fail(i, "returned after %v, %v past its bound of %v (epsilon %v; timers fired up to %v late meanwhile, allowed %d times)\nsnapsvc's goroutines once it was overdue:\n%s", cl.took, cl.overshoot(s), cl.bound(s), scheduleEpsilon, late, latenessSteps, cl.stackDump())
		}
		counts.checks++
		if cl.wait {
			counts.waits++
			if cl.err == nil {
				// The snap was seen idle at some moment of the call: a
				// caller takes only what was read after it joined.
				counts.checks++
				if busy := busyThroughout(changes, cl.start, cl.end); busy != "" {
					return fail(i, "WaitIdle returned nil, yet change %s held the snap from before the call to its return", busy)
				}
			}
			continue
		}
		// The changes this call's own requests made: same request, made
		// while the call ran, not by the foreign requester.
		var own []string
		for id, r := range creator {
			if g, ok := sigOfRequest(r); ok && g == cl.sig && r.UserAgent == clientAgent(cl.client) && !r.Time.Before(cl.start) && !r.Time.After(cl.end) {
				own = append(own, id)
			}
		}
		counts.checks++
		if len(own) > 1 {
			counts.doubled++
			return fail(i, "made %d changes (%v) for one call", len(own), own)
		}
		if cl.err != nil {
			counts.failed++
			var opErr *snapsvc.OpError
			counts.checks++
			if !errors.As(cl.err, &opErr) {
				return fail(i, "error is not an *OpError")
			}
			if errors.Is(cl.err, snapsvc.ErrOutcomeUnknown) {
				counts.outcomeUnknown++
			}
			if len(own) == 1 {
				// An action ran: the error must say so and not invite a retry.
				var ce *snapsvc.ChangeError
				counts.checks += 2
				if opErr.Retryable() {
					return fail(i, "its change %s was made, yet the error is retryable", own[0])
				}
				// The error names the change, is the change's own failure,
				// says the outcome is unknown, or is a readiness check's or
				// a slot's lost while the change ran, which are known only
				// once the change is done. snapctl without
				// snap-refresh-observe cannot name the change at all: there
				// the error need only not invite a retry (checked above).
				var nr *probe.NotReadyError
				var be *snapsvc.BudgetError
				afterDone := errors.As(cl.err, &be) && be.ChangeDone
				if !errors.As(cl.err, &ce) && !errors.Is(cl.err, snapsvc.ErrOutcomeUnknown) && opErr.ChangeID != own[0] && !errors.As(cl.err, &nr) && !afterDone && !s.blindCtl {
					return fail(i, "its change %s was made, but the error neither names it nor says the outcome is unknown", own[0])
				}
			}
			continue
		}
		counts.succeeded++
		res := cl.res
		counts.checks += 6
		if res.Queued {
			return fail(i, "queued outside a hook")
		}
		if res.ChangeID == "" {
			// snapctl names no change; where snapd refuses this client its
			// changes it cannot name one either. snapd's record must show
			// the call's own change done; or, merged, a change of another
			// client's identical request done, made while the call ran;
			// or, for a start or stop whose answer was lost and whose
			// change snapctl cannot look up, the services in the state
			// asked for at some moment of the call (the fake's history of
			// them: snapd's changes cannot say it, as none may have been
			// needed).
			if res.Shared && s.snapctl {
				if id := identicalDone(creator, changes, cl); id == "" {
					return fail(i, "merged into an identical restart, yet no identical request made a change done while the call ran")
				}
				counts.merged++
				continue
			}
			if !s.snapctl {
				return fail(i, "success without a change (own changes %v)", own)
			}
			switch {
			case len(own) == 1 && changes[own[0]].Status == "Done":
			case len(own) == 0 && s.blindCtl && cl.sig.action != "restart" && s.stateHeldDuring(srv, cl):
			default:
				return fail(i, "success without a change (own changes %v)", own)
			}
			continue
		}
		chg, ok := changes[res.ChangeID]
		if !ok {
			return fail(i, "reported change %s does not exist", res.ChangeID)
		}
		if chg.Kind != "service-control" || chg.Status != "Done" {
			return fail(i, "reported change %s is %s %s", res.ChangeID, chg.Kind, chg.Status)
		}
		early := cl.start.Sub(chg.SpawnTime) // > 0: spawned before the call began
		var g sig
		foreign := false
		if cr, ok := creator[res.ChangeID]; ok {
			g, _ = sigOfRequest(cr)
			foreign = cr.UserAgent == foreignAgent
		} else if g, ok = sigOfTasks(chg); ok {
			foreign = true // a foreign service-control change (AddChange)
		} else {
			return fail(i, "reported change %s was not made by a request to act", res.ChangeID)
		}
		// The one change spawned before the call began that it may report:
		// after its request's answer was lost, having made no change of its
		// own, an identical change of someone else's spawned within the
		// client's uncertainty about snapd's clock (at most one round trip
		// of its requests, below boundEpsilon here) of the request's
		// sending. snapd numbers and stamps it like the request's own would
		// be, and the client prefers its own when both exist
		// (opCandidates); the README's ErrOutcomeUnknown row says the two
		// cannot be told apart.
		if early > 0 && (!foreign || !sameBut(g, cl.sig) || len(own) > 0 || early > boundEpsilon) {
			return fail(i, "reported change %s was spawned %v before the call began", res.ChangeID, early)
		}
		switch {
		case slices.Contains(own, res.ChangeID):
		case res.Shared && !foreign && g == cl.sig:
			// Merged into the identical restart of another caller (another
			// client's request made it, after this call began: checked
			// above).
			counts.merged++
		case foreign && sameBut(g, cl.sig):
			// An identical request of someone else's, made after the call
			// began, did what the call asked (for --enable/--disable, the
			// services' state was checked once it was done).
			counts.foreignIdentical++
		case g == cl.sig && s.answerLostBefore(requests, cl, chg.SpawnTime.Add(boundEpsilon)):
			// Another client's identical request made it, after the call
			// began (checked above) and after a request of the call's own
			// whose answer was lost: two identical changes made since that
			// request was sent, one of them maybe its own, cannot be told
			// apart in snapd's records. What it asked was done after it
			// began; its own change, if any, is held by its budget slot
			// too (checkSlots).
			counts.foreignIdentical++
		default:
			return fail(i, "reported change %s does %s (own changes %v)", res.ChangeID, g, own)
		}
		// A change is claimed by one call alone, or shared by calls that
		// merged into it.
		if res.Shared {
			continue
		}
		if prev, ok := claimed[res.ChangeID]; ok {
			return fail(i, "change %s is claimed by calls %d and %d", res.ChangeID, prev, i)
		}
		claimed[res.ChangeID] = i
	}
	if err := s.checkSlots(srv, &counts, changes, creator); err != nil {
		return counts, err
	}
	if err := s.checkGrants(&counts, changes, creator); err != nil {
		return counts, err
	}
	counts.worstBlindWindow = s.blindWindow(srv)
	if counts.worstBlindWindow > 20 {
		return counts, fmt.Errorf("a blind wait made %d requests within one second (limit 20); faults %v", counts.worstBlindWindow, s.faults)
	}
	return counts, nil
}

// mergedFailure reports whether cl failed with the failure of a change
// that another client's identical request made: it merged into it. Where
// the failure names no change (snapctl without snap-refresh-observe
// cannot), such a change must have failed while cl ran.
func mergedFailure(creator map[string]fake.Request, changes map[string]fake.ChangeInfo, cl *call) bool {
	var ce *snapsvc.ChangeError
	if !errors.As(cl.err, &ce) {
		return false
	}
	other := func(r fake.Request) bool {
		g, ok := sigOfRequest(r)
		return ok && g == cl.sig && r.UserAgent != foreignAgent && r.UserAgent != clientAgent(cl.client)
	}
	if ce.ID != "" {
		r, ok := creator[ce.ID]
		return ok && other(r)
	}
	for id, r := range creator {
		chg := changes[id]
		if other(r) && chg.Ready && chg.Status != "Done" && !chg.SpawnTime.Before(cl.start) && !chg.SpawnTime.After(cl.end) {
			return true
		}
	}
	return false
}

// identicalDone returns a change done that another client's request
// identical to cl's made while cl ran, or "".
func identicalDone(creator map[string]fake.Request, changes map[string]fake.ChangeInfo, cl *call) string {
	for id, r := range creator {
		g, ok := sigOfRequest(r)
		chg := changes[id]
		if ok && g == cl.sig && r.UserAgent != foreignAgent && r.UserAgent != clientAgent(cl.client) &&
			!chg.SpawnTime.Before(cl.start) && !chg.SpawnTime.After(cl.end) && chg.Status == "Done" {
			return id
		}
	}
	return ""
}

// busyThroughout returns a change that touched the snap (every change of
// a schedule does) from before from until after to, or
// "" when the snap was idle at some moment between them. Changes
// overlapping end to end cover the span too.
func busyThroughout(changes map[string]fake.ChangeInfo, from, to time.Time) string {
	at, by := from, ""
	for moved := true; moved; {
		moved = false
		for id, ci := range changes {
			end := ci.ReadyTime
			if !ci.Ready {
				end = to.Add(time.Hour)
			}
			if !ci.SpawnTime.After(at) && end.After(at) {
				at, by, moved = end, id, true
			}
		}
		if !at.Before(to) {
			return by
		}
	}
	return ""
}

// checkSlots checks, under a restart budget, that the slot of every
// change a budgeted call made was held, by the client that made it, while
// the change ran: from before it was spawned until it was ready (issue 25
// defect 1, issue 33). A change whose slot the budget itself took away
// while it ran is counted, not failed (nothing is promised past a lost
// slot). Schedules that close a client mid-run are left out: Close gives
// every slot back, a bound the user sets.
func (s *schedule) checkSlots(srv *fake.Server, counts *scheduleCounts, changes map[string]fake.ChangeInfo, creator map[string]fake.Request) error {
	if s.budget == nil {
		return nil
	}
	if err := s.checkJoinedSlots(counts, changes); err != nil {
		return err
	}
	if err := s.checkKeptStops(srv, counts, changes, creator); err != nil {
		return err
	}
	for id, r := range creator {
		if r.UserAgent == foreignAgent {
			continue
		}
		client := -1
		for i := range s.clients {
			if r.UserAgent == clientAgent(i) {
				client = i
			}
		}
		g, ok := sigOfRequest(r)
		// Restarts: a stop takes slots only for the services it finds
		// running, which the record does not say (checkKeptStops).
		if !ok || g.action != "restart" || client < 0 || s.unbudgeted[client] {
			continue
		}
		ci := changes[id]
		if !ci.Ready || ci.Status != "Done" {
			continue // a failed change's slot may go as soon as it failed
		}
		if strings.Contains(g.names, "k8s-warm") {
			continue // the warm-up, before the workload
		}
		counts.budgetedChanges++
		spawn, ready, sent := ci.SpawnTime, ci.ReadyTime, r.Time
		// The request was written before snapd's record of it (its
		// handler may run late): from the start of the call that sent it.
		for _, cl := range s.calls {
			if cl.client == client && cl.sig == g && cl.start.Before(sent) {
				sent = cl.start
			}
		}
		var keys []string
		for _, n := range strings.Split(g.names, ",") {
			if n != "k8s" {
				keys = append(keys, n)
				continue
			}
			// A whole-snap restart takes the key of every service.
			for _, a := range s.apps {
				keys = append(keys, "k8s."+a.Name)
			}
		}
		for _, key := range keys {
			counts.checks++
			covered, lost := s.slots.covers(key, client, sent, spawn, ready)
			switch {
			case covered:
			case lost:
				counts.lostCovers++
			default:
				counts.releasedEarly++
				return fmt.Errorf("restart budget: no slot of %s was held by client %d through change %s (%s, %v to %v): released while it ran; faults %v; budget %s; slots %s; calls %s",
					key, client, id, g, spawn.Format("15:04:05.000"), ready.Format("15:04:05.000"), s.faults, s.budget.behaviour, s.slots.describe(key), s.describeCalls(g))
			}
		}
	}
	return nil
}

// checkJoinedSlots checks the restarts of budgeted clients that merged
// into another client's identical restart: the change they report must
// have been made by a budgeted client (a budgeted restart never joins an
// unbudgeted one), and covered by their own slot (fenced before they
// joined) from their call's start to its end.
func (s *schedule) checkJoinedSlots(counts *scheduleCounts, changes map[string]fake.ChangeInfo) error {
	for _, cl := range s.calls {
		if cl.wait || cl.res == nil || !cl.res.Shared || cl.res.ChangeID == "" || s.unbudgeted[cl.client] || cl.sig.action != "restart" {
			continue
		}
		ci, ok := changes[cl.res.ChangeID]
		if !ok || !ci.Ready || ci.Status != "Done" {
			continue
		}
		var maker *call
		for _, o := range s.calls {
			if o != cl && o.res != nil && o.res.ChangeID == cl.res.ChangeID && !o.res.Shared {
				maker = o
			}
		}
		if maker != nil && s.unbudgeted[maker.client] {
			return fmt.Errorf("restart budget: budgeted client %d's %s merged into unbudgeted client %d's change %s", cl.client, cl.sig, maker.client, cl.res.ChangeID)
		}
		counts.joinedBudgeted++
		spawn, ready := ci.SpawnTime, ci.ReadyTime
		for _, n := range strings.Split(cl.sig.names, ",") {
			if n == "k8s" {
				continue // a whole snap's keys: covered with its services' by the maker's check
			}
			counts.checks++
			if covered, lost := s.slots.covers(n, cl.client, cl.start, spawn, ready); !covered && !lost {
				counts.releasedEarly++
				return fmt.Errorf("restart budget: client %d's %s, merged into change %s (%v to %v), held no slot of %s through it; slots %s",
					cl.client, cl.sig, cl.res.ChangeID, spawn.Format("15:04:05.000"), ready.Format("15:04:05.000"), n, s.slots.describe(n))
			}
		}
	}
	return nil
}

// checkKeptStops checks, under StopsAndStarts, that a budgeted client's
// stop of a running service kept its slot while the service was down:
// from the stop's change's end until a start of it by the same client
// that succeeded was ready, or to the schedule's end (a start that failed,
// or none: the slot stays, abandoned at Close).
func (s *schedule) checkKeptStops(srv *fake.Server, counts *scheduleCounts, changes map[string]fake.ChangeInfo, creator map[string]fake.Request) error {
	if !s.stopsToo {
		return nil
	}
	for id, r := range creator {
		client := -1
		for i := range s.clients {
			if r.UserAgent == clientAgent(i) {
				client = i
			}
		}
		g, ok := sigOfRequest(r)
		if !ok || g.action != "stop" || client < 0 || s.unbudgeted[client] || strings.Contains(g.names, "k8s-warm") {
			continue
		}
		ci := changes[id]
		if !ci.Ready || ci.Status != "Done" {
			continue
		}
		stopped := ci.ReadyTime
		var began time.Time // when the call that made the stop began
		for _, cl := range s.calls {
			if cl.client == client && cl.sig == g {
				began = cl.start
			}
		}
		for _, n := range strings.Split(g.names, ",") {
			if n == "k8s" || began.IsZero() {
				continue
			}
			// Only a running service's stop takes its slot: judged only
			// where the service ran from the call's start to the stop's
			// change (a slot shared with another operation of the client
			// on the key says nothing of the stop's own).
			if !s.activeThroughout(srv, n, began, ci.SpawnTime) {
				continue
			}
			until := time.Now()
			for sid, sr := range creator {
				sg, ok := sigOfRequest(sr)
				sc := changes[sid]
				// A start of the whole snap starts n too (schedule seed 873).
				snapName, _, _ := strings.Cut(n, ".")
				names := strings.Split(sg.names, ",")
				if ok && sg.action == "start" && sr.UserAgent == r.UserAgent && (slices.Contains(names, n) || slices.Contains(names, snapName)) &&
					sc.Ready && sc.Status == "Done" && sc.SpawnTime.After(ci.ReadyTime) && sc.ReadyTime.Before(until) {
					until = sc.ReadyTime
				}
			}
			counts.keptStops++
			counts.checks++
			if covered, lost := s.slots.covers(n, client, stopped, stopped, until); !covered && !lost {
				counts.releasedEarly++
				var calls strings.Builder
				for i, cl := range s.calls {
					fmt.Fprintf(&calls, "\n  call %d client %d %s: %v to %v, result %+v, error %v", i, cl.client, cl.sig, cl.start.Format("15:04:05.000"), cl.end.Format("15:04:05.000"), cl.res, cl.err)
				}
				for cid, c := range changes {
					fmt.Fprintf(&calls, "\n  change %s %s %s: %v to %v", cid, c.Summary, c.Status, c.SpawnTime.Format("15:04:05.000"), c.ReadyTime.Format("15:04:05.000"))
				}
				return fmt.Errorf("restart budget: client %d stopped %s (change %s, down from %v) and gave its slot back before a start of it was ready (%v); slots %s; calls %s",
					client, n, id, stopped.Format("15:04:05.000"), until.Format("15:04:05.000"), s.slots.describe(n), calls.String())
			}
		}
	}
	return nil
}

// activeThroughout reports whether snap.app name was active from from to
// to, by the fake's history of it.
func (s *schedule) activeThroughout(srv *fake.Server, name string, from, to time.Time) bool {
	snap, app, _ := strings.Cut(name, ".")
	active := false
	for _, st := range s.history(srv, snap, app) {
		switch {
		case !st.At.After(from):
			active = st.Active
		case st.At.Before(to) && !st.Active:
			return false
		}
	}
	return active
}

// checkGrants checks that every slot the budget granted led to the
// request it was for: after its grant, the call tried to send a request to
// act that its send-by did not keep from being written (the client's own
// record: snapd's misses what was sent while it was away), unless the
// budget itself stopped it (a *BudgetError: a fence that failed, a lost
// slot), it merged into an identical restart, or its bound ended before
// its first attempt. Issue 33, defect 1, was a grant made without the
// coordination service that never sent its request: its fence's
// confirmation overflowed and every write was refused, 17,000 attempts
// that snapd never saw.
func (s *schedule) checkGrants(counts *scheduleCounts, changes map[string]fake.ChangeInfo, creator map[string]fake.Request) error {
	if s.budget == nil {
		return nil
	}
	for _, g := range s.budget.allGrants() {
		if g.refused {
			counts.refusals++
			if g.call != nil && g.call.err == nil {
				return fmt.Errorf("restart budget: call %s succeeded although the budget refused its key %s", g.call.sig, g.key)
			}
			continue
		}
		counts.grants++
		if g.unbudgeted {
			counts.unbudgetedGrants++
		}
		cl := g.call
		if cl == nil || cl.wait {
			continue // a warm-up restart
		}
		counts.checks++
		switch {
		case s.sends.tried(cl.client, cl.sig, g.at):
		case isBudgetError(cl.err):
		case cl.res != nil && cl.res.Shared:
		case mergedFailure(creator, changes, cl):
		case cl.err != nil && !cl.triedAny(s):
			// The call's bound ended before its first attempt.
		default:
			counts.grantsWithoutChange++
			return fmt.Errorf("restart budget: slot of %s granted to call %s (client %d), which sent no request to act after it (result %+v, error %v); faults %v",
				g.key, cl.sig, cl.client, cl.res, cl.err, s.faults)
		}
	}
	return nil
}

// blindWindow returns the most requests to act a client's blind waits made
// within one second: refusals of a wait that cannot see its blocker
// (snapd 2.57 with no state file). 0 where no wait was blind.
func (s *schedule) blindWindow(srv *fake.Server) int {
	blind := s.blindCtl || (!s.snapctl && s.version == fake.Version257 && !s.stateFile)
	if !blind {
		return 0
	}
	worst := 0
	for i := 0; i < s.clients; i++ {
		var times []time.Time
		for _, r := range s.requests(srv) {
			if r.UserAgent == clientAgent(i) && r.Method == "POST" && (r.Path == "/v2/apps" || r.Path == "/v2/snapctl") && r.Status >= 400 {
				times = append(times, r.Time)
			}
		}
		for a := range times {
			n := 0
			for b := a; b < len(times) && times[b].Sub(times[a]) < time.Second; b++ {
				n++
			}
			worst = max(worst, n)
		}
	}
	return worst
}

var wholeRestartSummary = regexp.MustCompile(`^Run service command "restart" for running services of snap "([^"]+)"$`)

// sigOfTasks returns what a service-control change that no request made
// does: the fake's foreign service-control change (Server.AddChange) is a
// restart of the snap's running services, as snapd summarises one.
func sigOfTasks(chg fake.ChangeInfo) (sig, bool) {
	if chg.Kind != "service-control" || len(chg.Tasks) != 1 {
		return sig{}, false
	}
	m := wholeRestartSummary.FindStringSubmatch(chg.Tasks[0].Summary)
	if m == nil {
		return sig{}, false
	}
	return sig{action: "restart", names: m[1]}, true
}

// sameBut reports whether a change made by request g does what call c
// asks, except for enable/disable, which leave no trace in a change.
func sameBut(g, c sig) bool {
	if g == c {
		return true
	}
	g.enable, g.disable, c.enable, c.disable = false, false, false, false
	return g == c
}

// leaks counts what a schedule must not leave open.
type leaks struct{ fds, inotify, goroutines int }

func leakCounts() leaks {
	var l leaks
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		l.fds++
		if t, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(t, "inotify") {
			l.inotify++
		}
	}
	l.goroutines = runtime.NumGoroutine()
	return l
}

// exceeds reports whether l has more of anything than before: a leak. Fewer
// is not one (a goroutine of an earlier test may end during the run).
func (l leaks) exceeds(before leaks) bool {
	return l.fds > before.fds || l.inotify > before.inotify || l.goroutines > before.goroutines
}

// settledLeakCounts returns the counts once none exceeds before, or after
// a few seconds (connections and their goroutines close asynchronously).
func settledLeakCounts(before leaks) leaks {
	var l leaks
	for i := 0; i < 100; i++ {
		if l = leakCounts(); !l.exceeds(before) {
			return l
		}
		time.Sleep(50 * time.Millisecond) // waiting for asynchronous closes, not synchronising
	}
	return l
}

// describeCalls says, for a failure's message, how each call asking g
// went.
func (s *schedule) describeCalls(g sig) string {
	var b strings.Builder
	for i, cl := range s.calls {
		if cl.sig == g {
			fmt.Fprintf(&b, "\n  call %d client %d timeout %v: %v to %v, result %+v, error %v", i, cl.client, cl.timeout,
				cl.start.Format("15:04:05.000"), cl.end.Format("15:04:05.000"), cl.res, cl.err)
		}
	}
	return b.String()
}

// answerLostBefore reports whether a request of cl's own (its client,
// its action), sent while it ran and before by, got no answer it could
// read: the fake dropped, cut or garbled it, or the client's round trip
// failed (it left a held or wedged request, or the connection broke).
func (s *schedule) answerLostBefore(requests []fake.Request, cl *call, by time.Time) bool {
	for _, r := range requests {
		g, ok := sigOfRequest(r)
		if ok && g == cl.sig && r.UserAgent == clientAgent(cl.client) && !r.Time.Before(cl.start) && !r.Time.After(cl.end) && r.Time.Before(by) &&
			(r.Dropped || r.Fault == fake.FaultCut.String() || r.Fault == fake.FaultGarble.String()) {
			return true
		}
	}
	s.sends.mu.Lock()
	defer s.sends.mu.Unlock()
	for _, sd := range s.sends.sends {
		g, ok := sigOfRequest(sd.req)
		if ok && sd.client == cl.client && g == cl.sig && sd.failed && !sd.refused && !sd.at.Before(cl.start) && sd.at.Before(by) {
			return true
		}
	}
	return false
}

// stackDump returns the stacks taken once cl was overdue, or a note that
// it was not (yet) when the dump was due.
func (cl *call) stackDump() string {
	if p := cl.stacks.Load(); p != nil {
		return *p
	}
	return "(none taken: the call returned before the dump was due)"
}

// goroutineStacks returns the stacks of the goroutines running snapsvc's
// code (the package under test, its wire client and file lock), the test's
// own left out.
func goroutineStacks() string {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "snapsvc/snapsvc/snapsvc.") || strings.Contains(g, "snapsvc/internal/") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}
