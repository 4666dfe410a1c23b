package fake

import (
	"fmt"
	"time"
)

// ChangeSpec describes a change that the test controls: a "foreign" change
// (snap set, refresh, another client's service command) that blocks its snap
// until the test finishes or fails it, or a finished change for history.
type ChangeSpec struct {
	// Kind is the change kind, e.g. "configure-snap", "install-snap",
	// "auto-refresh", "service-control", or an exclusive kind such as
	// "remodel" (which blocks every snap).
	Kind string
	// Snap is the snap its tasks affect ("" for none).
	Snap string
	// Summary defaults to what snapd says for well-known kinds.
	Summary string
	// Tasks default to one task typical of Kind, affecting Snap. Tasks run
	// one after another; each stays Doing until Finish/Fail.
	Tasks []TaskSpec
	// WithSnapNames gives the change "snap-names" [Snap] whatever its
	// kind, and WithoutSnapNames gives it none, whatever its kind. By
	// default a change with a Snap has them when snapd's changes of its
	// Kind do: configure-snap, service-control, install-snap,
	// refresh-snap, remove-snap, revert-snap, enable-snap, disable-snap,
	// switch-snap, try-snap, auto-refresh, alias, connect-snap, ... (the
	// changes snapd's API makes for a snap, and auto-refresh). GET
	// /v2/changes?for=<snap> (snap changes SNAP) then lists it as it lists
	// a real `snap set`. WithoutSnapNames is for a change snapctl made
	// (its service-control changes have none).
	WithSnapNames, WithoutSnapNames bool
	// APIData is served as the change's "data" (snapd's "api-data").
	APIData map[string]any
	// ExclusiveMessage, if set, makes the change block every snap with
	// this conflict message (e.g. "snapd downgrade in progress, no other
	// changes allowed until this is done").
	ExclusiveMessage string
}

// TaskSpec describes one task of a ChangeSpec.
type TaskSpec struct {
	Kind, Summary string
	// Snaps it affects; nil means the ChangeSpec's Snap.
	Snaps []string
}

// snapKinds are the change kinds snapd gives the change data "snap-names"
// (the snaps it is about), which GET /v2/changes?for= matches: every
// change the API makes for a snap goes through daemon/api.go newChange
// with the snaps' names (api_snap_conf.go configure-snap, api_apps.go
// service-control, api_snaps.go install/refresh/remove/... -snap,
// api_sideload_n_try.go, api_aliases.go, api_interfaces.go,
// api_quotas.go, api_snapshots.go), and overlord/snapstate sets them on
// auto-refresh (autorefresh.go) and on its own remove-snap (snapmgr.go).
// snapctl's changes (ctlcmd) and snapd's own changes without a snap (seed,
// remodel, ...) have none. The 2.57.6 and 2.77.1 captures show it: GET
// /v2/changes?for=svcdemo lists the install-snap and the /v2/apps
// service-control changes, not the snapctl-made ones.
var snapKinds = map[string]bool{
	"configure-snap": true, "service-control": true,
	"install-snap": true, "refresh-snap": true, "remove-snap": true, "revert-snap": true,
	"enable-snap": true, "disable-snap": true, "switch-snap": true, "hold-snap": true,
	"unhold-snap": true, "snapshot-snap": true, "try-snap": true, "install-component": true,
	"auto-refresh": true, "alias": true, "unalias": true, "prefer": true,
	"connect-snap": true, "disconnect-snap": true, "quota-control": true,
	"check-snapshot": true, "restore-snapshot": true, "forget-snapshot": true,
}

// Change is a handle on a change in the fake.
type Change struct {
	s *Server
	c *change
}

func defaultSpec(kind, snap string) (string, TaskSpec) {
	switch kind {
	case "configure-snap":
		return fmt.Sprintf("Change configuration of %q snap", snap), TaskSpec{Kind: "run-hook", Summary: fmt.Sprintf("Run configure hook of %q snap", snap)}
	case "install-snap":
		return fmt.Sprintf("Install %q snap", snap), TaskSpec{Kind: "mount-snap", Summary: fmt.Sprintf("Mount snap %q", snap)}
	case "refresh-snap":
		return fmt.Sprintf("Refresh %q snap", snap), TaskSpec{Kind: "link-snap", Summary: fmt.Sprintf("Make snap %q available to the system", snap)}
	case "auto-refresh":
		return fmt.Sprintf("Auto-refresh snap %q", snap), TaskSpec{Kind: "link-snap", Summary: fmt.Sprintf("Make snap %q available to the system", snap)}
	case "remove-snap":
		return fmt.Sprintf("Remove %q snap", snap), TaskSpec{Kind: "unlink-snap", Summary: fmt.Sprintf("Make snap %q unavailable to the system", snap)}
	case "service-control":
		return "Running service command", TaskSpec{Kind: "service-control", Summary: fmt.Sprintf("Run service command \"restart\" for running services of snap %q", snap)}
	}
	return fmt.Sprintf("%s of snap %q", kind, snap), TaskSpec{Kind: kind, Summary: fmt.Sprintf("%s of snap %q", kind, snap)}
}

