package fake

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"time"
)

// commaList mirrors strutil.CommaSeparatedList (trimmed, empties dropped)
// applied to every value of a repeated parameter.
func commaList(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// appsFor mirrors daemon/api_apps.go appInfosFor.
func (s *Server) appsForLocked(names []string, serviceOnly bool) ([]*appState, *response) {
	seen := map[*appState]bool{}
	var out []*appState
	add := func(a *appState) {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	if len(names) == 0 {
		for _, ss := range s.snaps {
			for _, a := range ss.apps {
				if !serviceOnly || a.Daemon != "" {
					add(a)
				}
			}
		}
	}
	for _, n := range names {
		snapName, appName, hasApp := strings.Cut(n, ".")
		ss := s.snaps[snapName]
		if ss == nil {
			return nil, errResp(404, "snap-not-found", snapName, "snap %q not found", snapName)
		}
		if !hasApp {
			found := false
			for _, a := range ss.apps {
				if !serviceOnly || a.Daemon != "" {
					add(a)
					found = true
				}
			}
			if !found && serviceOnly {
				return nil, errResp(404, "app-not-found", nil, "snap %q has no services", snapName)
			}
			continue
		}
		a := ss.apps[appName]
		if serviceOnly {
			if a == nil || a.Daemon == "" {
				return nil, errResp(404, "app-not-found", nil, "snap %q has no service %q", snapName, appName)
			}
		} else if a == nil {
			return nil, errResp(404, "app-not-found", nil, "snap %q has no app %q", snapName, appName)
		}
		add(a)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].snap != out[j].snap {
			return out[i].snap < out[j].snap
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// appJSON mirrors client.AppInfo: everything but name is omitempty, so a
// disabled inactive service has no "enabled"/"active" keys.
type appJSON struct {
	Snap        string `json:"snap,omitempty"`
	Name        string `json:"name"`
	Daemon      string `json:"daemon,omitempty"`
	DaemonScope string `json:"daemon-scope,omitempty"`
	Enabled     bool   `json:"enabled,omitempty"`
	Active      bool   `json:"active,omitempty"`
}

func (s *Server) getApps(r *http.Request) *response {
	q := r.URL.Query()
	sel := q.Get("select")
	if sel != "" && sel != "service" {
		return badRequest("invalid select parameter: %q", sel)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	apps, rsp := s.appsForLocked(commaList(q["names"]), sel == "service")
	if rsp != nil {
		return rsp
	}
	out := []appJSON{}
	for _, a := range apps {
		j := appJSON{Snap: a.snap, Name: a.Name}
		if a.Daemon != "" {
			j.Daemon, j.DaemonScope, j.Enabled, j.Active = a.Daemon, a.DaemonScope, a.Enabled, a.Active
		}
		out = append(out, j)
	}
	return syncResp(out)
}

type instruction struct {
	Action  string          `json:"action"`
	Names   []string        `json:"names"`
	Enable  bool            `json:"enable"`
	Disable bool            `json:"disable"`
	Reload  bool            `json:"reload"`
	Scope   []string        `json:"scope"`
	Users   json.RawMessage `json:"users"`
}

// buildOps groups services per snap, sorted by snap name (servicestate
// serviceControlTs); names "snap.app" are explicit.
func buildOps(action string, enable, disable, reload bool, apps []*appState, names []string, snaps map[string]*snapState) ([]svcOp, string) {
	switch action {
	case "start", "stop", "restart":
	default:
		return nil, action
	}
	explicit := map[string]bool{}
	for _, n := range names {
		if strings.Contains(n, ".") {
			explicit[n] = true
		}
	}
	by := map[string]*svcOp{}
	var order []string
	for _, a := range apps {
		op := by[a.snap]
		if op == nil {
			op = &svcOp{snap: snaps[a.snap], action: action}
			switch {
			case action == "start" && enable:
				op.modifier = "enable"
			case action == "stop" && disable:
				op.modifier = "disable"
			case action == "restart" && reload:
				op.action = "reload-or-restart"
			}
			by[a.snap] = op
			order = append(order, a.snap)
		}
		op.services = append(op.services, a)
		if explicit[a.snap+"."+a.Name] {
			op.explicit = append(op.explicit, a)
		}
	}
	sort.Strings(order)
	var out []svcOp
	for _, n := range order {
		out = append(out, *by[n])
	}
	return out, ""
}

func (s *Server) conflictResponseLocked(ce *conflictErr, as409 bool) *response {
	s.counters.Conflicts++
	if as409 {
		v := map[string]string{}
		if ce.changeKind != "" {
			v["change-kind"] = ce.changeKind
		}
		if ce.snap != "" {
			v["snap-name"] = ce.snap
		}
		return errResp(409, "snap-change-conflict", v, "%s", ce.Error())
	}
	// daemon/api_apps.go checks for a value-typed ServiceActionConflictError
	// while servicestate returns a pointer, so snapd answers a plain 400.
	return badRequest("%s", ce.Error())
}

// postApps mirrors daemon/api_apps.go postApps.
func (s *Server) postApps(body []byte) *response {
	var inst instruction
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&inst); err != nil {
		return badRequest("cannot decode request body into service operation: %v", err)
	}
	if len(inst.Names) == 0 {
		return badRequest("cannot perform operation on services without a list of services to operate on")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	apps, rsp := s.appsForLocked(inst.Names, true)
	if rsp != nil {
		return rsp
	}
	var snapNames []string
	for _, a := range apps {
		snapNames = append(snapNames, a.snap)
	}
	snapNames = sortedUnique(snapNames)
	if ce := s.conflictLocked(snapNames, ""); ce != nil {
		return s.conflictResponseLocked(ce, s.cfg.conflictAs409)
	}
	ops, bad := buildOps(inst.Action, inst.Enable, inst.Disable, inst.Reload, apps, inst.Names, s.snaps)
	if bad != "" || ops == nil {
		return badRequest("unknown action %q", inst.Action)
	}
	c := s.newChangeLocked("service-control", "Running service command")
	c.snapNames = snapNames
	var prev *task
	for _, op := range ops {
		t := s.addServiceTaskLocked(c, op)
		if prev != nil {
			t.waitFor = append(t.waitFor, prev)
		}
		prev = t
	}
	s.updateChangeLocked(c)
	s.settleLocked()
	return asyncResp(c.id)
}

// ---- changes ----

type progressJSON struct {
	Label string `json:"label"`
	Done  int    `json:"done"`
	Total int    `json:"total"`
}

type taskJSON struct {
	ID        string         `json:"id"`
	Kind      string         `json:"kind"`
	Summary   string         `json:"summary"`
	Status    string         `json:"status"`
	Log       []string       `json:"log,omitempty"`
	Progress  progressJSON   `json:"progress"`
	SpawnTime time.Time      `json:"spawn-time"`
	ReadyTime *time.Time     `json:"ready-time,omitempty"`
	Data      map[string]any `json:"data,omitempty"`
}

type changeJSON struct {
	ID        string         `json:"id"`
	Kind      string         `json:"kind"`
	Summary   string         `json:"summary"`
	Status    string         `json:"status"`
	Tasks     []taskJSON     `json:"tasks,omitempty"`
	Ready     bool           `json:"ready"`
	Err       string         `json:"err,omitempty"`
	SpawnTime time.Time      `json:"spawn-time"`
	ReadyTime *time.Time     `json:"ready-time,omitempty"`
	Data      map[string]any `json:"data,omitempty"`
}

// changeJSONLocked mirrors daemon/api_general.go change2changeInfo.
func (s *Server) changeJSONLocked(c *change) changeJSON {
	st := c.status()
	j := changeJSON{ID: c.id, Kind: c.kind, Summary: c.summary, Status: st, Ready: statusReady(st),
		Err: c.errText(), SpawnTime: c.spawn.UTC()}
	if !c.readyTime.IsZero() {
		rt := c.readyTime.UTC()
		j.ReadyTime = &rt
	}
	if len(c.apiData) > 0 {
		j.Data = c.apiData
	}
	for _, t := range c.tasks {
		tj := taskJSON{ID: t.id, Kind: t.kind, Summary: t.summary, Status: t.status,
			Log: append([]string(nil), t.log...), SpawnTime: t.spawn.UTC()}
		// overlord/state/task.go: no explicit progress -> 0/1 in Do, 1/1 otherwise
		tj.Progress = progressJSON{Done: 1, Total: 1}
		if t.status == StatusDo {
			tj.Progress.Done = 0
		}
		if !t.ready.IsZero() {
			rt := t.ready.UTC()
			tj.ReadyTime = &rt
		}
		if s.cfg.version.taskData() && len(t.affects) > 0 {
			tj.Data = map[string]any{"affected-snaps": append([]string(nil), t.affects...)}
		}
		j.Tasks = append(j.Tasks, tj)
	}
	return j
}

func (s *Server) getChange(id string) *response {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.changeByID[id]
	if c == nil {
		return notFound("cannot find change with id %q", id)
	}
	return syncResp(s.changeJSONLocked(c))
}

func (s *Server) getChanges(r *http.Request) *response {
	q := r.URL.Query()
	sel := q.Get("select")
	var filter func(ready bool) bool
	switch sel {
	case "all":
		filter = func(bool) bool { return true }
	case "in-progress", "":
		filter = func(r bool) bool { return !r }
	case "ready":
		filter = func(r bool) bool { return r }
	default:
		return badRequest("select should be one of: all,in-progress,ready")
	}
	forSnap := q.Get("for")
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []changeJSON{}
	for _, c := range s.changes {
		if !filter(statusReady(c.status())) {
			continue
		}
		if forSnap != "" {
			found := false
			for _, n := range c.snapNames {
				if n == forSnap {
					found = true
				}
			}
			if !found {
				continue
			}
		}
		out = append(out, s.changeJSONLocked(c))
	}
	return syncResp(out)
}

func (s *Server) abortChange(id string, body []byte) *response {
	var req struct {
		Action string `json:"action"`
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&req); err != nil {
		return badRequest("cannot decode data from request body: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.changeByID[id]
	if c == nil {
		return notFound("cannot find change with id %q", id)
	}
	if req.Action != "abort" {
		return badRequest("change action %q is unsupported", req.Action)
	}
	if statusReady(c.status()) {
		return badRequest("cannot abort change %s with nothing pending", id)
	}
	s.abortLocked(c)
	return syncResp(s.changeJSONLocked(c))
}

// abortLocked mirrors POST abort (daemon/api_general.go abortChange ->
// Change.Abort): Do -> Hold, Doing -> Abort (the task finishes and is then
// undone), Done -> Undo, after which kinds without an undo handler
// (service-control, exec-command) go back to Done and test-controlled tasks
// end Undone.
func (s *Server) abortLocked(c *change) {
	s.abortTasksLocked(c)
	s.settleLocked()
}
