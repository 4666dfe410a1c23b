package fake

import (
	"fmt"
	"math"
	"time"
)

// refreshHold is a system hold of a snap's refreshes: what `snap refresh
// --hold` and POST /v2/snaps/{name} {"action":"hold"} set
// (overlord/snapstate/autorefresh_gating.go HoldRefreshesBySystem; the
// holding snap is "system").
type refreshHold struct {
	level string // "auto-refresh" or "general"
	until time.Time
}

// hasHold: the hold and unhold actions came with 2.58 (2.57.6's
// snapInstructionDispTable has neither: "unknown action hold").
func (v Version) hasHold() bool { return v.atLeast("2.58") }

// validateHold mirrors the hold checks of snapInstruction.validate
// (daemon/api_snaps.go, 2.58+): a hold needs time ("forever" or RFC3339)
// and hold-level ("auto-refresh" or "general"); no other action takes them.
func validateHold(inst *snapInstruction) string {
	if inst.Action == "hold" {
		switch {
		case inst.Time == "":
			return "hold action requires a non-empty time value"
		case inst.Time != "forever":
			if _, err := time.Parse(time.RFC3339, inst.Time); err != nil {
				return fmt.Sprintf(`hold action requires time to be "forever" or in RFC3339 format: %v`, err)
			}
		}
		switch inst.HoldLevel {
		case "":
			return "hold action requires a non-empty hold-level value"
		case "auto-refresh", "general":
		default:
			return `hold action requires hold-level to be either "auto-refresh" or "general"`
		}
		return ""
	}
	if inst.Time != "" {
		return `time can only be specified for the "hold" action`
	}
	if inst.HoldLevel != "" {
		return `hold-level can only be specified for the "hold" action`
	}
	return ""
}

// holdLocked mirrors snapHoldMany for one snap: the hold is written at once
// and the change has no tasks and is Done (postSnap: SetStatus(DoneStatus)
// when there are no task sets). "forever" holds for snapd's maxDuration
// (1<<63-1 ns from now: a date ~292 years ahead, which `snap` shows as
// "forever"). A snap that is not installed is snapd's value
// NotInstalledError, which errToResponse's pointer case misses: 400
// without kind, "cannot hold "x": snap "x" is not installed" (captured from
// 2.68.3). A hold never conflicts with a change.
func (s *Server) holdLocked(name string, inst *snapInstruction) *response {
	ss := s.snaps[name]
	if ss == nil {
		return badRequest("cannot hold %q: snap %q is not installed", name, name)
	}
	now := s.nowLocked()
	until := now.Add(time.Duration(math.MaxInt64))
	if inst.Time != "forever" {
		t, _ := time.Parse(time.RFC3339, inst.Time) // validated
		until = now.Add(t.Sub(now))
	}
	ss.hold = &refreshHold{level: inst.HoldLevel, until: until.UTC()}
	summary := fmt.Sprintf("Hold general refreshes for %q", name)
	if inst.HoldLevel == "auto-refresh" {
		summary = fmt.Sprintf("Hold auto-refreshes for %q", name)
	}
	return s.doneChangeLocked("hold-snap", summary, name)
}

// unholdLocked mirrors snapUnholdMany for one snap
// (snapstate.ProceedWithRefresh for "system"): no check that the snap is
// installed or held; a Done change without tasks.
func (s *Server) unholdLocked(name string) *response {
	if ss := s.snaps[name]; ss != nil {
		ss.hold = nil
	}
	return s.doneChangeLocked("unhold-snap", fmt.Sprintf("Remove refresh hold on %q", name), name)
}

// doneChangeLocked makes a change without tasks that is Done at once, as
// postSnap does for an action with no task sets.
func (s *Server) doneChangeLocked(kind, summary, name string) *response {
	c := s.newChangeLocked(kind, summary)
	s.setSnapNamesLocked(c, name)
	c.fixed = StatusDone
	// Change.SetStatus: ready, and (2.62+) a change-update notice
	s.taskStatusChangedLocked(c)
	s.settleLocked()
	return asyncResp(c.id)
}

// setSnapNamesLocked gives a postSnap change its snap-names (what
// GET /v2/changes?for= reads) and, from 2.68 on, api-data {"snap-names"}
// (the change's "data" in the API; the release that added it lies between
// 2.58 and 2.68.3 and is not pinned down).
func (s *Server) setSnapNamesLocked(c *change, name string) {
	c.snapNames = []string{name}
	if s.cfg.version.atLeast(Version268) {
		c.apiData = map[string]any{"snap-names": []string{name}}
	}
}

// Hold returns the time until which snap's refreshes are held by the
// system (zero when not held) and the hold's level, "auto-refresh" or
// "general".
func (s *Server) Hold(snap string) (until time.Time, level string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss := s.snaps[snap]; ss != nil && ss.hold != nil {
		return ss.hold.until, ss.hold.level
	}
	return time.Time{}, ""
}
