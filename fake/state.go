package fake

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Status strings of changes and tasks (overlord/state/change.go).
const (
	StatusDefault = "Default"
	StatusDo      = "Do"
	StatusDoing   = "Doing"
	StatusDone    = "Done"
	StatusAbort   = "Abort"
	StatusUndo    = "Undo"
	StatusUndoing = "Undoing"
	StatusUndone  = "Undone"
	StatusHold    = "Hold"
	StatusError   = "Error"
	StatusWait    = "Wait"
)

// statusReady mirrors Status.Ready in overlord/state/change.go.
func statusReady(s string) bool {
	switch s {
	case StatusDone, StatusUndone, StatusHold, StatusError:
		return true
	}
	return false
}

// statusOrder is the precedence used to derive a change's status from its
// tasks' statuses (overlord/state/change.go, statusOrder): Wait ranks after
// Do and before Error (2.59+, where Wait appeared); a change is Wait outright
// only when every pending task is blocked behind a Wait task
// (Change.isChangeWaiting).
var statusOrder = []string{StatusAbort, StatusUndoing, StatusUndo, StatusDoing, StatusDo, StatusWait, StatusError, StatusUndone, StatusDone, StatusHold}

type appState struct {
	App
	snap string
	pid  int // main pid of the running service (journal _PID), 0 when inactive
}

type snapState struct {
	name   string
	cookie string
	apps   map[string]*appState
	config map[string]any // nested: "a.b" is config["a"]["b"]
	info   Snap           // as installed (metadata for /v2/snaps)
	// installed is when the snap was installed, on the fake's clock
	// (install-date).
	installed time.Time
	// seq is the snap's sequence: its retained revisions, oldest first,
	// the current one included (filled on the first refresh or install).
	seq []revState
	// hold is the system (user) hold of its refreshes (2.58+), nil when none.
	hold *refreshHold
	// gatingHold is until when the snap's gate-auto-refresh hook held its
	// own auto-refresh (snapctl refresh --hold), zero when not held;
	// gatingFirstHeld when it first did.
	gatingHold, gatingFirstHeld time.Time
}

