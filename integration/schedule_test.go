//go:build realsnapd

package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// TestScheduleInvariantsRealSnapd runs seeded schedules of concurrent
// callers against the real snapd — foreign changes (a slow configure hook,
// identical requests just before and after ours), context deadlines and
// `systemctl restart snapd` in the middle of changes — and checks for every
// call what the fake-based schedule test checks, from snapd's own changes:
// it returns within its bound; success means a change doing exactly what
// the call asked, spawned after it began, reached Done and is claimed by no
// other call; failure is an *OpError, and never a retryable one when a
// change was made for the call; never two changes for one call.
// SNAPSVC_REALSNAPD_SCHEDULES sets how many (default 20).
func TestScheduleInvariantsRealSnapd(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	leaks := goleak.IgnoreCurrent()
	defer func() {
		w.hc.CloseIdleConnections()
		goleak.VerifyNone(t, leaks)
	}()
	n := 20
	if v := os.Getenv("SNAPSVC_REALSNAPD_SCHEDULES"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	var total struct{ calls, ok, failed, restarts, foreign, checks int }
	for seed := uint64(1); seed <= uint64(n); seed++ {
		s := planRealSchedule(seed)
		if err := s.run(t, e, w); err != nil {
			t.Fatalf("schedule %d: %v\nfaults: %v", seed, err, s.events)
		}
		for _, ev := range s.events {
			if strings.Contains(ev, "FAILED") {
				t.Fatalf("schedule %d: %s", seed, ev)
			}
		}
		t.Logf("schedule %d: %d calls, %d ok, %d failed; %s", seed, len(s.calls), s.ok, s.failed, strings.Join(s.events, "; "))
		total.calls += len(s.calls)
		total.ok += s.ok
		total.failed += s.failed
		total.checks += s.checks
		total.foreign += len(s.foreignIDs)
		if s.restartAt > 0 {
			total.restarts++
		}
		w.ensureBaseline(t)
	}
	t.Logf("real snapd %s: schedules %d, calls %d (%d succeeded, %d failed), snapd restarts %d, foreign changes %d, checks %d",
		e.Version, n, total.calls, total.ok, total.failed, total.restarts, total.foreign, total.checks)
}

// realCall is one operation of a schedule.
type realCall struct {
	client         int
	delay, timeout time.Duration
	action         string // start, stop, restart
	flag           string // "", enable, disable, reload
	apps           []string
	start, end     time.Time
	res            *snapsvc.Result
	err            error
}

// summary is the task summary snapd gives the call's change
// (overlord/servicestate/servicestate.go serviceControlTs).
func (c *realCall) summary() string {
	word := c.action
	if c.flag == "reload" {
		word = "reload-or-restart"
	}
	return fmt.Sprintf("Run service command %q for services %q of snap %q", word, c.apps, "svcdemo")
}

func (c *realCall) names() []string {
	var out []string
	for _, a := range c.apps {
		out = append(out, "svcdemo."+a)
	}
	return out
}

type realSchedule struct {
	seed       uint64
	rng        *rand.Rand
	clients    int
	calls      []*realCall
	confAt     time.Duration // a slow configure hook at (0: none)
	confHold   float64       // its seconds
	restartAt  time.Duration // systemctl restart snapd at (0: none)
	identical  map[int]time.Duration
	events     []string
	mu         sync.Mutex
	foreignIDs map[string]bool
	ok, failed int
	checks     int
}

func planRealSchedule(seed uint64) *realSchedule {
	rng := rand.New(rand.NewPCG(seed, 0x7ea1))
	s := &realSchedule{seed: seed, rng: rng, clients: 1 + rng.IntN(2), identical: map[int]time.Duration{}, foreignIDs: map[string]bool{}}
	used := map[string]bool{}
	for len(s.calls) < 2+rng.IntN(3) {
		c := &realCall{client: rng.IntN(s.clients), delay: time.Duration(rng.IntN(400)) * time.Millisecond}
		switch rng.IntN(6) {
		case 0:
			c.action = "start"
		case 1:
			c.action, c.flag = "start", "enable"
		case 2:
			c.action = "stop"
		case 3:
			c.action, c.flag = "stop", "disable"
		case 4:
			c.action = "restart"
		default:
			c.action, c.flag = "restart", "reload"
		}
		for _, a := range []string{"alpha", "beta"} {
			if rng.IntN(2) == 0 {
				c.apps = append(c.apps, a)
			}
		}
		if c.action == "start" && rng.IntN(5) == 0 {
			c.apps = append(c.apps, "broken") // a start that fails
		}
		if len(c.apps) == 0 {
			c.apps = []string{"alpha"}
		}
		sort.Strings(c.apps)
		// Calls must be told apart by their changes: enable/disable
		// leave no trace in a summary.
		if used[c.summary()] {
			continue
		}
		used[c.summary()] = true
		if rng.IntN(4) == 0 {
			c.timeout = time.Duration(50+rng.IntN(400)) * time.Millisecond
		}
		s.calls = append(s.calls, c)
	}
	if rng.IntN(2) == 0 {
		s.confAt = time.Duration(rng.IntN(300)) * time.Millisecond
		s.confHold = 0.2 + float64(rng.IntN(8))/10
	}
	if rng.IntN(3) == 0 {
		s.restartAt = time.Duration(1+rng.IntN(500)) * time.Millisecond
	}
	for i := range s.calls {
		if rng.IntN(4) == 0 {
			s.identical[i] = time.Duration(rng.IntN(60)) * time.Millisecond
		}
	}
	return s
}

func (s *realSchedule) note(format string, a ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, fmt.Sprintf(format, a...))
}