// AddChange creates a change that stays in progress (its first task Doing)
// until Finish or Fail is called on it.
func (s *Server) AddChange(spec ChangeSpec) *Change {
	s.mu.Lock()
	defer s.mu.Unlock()
	summary, deft := defaultSpec(spec.Kind, spec.Snap)
	if spec.Summary != "" {
		summary = spec.Summary
	}
	tasks := spec.Tasks
	if len(tasks) == 0 {
		tasks = []TaskSpec{deft}
	}
	c := s.newChangeLocked(spec.Kind, summary)
	c.exclusive = spec.ExclusiveMessage
	c.apiData = spec.APIData
	if spec.Snap != "" && !spec.WithoutSnapNames && (spec.WithSnapNames || snapKinds[spec.Kind]) {
		c.snapNames = []string{spec.Snap}
	}
	var prev *task
	for _, ts := range tasks {
		affects := ts.Snaps
		if affects == nil && spec.Snap != "" {
			affects = []string{spec.Snap}
		}
		t := s.newTaskLocked(c, ts.Kind, ts.Summary, affects...)
		if prev != nil {
			t.waitFor = []*task{prev}
		}
		prev = t
	}
	s.updateChangeLocked(c)
	s.settleLocked()
	return &Change{s: s, c: c}
}

// Change returns a handle on any change by id (nil if unknown), e.g. to
// Finish a service-control change of a hook.
func (s *Server) Change(id string) *Change {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.changeByID[id]; c != nil {
		return &Change{s: s, c: c}
	}
	return nil
}

// ID is the change id.
func (c *Change) ID() string { return c.c.id }

// Finish marks every pending test-controlled task Done, in order. Tasks the
// fake runs itself (service-control) are left to run. A task aborted while
// Doing is undone instead (Abort -> Undo -> Undoing -> Undone, as the task
// runner does when a handler returns after an abort).
func (c *Change) Finish() {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range c.c.tasks {
		if t.run != nil || statusReady(t.status) {
			continue
		}
		s.finishTaskLocked(t)
	}
	s.settleLocked()
}

// finishTaskLocked ends a test-controlled task's handler successfully.
func (s *Server) finishTaskLocked(t *task) {
	switch t.status {
	case StatusAbort:
		s.setTaskStatusLocked(t, StatusUndo)
		s.setTaskStatusLocked(t, StatusUndoing)
		s.setTaskStatusLocked(t, StatusUndone)
	case StatusDo:
		s.setTaskStatusLocked(t, StatusDoing)
		s.setTaskStatusLocked(t, StatusDone)
	case StatusDoing, StatusWait:
		s.setTaskStatusLocked(t, StatusDone)
	}
}

// Wait puts the current (first non-ready, test-controlled) task in Wait,
// as snapd's task runner does for a task that waits for a reboot or a
// manual step (Task.SetToWait in overlord/state/task.go). A change whose
// pending tasks all wait behind it reports Wait, which is not ready.
// Finish completes the waiting task.
func (c *Change) Wait() {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := c.currentLocked(); t != nil {
		if t.status == StatusDo {
			s.setTaskStatusLocked(t, StatusDoing)
		}
		s.setTaskStatusLocked(t, StatusWait)
	}
	s.settleLocked()
}

// currentLocked returns the first non-ready task the test controls, or nil.
func (c *Change) currentLocked() *task {
	for _, t := range c.c.tasks {
		if t.run == nil && !statusReady(t.status) {
			return t
		}
	}
	return nil
}

// Next marks the current (first pending, test-controlled) task Done, so
// the next one starts: for walking a multi-task change step by step.
// It reports whether a task was finished.
func (c *Change) Next() bool {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range c.c.tasks {
		if t.run != nil || statusReady(t.status) || t.status == StatusDo {
			continue
		}
		s.finishTaskLocked(t)
		s.settleLocked()
		return true
	}
	return false
}

