package fake

import (
	"fmt"
	"sort"
	"time"
)

// svcOp is one snap's part of a service command: the "service-action" task
// data of overlord/servicestate/servicestate.go.
type svcOp struct {
	action   string // start, stop, restart, reload-or-restart
	modifier string // enable, disable or ""
	snap     *snapState
	services []*appState // sorted by name
	explicit []*appState // services named explicitly ("snap.app")
}

// summary mirrors serviceControlTs: explicit services are listed, a whole-snap
// restart (a reload too: snapd tests the request's action, "restart", not
// the command's, overlord/servicestate/servicestate.go) says "running
// services", anything else lists all services.
func (op svcOp) summary() string {
	names := op.explicit
	if len(names) == 0 && (op.action == "restart" || op.action == "reload-or-restart") {
		return fmt.Sprintf("Run service command %q for running services of snap %q", op.action, op.snap.name)
	}
	if len(names) == 0 {
		names = op.services
	}
	var ns []string
	for _, a := range names {
		ns = append(ns, a.Name)
	}
	sort.Strings(ns)
	return fmt.Sprintf("Run service command %q for services %q of snap %q", op.action, ns, op.snap.name)
}

// orderServices sorts services by snap.yaml before/after, breaking ties by
// name (snap/info.go SortServices); the caller's order does not matter.
func orderServices(apps []*appState) []*appState {
	in := map[string]*appState{}
	for _, a := range apps {
		in[a.Name] = a
	}
	deps := map[string]map[string]bool{} // deps[x] = set that must come before x
	for _, a := range apps {
		if deps[a.Name] == nil {
			deps[a.Name] = map[string]bool{}
		}
		for _, b := range a.After {
			if in[b] != nil {
				deps[a.Name][b] = true
			}
		}
		for _, b := range a.Before {
			if in[b] != nil {
				if deps[b] == nil {
					deps[b] = map[string]bool{}
				}
				deps[b][a.Name] = true
			}
		}
	}
	var out []*appState
	done := map[string]bool{}
	for len(out) < len(apps) {
		var ready []string
		for n := range in {
			if done[n] {
				continue
			}
			ok := true
			for d := range deps[n] {
				if !done[d] {
					ok = false
				}
			}
			if ok {
				ready = append(ready, n)
			}
		}
		if len(ready) == 0 { // cycle: fall back to name order for the rest
			for n := range in {
				if !done[n] {
					ready = append(ready, n)
				}
			}
		}
		sort.Strings(ready)
		done[ready[0]] = true
		out = append(out, in[ready[0]])
	}
	return out
}

type stepKind int

const (
	stepEnable stepKind = iota
	stepDisable
	stepStart
	stepStop
	stepReload
)

type step struct {
	kind  stepKind
	app   *appState
	dur   time.Duration
	begun bool
	verb  string // systemctl verb named in a failure ("" = "start")
}

type svcRun struct {
	t     *task
	op    svcOp
	steps []*step
	idx   int
}

func (s *Server) addServiceTaskLocked(c *change, op svcOp) *task {
	t := s.newTaskLocked(c, "service-control", op.summary(), op.snap.name)
	t.noUndo = true // servicemgr.go: AddHandler("service-control", do, nil)
	r := &svcRun{t: t, op: op}
	t.run = func() { s.planLocked(r); s.runStepsLocked(r) }
	return t
}

// planLocked turns the action into systemctl-like steps, following
// overlord/servicestate/service_control.go and wrappers/services.go.
func (s *Server) planLocked(r *svcRun) {
	op := r.op
	ordered := orderServices(op.services)
	explicit := map[*appState]bool{}
	for _, a := range op.explicit {
		explicit[a] = true
	}
	add := func(k stepKind, a *appState, d time.Duration) {
		r.steps = append(r.steps, &step{kind: k, app: a, dur: d})
	}
	switch op.action {
	case "start":
		if op.modifier == "enable" {
			for _, a := range ordered {
				add(stepEnable, a, 0)
			}
		}
		for _, a := range ordered {
			d := a.StartDuration
			if a.Active {
				d = 0
			}
			add(stepStart, a, d)
		}
	case "stop":
		// doServiceControl sorts only for start/restart: a stop goes
		// through the task's services in name order, one systemctl stop
		// each, then disables them all (wrappers.StopServices).
		for _, a := range op.services {
			d := a.StopDuration
			if !a.Active {
				d = 0
			}
			add(stepStop, a, d)
		}
		if op.modifier == "disable" {
			for _, a := range op.services {
				add(stepDisable, a, 0)
			}
		}
	case "restart", "reload-or-restart":
		for _, a := range ordered {
			switch {
			case a.Active && op.action == "reload-or-restart":
				add(stepReload, a, 0)
			case a.Active:
				add(stepStop, a, a.StopDuration)
				add(stepStart, a, a.StartDuration)
			case explicit[a] || a.Enabled: // restart-enabled-non-active
				add(stepStart, a, a.StartDuration)
				if op.action == "reload-or-restart" {
					// one "systemctl reload-or-restart" call; a plain
					// restart is Stop then Start (systemd.Restart)
					r.steps[len(r.steps)-1].verb = "reload-or-restart"
				}
			}
		}
	}
}

