package fake

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"
)

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
	list := s.changes
	if sel == "in-progress" || sel == "" {
		list = s.active // the changes not ready are among these
	}
	for _, c := range list {
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
	s.mu.Lock()
	defer s.mu.Unlock()
	// daemon/api_general.go abortChange looks the change up before
	// decoding the body
	c := s.changeByID[id]
	if c == nil {
		return notFound("cannot find change with id %q", id)
	}
	var req struct {
		Action string `json:"action"`
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&req); err != nil {
		return badRequest("cannot decode data from request body: %v", err)
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
