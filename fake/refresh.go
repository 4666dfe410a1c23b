package fake

import (
	"fmt"
	"sort"
	"time"
)

// revState is one revision in a snap's sequence.
type revState struct {
	rev, version string
	apps         []App // the revision's apps (definitions; the current one's live states are snapState.apps)
}

// revision returns the retained revision rev of the snap.
func (ss *snapState) revision(rev string) (revState, bool) {
	for _, r := range ss.seq {
		if r.rev == rev {
			return r, true
		}
	}
	return revState{}, false
}

// appDefs returns the current apps as definitions (with their current
// enabled state), sorted by name.
func (ss *snapState) appDefs() []App {
	var out []App
	for _, a := range ss.apps {
		out = append(out, a.App)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// currentRevLocked returns the snap's current revision, starting its
// sequence on first use (the current revision is the sequence's last).
func (s *Server) currentRevLocked(ss *snapState) revState {
	if len(ss.seq) == 0 {
		rev, ver := ss.info.Revision, ss.info.Version
		if rev == "" {
			rev = "x1"
		}
		if ver == "" {
			ver = "1"
		}
		ss.seq = []revState{{rev: rev, version: ver, apps: ss.appDefs()}}
	}
	cur := ss.seq[len(ss.seq)-1]
	cur.apps = ss.appDefs()
	return cur
}

// refreshRetain is snapd's refresh.retain default on a classic system:
// the current revision and one before it stay installed.
const refreshRetain = 2

// snapOp is one refresh-snap or install-snap (a local file over the
// installed snap) change being run.
type snapOp struct {
	kind    string // "refresh-snap" or "install-snap"
	ss      *snapState
	to      revState
	present bool   // to is in the sequence already (a local amend): prepare-snap, no mount
	channel string // a store refresh's channel ("latest/stable")
	file    string // a local install's file name (its summary)

	// while running
	from                      revState
	fromApps                  map[string]*appState
	fromSeq                   []revState
	fromDate                  time.Time
	fromGating, fromFirstHeld time.Time
	fromTracking              string
	stopped                   []*appState // what stop-snap-services stopped
	started                   []*appState // what start-snap-services started
}

// startSnapOpLocked makes op's change with snapd's tasks (the list
// captured from real 2.68.3 and 2.77.1, overlord/snapstate/snap.go
// snapInstallChoreographer): every task affects the snap (the conflict
// rule, data.affected-snaps) but refresh's last, check-rerefresh. The
// tasks that stop and start the services, switch the revision and run the
// configure hook do so on the Clock; the rest are instantaneous. A failing
// start of the new revision's services fails start-snap-services, and the
// change is undone as snapd undoes it: the new services stopped, the old
// revision linked again and its enabled services started; the change ends
// in Error.
func (s *Server) startSnapOpLocked(op *snapOp, summary string) *response {
	ss, name, v := op.ss, op.ss.name, s.cfg.version
	cur := s.currentRevLocked(ss)
	if op.to.version == "" {
		op.to.version = cur.version
	}
	c := s.newChangeLocked(op.kind, summary)
	if op.kind == "install-snap" {
		// daemon/api_sideload_n_try.go sideloadSnap
		c.snapNames = []string{name}
		c.apiData = map[string]any{"snap-name": name}
		if v.atLeast(Version268) {
			c.apiData["snap-names"] = []string{name}
		}
	} else {
		s.setSnapNamesLocked(c, name)
	}

	// the sequence after the operation, and what falls out of it (addCleanupTasks)
	var seq []revState
	for _, r := range ss.seq {
		if r.rev != op.to.rev {
			seq = append(seq, r)
		}
	}
	seq = append(seq, op.to)
	var discard []revState
	for len(seq) > refreshRetain {
		discard = append(discard, seq[0])
		seq = seq[1:]
	}

	label := op.to.rev // the revision in summaries: "unset" until a local file's prepare-snap has run
	if op.kind == "install-snap" {
		label = "unset"
	}
	var prev *task
	add := func(kind, summary string, run func(t *task)) *task {
		t := s.newTaskLocked(c, kind, summary, name)
		if prev != nil {
			t.waitFor = append(t.waitFor, prev)
		}
		prev = t
		if run == nil {
			run = func(t *task) { s.handlerDoneLocked(t) }
		}
		t.run = func() { run(t) }
		return t
	}
	noUndo := func(t *task) { t.noUndo = true } // registered without an undo handler (snapmgr.go)

	noUndo(add("prerequisites", fmt.Sprintf("Ensure prerequisites for %q are available", name), nil))
	switch {
	case op.channel != "":
		add("download-snap", fmt.Sprintf("Download snap %q (%s) from channel %q", name, label, op.channel), nil)
		noUndo(add("validate-snap", fmt.Sprintf("Fetch and check assertions for snap %q (%s)", name, label), nil))
	case op.present:
		path := "/var/lib/snapd/snaps/" + name + "_" + op.to.rev + ".snap"
		if !v.atLeast(Version268) {
			path = "" // 2.57.6: `Prepare snap "" (x1)` (captured)
		}
		add("prepare-snap", fmt.Sprintf("Prepare snap %q (%s)", path, label), nil)
	default:
		s.localInstalls++
		add("prepare-snap", fmt.Sprintf("Prepare snap %q (%s)", fmt.Sprintf("/var/lib/snapd/snaps/.local-install-%d", 1000000000+s.localInstalls), label), nil)
	}
	if v.atLeast("2.77") {
		noUndo(add("prerequisites", fmt.Sprintf("Wait until prerequisites for %q are available", name), nil))
	}
	if !op.present {
		add("mount-snap", fmt.Sprintf("Mount snap %q (%s)", name, label), nil)
	}
	add("run-hook", fmt.Sprintf("Run pre-refresh hook of %q snap if present", name), nil)
	stop := add("stop-snap-services", fmt.Sprintf("Stop snap %q services", name), func(t *task) { s.stopSnapServicesLocked(op, t) })
	stop.undo = func() { s.undoStopSnapServicesLocked(op) }
	add("remove-aliases", fmt.Sprintf("Remove aliases for snap %q", name), nil)
	add("unlink-current-snap", fmt.Sprintf("Make current revision for snap %q unavailable", name), nil)
	add("copy-snap-data", fmt.Sprintf("Copy snap %q data", name), nil)
	if v.atLeast("2.77") {
		add("setup-profiles", fmt.Sprintf("Prepare snap %q (%s) for security profile setup", name, label), nil)
	} else {
		add("setup-profiles", fmt.Sprintf("Setup snap %q (%s) security profiles", name, label), nil)
	}
	link := add("link-snap", fmt.Sprintf("Make snap %q (%s) available to the system", name, label), func(t *task) {
		s.linkSnapLocked(op, seq)
		s.handlerDoneLocked(t)
	})
	link.undo = func() { s.undoLinkSnapLocked(op) }
	add("auto-connect", fmt.Sprintf("Automatically connect eligible plugs and slots of snap %q", name), nil)
	add("set-auto-aliases", fmt.Sprintf("Set automatic aliases for snap %q", name), nil)
	add("setup-aliases", fmt.Sprintf("Setup snap %q aliases", name), nil)
	add("run-hook", fmt.Sprintf("Run post-refresh hook of %q snap if present", name), nil)
	start := add("start-snap-services", fmt.Sprintf("Start snap %q (%s) services", name, label), func(t *task) { s.startSnapServicesLocked(op, t, 0) })
	start.undo = func() { s.undoStartSnapServicesLocked(op) }
	for _, r := range discard {
		noUndo(add("clear-snap", fmt.Sprintf("Remove data for snap %q (%s)", name, r.rev), nil))
		noUndo(add("discard-snap", fmt.Sprintf("Remove snap %q (%s) from the system", name, r.rev), nil))
	}
	noUndo(add("cleanup", fmt.Sprintf("Clean up %q (%s) install", name, label), nil))
	add("run-hook", fmt.Sprintf("Run configure hook of %q snap if present", name), func(t *task) { s.runConfigureLocked(t, ss, nil) })
	add("run-hook", fmt.Sprintf("Run health check of %q snap", name), nil)
	last := prev
	// Free-standing tasks that run (Doing) from the start, affect no snap
	// and end once the snap's tasks are done: check-rerefresh
	// (finalizeUpdate) for a refresh; from 2.77
	// process-delayed-security-backend-effects, which then adds a last
	// setup-profiles task (captured from 2.77.1).
	free := func(kind, summary string) *task {
		t := s.newTaskLocked(c, kind, summary)
		t.affects = nil
		t.noUndo = true
		t.free = true
		t.run = func() {}
		return t
	}
	var rr, pd *task
	if op.kind == "refresh-snap" {
		if v.atLeast(Version268) {
			rr = free("check-rerefresh", fmt.Sprintf("Monitoring snap %q to determine whether extra refresh steps are required", name))
		} else {
			rr = free("check-rerefresh", fmt.Sprintf("Handling re-refresh of %q as needed", name))
		}
	}
	if v.atLeast("2.77") {
		pd = free("process-delayed-security-backend-effects", "Process delayed security backend side effects for affected snaps")
	}
	// The chain may run to its end within one settle pass (no durations),
	// before the free tasks, later in the list, were started: end them
	// from Do as well as from Doing.
	endFree := func(t *task) bool {
		switch t.status {
		case StatusDo:
			s.setTaskStatusLocked(t, StatusDoing)
		case StatusDoing:
		default:
			return false
		}
		return true
	}
	last.onDone = func() {
		if rr != nil && endFree(rr) {
			if !v.atLeast(Version268) {
				s.logLocked(rr, "INFO", "No re-refreshes found.")
			}
			s.setTaskStatusLocked(rr, StatusDone)
		}
		if pd != nil && endFree(pd) {
			sp := s.newTaskLocked(c, "setup-profiles", fmt.Sprintf("Setup snap %q (%s) security profiles", name, op.to.rev), name)
			sp.waitFor = []*task{pd}
			sp.run = func() { s.handlerDoneLocked(sp) }
			s.setTaskStatusLocked(pd, StatusDone)
		}
	}
	s.updateChangeLocked(c)
	s.settleLocked()
	return asyncResp(c.id)
}

// handlerDoneLocked ends a task whose handler returned successfully: Done,
// or, if the change was aborted meanwhile, Undo (then undone).
func (s *Server) handlerDoneLocked(t *task) {
	if t.status == StatusAbort {
		s.setTaskStatusLocked(t, StatusUndo)
		s.undoReadyLocked(t.chg)
		return
	}
	s.setTaskStatusLocked(t, StatusDone)
}

// stopSnapServicesLocked mirrors stop-snap-services (stop reason
// "refresh"): every active service of the snap is stopped in one
// systemctl call, each taking its StopDuration; one still stopping a second
// in logs `Waiting for "snap.S.A.service" to stop.` on the task, as snapd
// does.
func (s *Server) stopSnapServicesLocked(op *snapOp, t *task) {
	var active []*appState
	for _, a := range op.ss.services() {
		if a.Active {
			active = append(active, a)
		}
	}
	op.stopped = active
	if len(active) == 0 {
		s.handlerDoneLocked(t)
		return
	}
	left := len(active)
	var slow []*appState
	for _, a := range active {
		s.systemdLogLocked(a, "Stopping %s - %s...")
		if a.StopDuration > waitingLogDelay {
			slow = append(slow, a)
		}
	}
	if len(slow) > 0 {
		s.afterLocked(waitingLogDelay, func() {
			for _, a := range slow {
				if a.Active && t.status == StatusDoing {
					s.logLocked(t, "INFO", fmt.Sprintf("Waiting for %q to stop.", unitName(a)))
				}
			}
		})
	}
	done := func(a *appState) {
		s.stopAppLocked(a)
		left--
		if left == 0 {
			s.handlerDoneLocked(t)
		}
	}
	for _, a := range active {
		if a.StopDuration <= 0 {
			done(a)
			continue
		}
		s.afterLocked(a.StopDuration, func() {
			done(a)
			s.settleLocked()
		})
	}
}

// undoStopSnapServicesLocked starts again the old revision's enabled
// services that stop-snap-services stopped.
func (s *Server) undoStopSnapServicesLocked(op *snapOp) {
	for _, a := range orderServices(op.stopped) {
		if a.Enabled && !a.Active && a.FailStart == "" {
			s.startAppLocked(a)
		}
	}
}

// linkSnapLocked makes the new revision current (link-snap): its apps
// replace the old ones (a service keeps its enabled state by name; a new
// one takes its App.Enabled; none is active yet), the version, revision,
// install date and sequence change.
func (s *Server) linkSnapLocked(op *snapOp, seq []revState) {
	ss := op.ss
	op.from = s.currentRevLocked(ss)
	op.fromApps = ss.apps
	op.fromSeq = ss.seq
	op.fromDate = ss.installed
	apps := map[string]*appState{}
	for _, def := range op.to.apps {
		if def.Daemon != "" && def.DaemonScope == "" {
			def.DaemonScope = "system"
		}
		def.Before = append([]string(nil), def.Before...)
		def.After = append([]string(nil), def.After...)
		a := &appState{App: def, snap: ss.name}
		a.Active = false
		if old := op.fromApps[def.Name]; def.Daemon != "" && old != nil && old.Daemon != "" {
			a.Enabled = old.Enabled
		}
		apps[def.Name] = a
	}
	ss.apps = apps
	op.fromTracking = ss.info.TrackingChannel
	if op.channel != "" {
		// a store refresh: the snap tracks the channel it came from
		// (GET /v2/snaps: tracking-channel and channel "latest/beta")
		ss.info.TrackingChannel = op.channel
	}
	ss.info.Revision, ss.info.Version = op.to.rev, op.to.version
	ss.installed = s.nowLocked()
	ss.seq = append([]revState(nil), seq...)
	// refreshed: its gate-auto-refresh hold is over (snapstate drops the
	// gating holds of refreshed snaps)
	op.fromGating, op.fromFirstHeld = ss.gatingHold, ss.gatingFirstHeld
	ss.gatingHold, ss.gatingFirstHeld = time.Time{}, time.Time{}
}

// undoLinkSnapLocked links the old revision again.
func (s *Server) undoLinkSnapLocked(op *snapOp) {
	ss := op.ss
	if op.fromApps == nil {
		return
	}
	ss.apps = op.fromApps
	ss.info.TrackingChannel = op.fromTracking
	ss.info.Revision, ss.info.Version = op.from.rev, op.from.version
	ss.installed = op.fromDate
	ss.seq = op.fromSeq
	ss.gatingHold, ss.gatingFirstHeld = op.fromGating, op.fromFirstHeld
}

// startSnapServicesLocked mirrors start-snap-services: the enabled
// services of the (new) current revision start in before/after order,
// each taking its StartDuration. A failing one fails the task with
// systemctl's error after stopping again those it started
// (wrappers.StartServices' rollback); the change is then undone.
func (s *Server) startSnapServicesLocked(op *snapOp, t *task, from int) {
	var enabled []*appState
	for _, a := range op.ss.services() {
		if a.Enabled {
			enabled = append(enabled, a)
		}
	}
	enabled = orderServices(enabled)
	for i := from; i < len(enabled); i++ {
		a := enabled[i]
		if a.Active {
			continue
		}
		if a.StartDuration > 0 {
			s.afterLocked(a.StartDuration, func() {
				if s.startOneLocked(op, t, a) {
					s.startSnapServicesLocked(op, t, i+1)
				}
				s.settleLocked()
			})
			return
		}
		if !s.startOneLocked(op, t, a) {
			return
		}
	}
	s.handlerDoneLocked(t)
}

// startOneLocked starts one service of start-snap-services. It reports
// whether the task may go on.
func (s *Server) startOneLocked(op *snapOp, t *task, a *appState) bool {
	if statusReady(t.status) {
		return false
	}
	if a.FailStart != "" {
		before := stateOf(a)
		s.systemdLogLocked(a, "%[1]s: Control process exited, code=exited, status=1/FAILURE")
		s.systemdLogLocked(a, "Failed to start %s - %s.")
		a.Active, a.pid = false, 0
		s.noteServiceLocked(a, before)
		for j := len(op.started) - 1; j >= 0; j-- {
			if o := op.started[j]; o.Active {
				s.stopAppLocked(o)
			}
		}
		s.failTaskLocked(t, s.systemctlError("start", op.ss.name, a.Name, a.FailStart))
		return false
	}
	op.started = append(op.started, a)
	s.startAppLocked(a)
	return true
}

// undoStartSnapServicesLocked stops the new revision's services again.
func (s *Server) undoStartSnapServicesLocked(op *snapOp) {
	for _, a := range op.ss.services() {
		if a.Active {
			s.stopAppLocked(a)
		}
	}
}

// startAppLocked starts a service (systemd's lines, a main pid, its
// history); one that DiesAfterStart is inactive again at once.
func (s *Server) startAppLocked(a *appState) {
	before := stateOf(a)
	if !a.Active {
		s.startedLocked(a)
	}
	a.Active = true
	s.noteServiceLocked(a, before)
	if a.DiesAfterStart {
		s.diedLocked(a)
	}
}

// diedLocked: the service's main process exited right after it started.
func (s *Server) diedLocked(a *appState) {
	before := stateOf(a)
	s.systemdLogLocked(a, "%[1]s: Main process exited, code=exited, status=1/FAILURE")
	s.systemdLogLocked(a, "%[1]s: Failed with result 'exit-code'.")
	a.Active, a.pid = false, 0
	s.noteServiceLocked(a, before)
}

// stopAppLocked stops an active service.
func (s *Server) stopAppLocked(a *appState) {
	before := stateOf(a)
	if a.Active {
		s.systemdLogLocked(a, "%[1]s: Deactivated successfully.")
		s.systemdLogLocked(a, "Stopped %s - %s.")
	}
	a.Active, a.pid = false, 0
	s.noteServiceLocked(a, before)
}