// waitingLogDelay is how long a systemctl stop runs before the task logs
// "Waiting for ... to stop." (only if the stop is still running then).
const waitingLogDelay = time.Second

func (s *Server) runStepsLocked(r *svcRun) {
	for r.idx < len(r.steps) {
		if s.closed {
			return
		}
		st := r.steps[r.idx]
		if !st.begun {
			st.begun = true
			if st.kind == stepStop && st.app.Active {
				s.systemdLogLocked(st.app, "Stopping %s - %s...")
			}
			if st.kind == stepStop && st.dur > waitingLogDelay {
				// snapd logs this on the task only once the unit is still
				// stopping about a second in (measured ~1.03 s on real
				// 2.57.6 and 2.68.3 by integration's TestRawStopWaitingLog);
				// a stop that ends by then logs nothing.
				s.afterLocked(waitingLogDelay, func() {
					if r.idx < len(r.steps) && r.steps[r.idx] == st {
						s.logLocked(r.t, "INFO", fmt.Sprintf("Waiting for %q to stop.", "snap."+r.op.snap.name+"."+st.app.Name+".service"))
					}
				})
			}
			if st.dur > 0 {
				s.afterLocked(st.dur, func() {
					s.runStepsLocked(r)
					s.settleLocked()
				})
				return
			}
		}
		if failMsg := s.applyStepLocked(r, st); failMsg != "" {
			s.failServiceTaskLocked(r, failMsg)
			return
		}
		r.idx++
	}
	if r.t.status == StatusAbort {
		// aborted while Doing: the handler ran to the end (doServiceControl
		// ignores its tomb), so the runner moves it to Undo, and with no
		// undo handler it goes back to Done (overlord/state/taskrunner.go).
		s.setTaskStatusLocked(r.t, StatusUndo)
		return
	}
	s.setTaskStatusLocked(r.t, StatusDone)
}

func (s *Server) applyStepLocked(r *svcRun, st *step) string {
	a := st.app
	before := stateOf(a)
	defer func() { s.noteServiceLocked(a, before) }()
	switch st.kind {
	case stepEnable:
		a.Enabled = true
	case stepDisable:
		a.Enabled = false
	case stepStop:
		if a.Active {
			s.systemdLogLocked(a, "%[1]s: Deactivated successfully.")
			s.systemdLogLocked(a, "Stopped %s - %s.")
		}
		a.Active, a.pid = false, 0
	case stepReload:
		if !a.Active {
			s.startedLocked(a)
		}
		a.Active = true
	case stepStart:
		if a.FailStart != "" {
			s.systemdLogLocked(a, "%[1]s: Control process exited, code=exited, status=1/FAILURE")
			s.systemdLogLocked(a, "Failed to start %s - %s.")
			a.Active, a.pid = false, 0
			verb := st.verb
			if verb == "" {
				verb = "start"
			}
			return s.systemctlError(verb, r.op.snap.name, a.Name, a.FailStart)
		}
		if !a.Active {
			s.startedLocked(a)
		}
		a.Active = true
		if a.DiesAfterStart {
			// started, then its process exited: systemctl start succeeded
			s.noteServiceLocked(a, before)
			s.diedLocked(a)
			before = stateOf(a)
		}
	}
	return ""
}

func (s *Server) systemctlError(verb, snap, app, stderr string) string {
	unit := "snap." + snap + "." + app + ".service"
	msg := fmt.Sprintf("systemctl command [%s %s] failed with exit status 1: ", verb, unit)
	if s.cfg.version.systemctlStderrPrefix() {
		for len(stderr) > 0 && stderr[len(stderr)-1] == '\n' {
			stderr = stderr[:len(stderr)-1]
		}
		return msg + "stderr:\n" + stderr
	}
	return msg + stderr
}

// failServiceTaskLocked ends the task in Error. For "start", snapd's
// StartServices stops every service of the batch again in reverse order and,
// if --enable was given, disables every one of them (not only those it
// enabled: wrappers/services.go "always disable if enable was requested").
func (s *Server) failServiceTaskLocked(r *svcRun, msg string) {
	if r.op.action == "start" {
		ordered := orderServices(r.op.services)
		for i := len(ordered) - 1; i >= 0; i-- {
			a := ordered[i]
			before := stateOf(a)
			a.Active = false
			if r.op.modifier == "enable" {
				a.Enabled = false
			}
			s.noteServiceLocked(a, before)
		}
	}
	s.failTaskLocked(r.t, msg)
}

// afterLocked schedules f on the clock, run with s.mu held; Close cancels
// it, and so does the returned cancel func (which must be called without s.mu).
func (s *Server) afterLocked(d time.Duration, f func()) (cancel func()) {
	var id int
	s.timerSeq++
	id = s.timerSeq
	tm := s.clock.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.timers[id]; !ok || s.closed {
			return
		}
		delete(s.timers, id)
		f()
	})
	s.timers[id] = tm
	return func() {
		tm.Stop()
		s.mu.Lock()
		delete(s.timers, id)
		s.mu.Unlock()
	}
}