func (ss *snapState) services() []*appState {
	var out []*appState
	for _, a := range ss.apps {
		if a.Daemon != "" {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

type task struct {
	id      string
	kind    string
	summary string
	status  string
	log     []string
	spawn   time.Time
	ready   time.Time
	affects []string // snaps this task affects (conflict rule, data.affected-snaps)
	waitFor []*task
	chg     *change
	run     func() // started when the task becomes Doing; nil: manual (Finish/Fail)
	onDone  func() // called once when the task ends Done (e.g. committing a configuration patch)
	undo    func() // called once when the task is undone (its effects reverted), before it ends Undone
	// noUndo marks kinds registered without an undo handler
	// (service-control in overlord/servicestate/servicemgr.go, exec-command
	// in overlord/cmdstate/cmdmgr.go): when their change is aborted they go
	// Undo and the task runner puts them back to Done
	// (overlord/state/taskrunner.go, Ensure).
	noUndo bool
	// free marks a free-standing task that runs (Doing) until the tasks
	// it watches are done (check-rerefresh); when its change is aborted,
	// its handler returns and it goes Abort -> Undo -> Done.
	free bool
}

type change struct {
	id        string
	kind      string
	summary   string
	tasks     []*task
	spawn     time.Time
	readyTime time.Time
	snapNames []string // change data "snap-names" (used by GET /v2/changes?for=)
	apiData   map[string]any
	readyCh   chan struct{}
	// lastNoticed is the status of the last change-update notice recorded
	// for a status change ("" = Default, the status at spawn), as
	// Change.lastRecordedNoticeStatus in overlord/state/change.go.
	lastNoticed string
	exclusive   string // message when this change blocks every snap
	// fixed is a status set on the change itself (Change.SetStatus), which
	// overrides its tasks': a hold-snap change has no tasks and is Done.
	fixed string
}

func (c *change) status() string {
	if c.fixed != "" {
		return c.fixed
	}
	if len(c.tasks) == 0 {
		return StatusHold
	}
	seen := map[string]bool{}
	for _, t := range c.tasks {
		seen[t.status] = true
	}
	if seen[StatusWait] && c.waiting() {
		return StatusWait
	}
	for _, s := range statusOrder {
		if seen[s] {
			return s
		}
	}
	return StatusDone
}

// waiting mirrors Change.isChangeWaiting: every task is ready or Wait, or in
// Do behind prerequisites that are (transitively) waiting.
func (c *change) waiting() bool {
	memo := map[*task]bool{}
	var blocked func(t *task, depth int) bool
	blocked = func(t *task, depth int) bool {
		if v, ok := memo[t]; ok || depth > len(c.tasks) {
			return v
		}
		w := false
		for _, d := range t.waitFor {
			switch d.status {
			case StatusWait:
				w = true
			case StatusDone, StatusUndone, StatusError, StatusHold:
				continue
			case StatusDo:
				w = blocked(d, depth+1)
			default:
				w = false
			}
			if !w {
				break
			}
		}
		memo[t] = w
		return w
	}
	for _, t := range c.tasks {
		switch t.status {
		case StatusWait, StatusDone, StatusUndone, StatusError, StatusHold:
		case StatusDo:
			if !blocked(t, 0) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// isReady reports whether the change's ready channel is closed.
func (c *change) isReady() bool {
	select {
	case <-c.readyCh:
		return true
	default:
		return false
	}
}

// errText mirrors Change.Err: one line per task in Error with its ERROR logs.
func (c *change) errText() string {
	if c.status() != StatusError {
		return ""
	}
	out := "cannot perform the following tasks:"
	n := 0
	for _, t := range c.tasks {
		if t.status != StatusError {
			continue
		}
		for _, l := range t.log {
			if msg, ok := stripErrorLog(l); ok {
				out += fmt.Sprintf("\n- %s (%s)", t.summary, msg)
				n++
			}
		}
	}
	if n == 0 {
		return fmt.Sprintf("internal inconsistency: change %q in ErrorStatus with no task errors logged", c.kind)
	}
	return out
}

// stripErrorLog returns the message of a "<time> ERROR <msg>" log entry.
func stripErrorLog(l string) (string, bool) {
	_, rest, ok := strings.Cut(l, " ")
	if !ok {
		return "", false
	}
	return strings.CutPrefix(rest, "ERROR ")
}

type notice struct {
	id           string
	typ          string
	key          string
	first, last  time.Time
	lastRepeated time.Time
	occurrences  int
	lastData     map[string]string
}

// ---- state mutation helpers; all require s.mu held ----

func (s *Server) nowLocked() time.Time { return s.clock.Now().UTC() }

func (s *Server) newChangeLocked(kind, summary string) *change {
	s.lastChangeID++
	c := &change{
		id:      strconv.Itoa(s.lastChangeID),
		kind:    kind,
		summary: summary,
		spawn:   s.nowLocked(),
		readyCh: make(chan struct{}),
	}
	s.changes = append(s.changes, c)
	s.active = append(s.active, c)
	s.changeByID[c.id] = c
	s.stateChangedLocked()
	s.counters.ChangesCreated++
	// State.NewChange records the first change-update notice at spawn.
	s.addChangeNoticeLocked(c)
	return c
}

func (s *Server) newTaskLocked(c *change, kind, summary string, affects ...string) *task {
	s.lastTaskID++
	t := &task{
		id:      strconv.Itoa(s.lastTaskID),
		kind:    kind,
		summary: summary,
		status:  StatusDo,
		spawn:   s.nowLocked(),
		affects: affects,
		chg:     c,
	}
	c.tasks = append(c.tasks, t)
	return t
}

func (s *Server) logLocked(t *task, level, msg string) {
	s.stateChangedLocked()
	t.log = append(t.log, s.nowLocked().Format(time.RFC3339)+" "+level+" "+msg)
	if len(t.log) > 10 { // overlord/state/task.go keeps the last 10
		t.log = t.log[len(t.log)-10:]
	}
}

// setTaskStatusLocked changes a task's status and, like Task.SetStatus
// (overlord/state/task.go -> Change.taskStatusChanged), lets the change
// record a change-update notice and become ready on every single task
// status change.
func (s *Server) setTaskStatusLocked(t *task, st string) {
	if t.status == st {
		return
	}
	s.stateChangedLocked()
	t.status = st
	if statusReady(st) && t.ready.IsZero() {
		t.ready = s.nowLocked()
	}
	if st == StatusDone && t.onDone != nil {
		f := t.onDone
		t.onDone = nil
		f()
	}
	if t.chg != nil {
		s.taskStatusChangedLocked(t.chg)
	}
}

// abortTasksLocked mirrors Change.Abort / AbortLanes (every task is in lane 0
// in the fake): Do -> Hold, Doing -> Abort, Done -> Undo (undone by
// undoReadyLocked once the tasks waiting for it are ready).
func (s *Server) abortTasksLocked(c *change) {
	for _, t := range c.tasks {
		switch t.status {
		case StatusDo:
			s.setTaskStatusLocked(t, StatusHold)
		case StatusDoing:
			s.setTaskStatusLocked(t, StatusAbort)
		case StatusDone:
			s.setTaskStatusLocked(t, StatusUndo)
		}
	}
}

// undoReadyLocked runs the undo of c's tasks in Undo whose halt tasks (the
// tasks waiting for them) are all ready (taskrunner.go mustWait): kinds
// without an undo handler go back to Done (taskrunner.go Ensure: "Cannot
// undo. Revert to done status."), test-controlled tasks go Undoing ->
// Undone. It reports whether anything changed.
func (s *Server) undoReadyLocked(c *change) bool {
	progressed := false
	for i := len(c.tasks) - 1; i >= 0; i-- {
		t := c.tasks[i]
		if t.status != StatusUndo {
			continue
		}
		halted := true
		for _, o := range c.tasks {
			for _, w := range o.waitFor {
				if w == t && !statusReady(o.status) {
					halted = false
				}
			}
		}
		if !halted {
			continue
		}
		progressed = true
		if t.noUndo {
			s.setTaskStatusLocked(t, StatusDone)
			continue
		}
		s.setTaskStatusLocked(t, StatusUndoing)
		if f := t.undo; f != nil {
			t.undo = nil
			f()
		}
		s.setTaskStatusLocked(t, StatusUndone)
	}
	return progressed
}

// failTaskLocked mirrors the task runner when a handler returns an error
// (overlord/state/taskrunner.go run): the task's lanes are aborted first
// (the failing task itself goes Doing -> Abort), then the task is set to
// Error with an ERROR log entry, then aborted Done tasks are undone. The
// change therefore passes through Abort, which is why a failed
// service-control change has 4 change-update occurrences (spawn, Doing,
// Abort, Error) against 3 for a successful one (golden 2.77.1 notices-all).
func (s *Server) failTaskLocked(t *task, msg string) {
	s.abortTasksLocked(t.chg)
	s.logLocked(t, "ERROR", msg)
	s.setTaskStatusLocked(t, StatusError)
	s.undoReadyLocked(t.chg)
}

// settleLocked starts every task whose prerequisites are done, holds tasks
// whose prerequisites failed, then updates change statuses, notices and
// ready channels. Task runners may complete synchronously, so it loops.
// It reads the changes not ready yet only (s.active, pruned here), so a
// long test pays nothing for the changes of its past.
func (s *Server) settleLocked() {
	defer func() { s.active = slices.DeleteFunc(s.active, (*change).isReady) }()
	for i := 0; i < 1000; i++ {
		progressed := false
		for _, c := range s.active {
			if c.isReady() {
				continue
			}
			for _, t := range c.tasks {
				if t.status != StatusDo {
					continue
				}
				ok, blocked := true, false
				for _, w := range t.waitFor {
					switch w.status {
					case StatusDone:
					case StatusError, StatusHold, StatusUndone:
						blocked = true
					default:
						ok = false
					}
				}
				if blocked {
					s.setTaskStatusLocked(t, StatusHold)
					progressed = true
					continue
				}
				if !ok {
					continue
				}
				s.setTaskStatusLocked(t, StatusDoing)
				progressed = true
				if t.run != nil {
					t.run()
				}
			}
			for _, t := range c.tasks {
				if t.free && t.status == StatusAbort {
					s.setTaskStatusLocked(t, StatusUndo)
					progressed = true
				}
			}
			if s.undoReadyLocked(c) {
				progressed = true
			}
			s.updateChangeLocked(c)
		}
		if !progressed {
			break
		}
	}
	s.wakeLocked()
}

// taskStatusChangedLocked mirrors Change.taskStatusChanged and
// notifyStatusChange: a change-update notice is recorded unless the status
// equals the last recorded one or is a Doing->Do / Undoing->Undo flip
// (shouldSkipChangeUpdateNotice); the last recorded status only moves when
// a notice is recorded.
func (s *Server) taskStatusChangedLocked(c *change) {
	st := c.status()
	old := c.lastNoticed
	skip := old == st || (old == StatusDoing && st == StatusDo) || (old == StatusUndoing && st == StatusUndo)
	if !skip {
		s.addChangeNoticeLocked(c)
		c.lastNoticed = st
	}
	s.updateChangeLocked(c)
}

// updateChangeLocked closes the ready channel once the change is ready.
func (s *Server) updateChangeLocked(c *change) {
	if statusReady(c.status()) && !c.isReady() {
		c.readyTime = s.nowLocked()
		close(c.readyCh)
	}
}

func (s *Server) addChangeNoticeLocked(c *change) {
	if !s.cfg.version.hasNotices() {
		return
	}
	now := s.nowLocked()
	// snapd never hands out two notices with the same timestamp: it bumps
	// by 1ns (overlord/state/notices.go).
	if !now.After(s.lastNoticeTime) {
		now = s.lastNoticeTime.Add(time.Nanosecond)
	}
	s.lastNoticeTime = now
	n := s.noticeByKey["change-update/"+c.id]
	if n == nil {
		s.lastNoticeID++
		n = &notice{id: strconv.Itoa(s.lastNoticeID), typ: "change-update", key: c.id, first: now}
		s.noticeByKey["change-update/"+c.id] = n
		s.notices = append(s.notices, n)
	}
	n.last = now
	n.lastRepeated = now
	n.occurrences++
	n.lastData = map[string]string{"kind": c.kind}
	s.noticesChanged()
}

// noticesChanged wakes long-polls; s.mu held.
func (s *Server) noticesChanged() {
	close(s.noticeWake)
	s.noticeWake = make(chan struct{})
}

// wakeLocked wakes every waiter on state changes (WaitIdle etc.).
func (s *Server) wakeLocked() {
	s.checkpointLocked()
	close(s.stateWake)
	s.stateWake = make(chan struct{})
}

// conflictErr is a change conflict as snapd reports it.
type conflictErr struct {
	snap       string
	changeKind string
	changeID   string
	message    string
}

func (e *conflictErr) Error() string {
	if e.message != "" {
		return e.message
	}
	return fmt.Sprintf("snap %q has %q change in progress", e.snap, e.changeKind)
}

// exclusiveKinds block every snap (overlord/snapstate/conflict.go,
// checkChangeConflictExclusiveKinds).
var exclusiveKinds = map[string]string{
	"transition-ubuntu-core":   "ubuntu-core to core transition in progress, no other changes allowed until this is done",
	"transition-to-snapd-snap": "transition to snapd snap in progress, no other changes allowed until this is done",
	"remodel":                  "remodeling in progress, no other changes allowed until this is done",
	"create-recovery-system":   "creating recovery system in progress, no other changes allowed until this is done",
	"remove-recovery-system":   "removing recovery system in progress, no other changes allowed until this is done",
}

// irrelevantKinds never conflict through their tasks
// (overlord/snapstate/conflict.go isIrrelevantChange; the confdb kinds exist
// only in recent releases, where they are listed too).
var irrelevantKinds = map[string]bool{
	"pre-download": true, "become-operational": true, "get-confdb": true, "set-confdb": true,
}

// conflictLocked applies snapd's CheckChangeConflictMany
// (overlord/snapstate/conflict.go): any non-ready change (other than
// ignoreID and the irrelevant kinds) with any task affecting one of snaps,
// whatever that task's own status, blocks; exclusive kinds block everything.
func (s *Server) conflictLocked(snaps []string, ignoreID string) *conflictErr {
	for _, c := range s.active {
		if statusReady(c.status()) || c.id == ignoreID {
			continue
		}
		msg := c.exclusive
		if msg == "" {
			msg = exclusiveKinds[c.kind]
		}
		if msg != "" {
			return &conflictErr{changeKind: c.kind, changeID: c.id, message: msg}
		}
	}
	want := map[string]bool{}
	for _, n := range snaps {
		want[n] = true
	}
	for _, c := range s.active {
		if statusReady(c.status()) || c.id == ignoreID {
			continue
		}
		if irrelevantKinds[c.kind] {
			continue
		}
		for _, t := range c.tasks {
			for _, a := range t.affects {
				if want[a] {
					return &conflictErr{snap: a, changeKind: c.kind, changeID: c.id}
				}
			}
		}
	}
	return nil
}