// Fail makes the current (first non-ready, test-controlled) task fail with
// msg, as the task runner handles a failing handler: the change is aborted
// (pending tasks go to Hold, Done tasks are undone) and the task ends in
// Error, so the change ends in Error.
func (c *Change) Fail(msg string) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := c.currentLocked(); t != nil {
		s.failTaskLocked(t, msg)
	}
	s.settleLocked()
}

// Abort aborts the change as POST /v2/changes/{id} {"action":"abort"} would.
func (c *Change) Abort() {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !statusReady(c.c.status()) {
		s.abortLocked(c.c)
	}
}

// Ready returns a channel closed when the change becomes ready.
func (c *Change) Ready() <-chan struct{} { return c.c.readyCh }

// ReadyTime is when the change became ready (zero before), on the fake's clock.
func (c *Change) ReadyTime() time.Time {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.c.readyTime
}

// Info returns the change's current state.
func (c *Change) Info() ChangeInfo {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.infoLocked(c.c)
}

// Hook is a running hook of a snap: its own change with a run-hook task.
// snapctl calls with its Cookie run in hook context.
type Hook struct {
	s      *Server
	snap   string
	name   string
	cookie string
	c      *change
	t      *task
	// refreshAction is what a gate-auto-refresh hook answered through
	// snapctl refresh ("hold", "proceed").
	refreshAction string
}

var hookChangeKinds = map[string]string{
	"configure": "configure-snap", "default-configure": "install-snap", "install": "install-snap",
	"post-refresh": "refresh-snap", "pre-refresh": "refresh-snap", "remove": "remove-snap",
	"gate-auto-refresh": "auto-refresh",
}

// StartHook starts hook (e.g. "configure") of snap and returns it. The
// hook's change (configure-snap for "configure", auto-refresh for
// "gate-auto-refresh", whose snapctl refresh --hold/--proceed the fake
// answers: Hook.RefreshAction) blocks other changes on the snap until
// Finish or Fail. snapctl start/stop/restart from a
// configure or default-configure hook are queued into this change and run
// after the hook finishes; from other hooks they make their own change,
// ignoring this one in the conflict check.
func (s *Server) StartHook(snap, hook string) *Hook {
	s.mu.Lock()
	defer s.mu.Unlock()
	kind := hookChangeKinds[hook]
	summary := ""
	switch kind {
	case "configure-snap":
		summary = fmt.Sprintf("Change configuration of %q snap", snap)
	case "":
		kind = "run-hook"
		summary = fmt.Sprintf("Run hook %s of snap %q", hook, snap)
	default:
		summary, _ = defaultSpec(kind, snap)
	}
	c := s.newChangeLocked(kind, summary)
	if snapKinds[kind] {
		// the change the hook runs in: snap set's configure-snap,
		// an install's or a refresh's
		c.snapNames = []string{snap}
	}
	tsum := fmt.Sprintf("Run %s hook of %q snap", hook, snap)
	if hook == "gate-auto-refresh" {
		// hookstate.SetupGateAutoRefreshHook, in the auto-refresh change
		tsum = fmt.Sprintf("Run hook %s of snap %q", hook, snap)
	}
	t := s.newTaskLocked(c, "run-hook", tsum, snap)
	s.lastHookSeq++
	h := &Hook{s: s, snap: snap, name: hook, c: c, t: t,
		cookie: fmt.Sprintf("%s-hook-%d-%s", snap, s.lastHookSeq, cookieFor(snap + hook)[:12])}
	s.hooks[h.cookie] = h
	s.updateChangeLocked(c)
	s.settleLocked()
	return h
}

// Cookie is the hook's context id (SNAP_COOKIE/SNAP_CONTEXT inside the hook).
func (h *Hook) Cookie() string { return h.cookie }

// ChangeID is the id of the hook's change.
func (h *Hook) ChangeID() string { return h.c.id }

// Change returns a handle on the hook's change.
func (h *Hook) Change() *Change { return &Change{s: h.s, c: h.c} }

// Finish ends the hook successfully; queued service commands then run.
func (h *Hook) Finish() { h.end("") }

// Fail ends the hook with an error; queued service commands are put on Hold.
func (h *Hook) Fail(msg string) { h.end(msg) }

func (h *Hook) end(msg string) {
	s := h.s
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.hooks, h.cookie)
	if statusReady(h.t.status) {
		return
	}
	if msg != "" {
		s.failTaskLocked(h.t, msg)
	} else {
		s.finishTaskLocked(h.t)
	}
	s.settleLocked()
}