func (s *realSchedule) run(t *testing.T, e env, w *wire) error {
	lockDir := t.TempDir()
	var clients []*snapsvc.Client
	for i := 0; i < s.clients; i++ {
		sock := e.Socket
		if i > 0 {
			// Another path to the socket: a lock registry of its own, as
			// another process has; the file locks are shared.
			sock = filepath.Join(t.TempDir(), "snapd.socket")
			if err := os.Symlink(e.Socket, sock); err != nil {
				return err
			}
		}
		c, err := snapsvc.New(snapsvc.WithSocket(sock), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithLockDir(lockDir),
			snapsvc.WithStateFile("/proc/"+e.Leader+"/root"+snapsvc.DefaultStateFile))
		if err != nil {
			return err
		}
		defer c.Close()
		clients = append(clients, c)
	}
	base := time.Now()
	var wg sync.WaitGroup
	at := func(d time.Duration, f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(base.Add(d))) // the workload's own timing
			f()
		}()
	}
	if s.confAt > 0 {
		at(s.confAt, func() {
			r, err := w.doErr("PUT", "/v2/snaps/svcdemo/conf", map[string]any{"hook-sleep": s.confHold})
			s.note("configure-snap (%.1fs hook) at %v: %v %s", s.confHold, s.confAt, err, r.Change)
			if err == nil && r.Change != "" {
				s.mu.Lock()
				s.foreignIDs[r.Change] = true
				s.mu.Unlock()
			}
		})
	}
	if s.restartAt > 0 {
		at(s.restartAt, func() {
			_, stderr, err := e.runInside(t, "systemctl", "restart", "snapd")
			if err != nil {
				s.note("systemctl restart snapd at %v FAILED: %v %s", s.restartAt, err, stderr)
				return
			}
			s.note("systemctl restart snapd at %v", s.restartAt)
		})
	}
	for i, d := range s.identical {
		c := s.calls[i]
		at(c.delay+d, func() {
			body := map[string]any{"action": c.action, "names": c.names()}
			if c.flag != "" {
				body[c.flag] = true
			}
			r, err := w.doErr("POST", "/v2/apps", body)
			s.note("identical %s %s %v at +%v: %v %d %s", c.action, c.flag, c.apps, d, err, r.StatusCode, r.Change)
			if err == nil && r.Change != "" {
				s.mu.Lock()
				s.foreignIDs[r.Change] = true
				s.mu.Unlock()
			}
		})
	}
	for _, c := range s.calls {
		at(c.delay, func() { s.call(clients[c.client], c) })
	}
	wg.Wait()
	w.waitIdle(t)
	return s.check(t, w)
}

// callBoundReal is the most a call may take: the default policy's bounds
// are minutes, but nothing here holds the snap for more than a few
// seconds, and a snapd restart is back within seconds.
const callBoundReal = 90 * time.Second

