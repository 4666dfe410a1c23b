package fake

import "time"

// ServiceStateAt is a service's state from At on, on the server's clock.
type ServiceStateAt struct {
	At time.Time `json:"at"`
	AppState
}

// maxServiceHistory bounds each service's history: a long-running fake
// (fakesnapd) keeps the most recent states.
const maxServiceHistory = 1000

// ServiceHistory returns snap.app's states, oldest first: the state it had
// before the server first changed it (At zero), then each change of
// Enabled or Active, made by a change's task or by SetService, with the
// time it was made (the most recent 1,000). A test tells from it whether
// a service was in some state at some moment: what snapd's own records
// (its changes) cannot say for a request that made no change.
func (s *Server) ServiceHistory(snap, app string) []ServiceStateAt {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.svcHistory[snap+"."+app]; ok {
		return append([]ServiceStateAt(nil), h...)
	}
	if a := s.appLocked(snap, app); a != nil && a.Daemon != "" {
		return []ServiceStateAt{{AppState: AppState{Enabled: a.Enabled, Active: a.Active}}}
	}
	return nil
}

// stateOf returns a's state.
func stateOf(a *appState) AppState { return AppState{Enabled: a.Enabled, Active: a.Active} }

// noteServiceLocked records a's state if it differs from before, the
// state it had before the caller changed it.
func (s *Server) noteServiceLocked(a *appState, before AppState) {
	now := stateOf(a)
	if now == before {
		return
	}
	key := a.snap + "." + a.Name
	if s.svcHistory == nil {
		s.svcHistory = map[string][]ServiceStateAt{}
	}
	h := s.svcHistory[key]
	if len(h) == 0 {
		h = append(h, ServiceStateAt{AppState: before})
	}
	h = append(h, ServiceStateAt{At: s.clock.Now(), AppState: now})
	if len(h) > maxServiceHistory {
		h = append(h[:0], h[len(h)-maxServiceHistory:]...)
	}
	s.svcHistory[key] = h
}
