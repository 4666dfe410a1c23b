package fake

import "time"

// Request is one request the fake answered (or dropped), for assertions.
type Request struct {
	// Time is when the request arrived, on the fake's clock.
	Time time.Time `json:"time"`
	// Done is when the answer was ready, on the fake's clock.
	Done time.Time `json:"done"`
	// Socket is "main" (snapd.socket) or "snap" (snapd-snap.socket).
	Socket string `json:"socket"`
	// Method, Path, Query and Body are as received; UserAgent is the
	// User-Agent header (snapsvc sends "snapsvc", the snap CLI "snapd/VERSION ...").
	Method    string `json:"method"`
	Path      string `json:"path"`
	Query     string `json:"query,omitempty"`
	Body      string `json:"body,omitempty"`
	UserAgent string `json:"user-agent,omitempty"`
	// UID is the caller's user id, read from the socket's peer
	// credentials (SO_PEERCRED) as snapd reads it; -1 when they could
	// not be read.
	UID int `json:"uid"`
	// Status is the HTTP status code of the answer, Kind the error kind and
	// Message the error message (both empty for success).
	Status  int    `json:"status"`
	Kind    string `json:"kind,omitempty"`
	Message string `json:"message,omitempty"`
	// Change is the change id of an async answer.
	Change string `json:"change,omitempty"`
	// Made is the change the request made, whether or not the answer
	// names it (snapctl's service commands answer without it; a queued
	// command names the hook's change). Test introspection, not wire.
	Made string `json:"made,omitempty"`
	// Dropped reports that the connection was closed instead of answering.
	Dropped bool `json:"dropped,omitempty"`
	// Fault names the injected fault that applied ("drop", "cut",
	// "garble", "reject", "reply", "late"), or is empty.
	Fault string `json:"fault,omitempty"`
}

// Counters are aggregate statistics.
type Counters struct {
	// Requests counts requests per "METHOD /path" with ids replaced by
	// {id}, e.g. "POST /v2/apps", "GET /v2/changes/{id}".
	Requests map[string]int `json:"requests"`
	// Conflicts counts requests answered with a change conflict.
	Conflicts int `json:"conflicts"`
	// ChangesCreated counts changes created (by requests, hooks or AddChange).
	ChangesCreated int `json:"changes-created"`
}

// AppState is the current state of one service.
type AppState struct {
	Enabled bool `json:"enabled"`
	Active  bool `json:"active"`
}

// Service returns the current state of snap.app.
func (s *Server) Service(snap, app string) (AppState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.appLocked(snap, app)
	if a == nil || a.Daemon == "" {
		return AppState{}, false
	}
	return AppState{Enabled: a.Enabled, Active: a.Active}, true
}

// Requests returns the request log, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// Counters returns a snapshot of the counters.
func (s *Server) Counters() Counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counters
	c.Requests = map[string]int{}
	for k, v := range s.counters.Requests {
		c.Requests[k] = v
	}
	return c
}

// ChangeInfo describes a change, for assertions.
type ChangeInfo struct {
	ID        string     `json:"id"`
	Kind      string     `json:"kind"`
	Summary   string     `json:"summary"`
	Status    string     `json:"status"`
	Ready     bool       `json:"ready"`
	Err       string     `json:"err,omitempty"`
	SpawnTime time.Time  `json:"spawn-time"`
	ReadyTime time.Time  `json:"ready-time"`
	SnapNames []string   `json:"snap-names,omitempty"`
	Tasks     []TaskInfo `json:"tasks,omitempty"`
}

// TaskInfo describes a task of a change.
type TaskInfo struct {
	ID            string   `json:"id"`
	Kind          string   `json:"kind"`
	Summary       string   `json:"summary"`
	Status        string   `json:"status"`
	Log           []string `json:"log,omitempty"`
	AffectedSnaps []string `json:"affected-snaps,omitempty"`
}

func (s *Server) infoLocked(c *change) ChangeInfo {
	st := c.status()
	ci := ChangeInfo{ID: c.id, Kind: c.kind, Summary: c.summary, Status: st, Ready: statusReady(st),
		Err: c.errText(), SpawnTime: c.spawn, ReadyTime: c.readyTime, SnapNames: append([]string(nil), c.snapNames...)}
	for _, t := range c.tasks {
		ci.Tasks = append(ci.Tasks, TaskInfo{ID: t.id, Kind: t.kind, Summary: t.summary, Status: t.status,
			Log: append([]string(nil), t.log...), AffectedSnaps: append([]string(nil), t.affects...)})
	}
	return ci
}

// ChangeByID returns a change's current state.
func (s *Server) ChangeByID(id string) (ChangeInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.changeByID[id]
	if c == nil {
		return ChangeInfo{}, false
	}
	return s.infoLocked(c), true
}

// Changes returns every change, in id order.
func (s *Server) Changes() []ChangeInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ChangeInfo
	for _, c := range s.changes {
		out = append(out, s.infoLocked(c))
	}
	return out
}

// ChangeReady returns a channel closed when change id becomes ready (nil
// for an unknown id).
func (s *Server) ChangeReady(id string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.changeByID[id]; c != nil {
		return c.readyCh
	}
	return nil
}