func (s *realSchedule) call(c *snapsvc.Client, rc *realCall) {
	ctx, cancel := context.WithTimeout(context.Background(), callBoundReal)
	defer cancel()
	if rc.timeout > 0 {
		var cancel2 context.CancelFunc
		ctx, cancel2 = context.WithTimeout(ctx, rc.timeout)
		defer cancel2()
	}
	rc.start = time.Now()
	switch rc.action {
	case "start":
		rc.res, rc.err = c.Start(ctx, rc.names(), snapsvc.StartOptions{Enable: rc.flag == "enable"})
	case "stop":
		rc.res, rc.err = c.Stop(ctx, rc.names(), snapsvc.StopOptions{Disable: rc.flag == "disable"})
	default:
		rc.res, rc.err = c.Restart(ctx, rc.names(), snapsvc.RestartOptions{Reload: rc.flag == "reload"})
	}
	rc.end = time.Now()
}

func (s *realSchedule) check(t *testing.T, w *wire) error {
	r := w.do(t, "GET", "/v2/changes?select=all", nil)
	var all []change
	decode(t, r, &all)
	byID := map[string]change{}
	for _, c := range all {
		byID[c.ID] = c
	}
	claimed := map[string]int{}
	for i, c := range s.calls {
		fail := func(format string, a ...any) error {
			return fmt.Errorf("call %d (%s %s %v, timeout %v): %s\nresult %+v\nerror %v", i, c.action, c.flag, c.apps, c.timeout, fmt.Sprintf(format, a...), c.res, c.err)
		}
		s.checks++
		if c.end.Sub(c.start) >= callBoundReal {
			return fail("did not return within %v", callBoundReal)
		}
		var own []string
		for _, chg := range all {
			if chg.Kind == "service-control" && !s.foreignIDs[chg.ID] && len(chg.Tasks) == 1 && chg.Tasks[0].Summary == c.summary() &&
				!chg.SpawnTime.Before(c.start) && !chg.SpawnTime.After(c.end) {
				own = append(own, chg.ID)
			}
		}
		s.checks++
		if len(own) > 1 {
			return fail("made %d changes %v for one call", len(own), own)
		}
		if c.err != nil {
			s.failed++
			var opErr *snapsvc.OpError
			s.checks++
			if !errors.As(c.err, &opErr) {
				return fail("error is not an *OpError")
			}
			if len(own) == 1 {
				var ce *snapsvc.ChangeError
				s.checks += 2
				if opErr.Retryable() {
					return fail("change %s was made for it, yet the error is retryable", own[0])
				}
				if !errors.As(c.err, &ce) && !errors.Is(c.err, snapsvc.ErrOutcomeUnknown) && opErr.ChangeID != own[0] {
					return fail("change %s was made for it, but the error neither names it nor says the outcome is unknown", own[0])
				}
			}
			continue
		}
		s.ok++
		s.checks += 5
		chg, ok := byID[c.res.ChangeID]
		switch {
		case !ok:
			return fail("reported change %q does not exist", c.res.ChangeID)
		case chg.Kind != "service-control" || chg.Status != "Done":
			return fail("reported change %s is %s %s", chg.ID, chg.Kind, chg.Status)
		case chg.SpawnTime.Before(c.start):
			return fail("reported change %s was spawned before the call began", chg.ID)
		case len(chg.Tasks) != 1 || chg.Tasks[0].Summary != c.summary():
			return fail("reported change %s does %+v", chg.ID, chg.Tasks)
		case !slices.Contains(own, chg.ID) && !s.foreignIDs[chg.ID]:
			return fail("reported change %s is neither its own (%v) nor an identical foreign one", chg.ID, own)
		}
		if prev, dup := claimed[chg.ID]; dup {
			return fail("change %s is claimed by calls %d and %d", chg.ID, prev, i)
		}
		claimed[chg.ID] = i
		// Enabling and disabling, which a change does not show, must
		// have happened too (nothing else here changes the startup).
		if c.flag == "enable" || c.flag == "disable" {
			s.checks++
			apps := w.apps(t, "svcdemo")
			for _, a := range c.apps {
				if got := apps[a].Enabled; got != (c.flag == "enable") && !s.laterTouches(all, chg, a) {
					return fail("svcdemo.%s enabled=%v after a successful %s", a, got, c.flag)
				}
			}
		}
	}
	return nil
}

// laterTouches reports whether a service-control change spawned after chg
// names app (it may have changed its startup since).
func (s *realSchedule) laterTouches(all []change, chg change, app string) bool {
	for _, o := range all {
		if o.ID != chg.ID && o.Kind == "service-control" && o.SpawnTime.After(chg.SpawnTime) {
			for _, tk := range o.Tasks {
				if strings.Contains(tk.Summary, strconv.Quote(app)) {
					return true
				}
			}
		}
	}
	return false
}
