package fake

import "time"

// SetFailStart makes starting snap.app fail with systemctl stderr msg
// (empty msg: starts succeed again).
func (s *Server) SetFailStart(snap, app, msg string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.appLocked(snap, app); a != nil {
		a.FailStart = msg
	}
}

// SetDurations changes how long starting and stopping snap.app takes.
func (s *Server) SetDurations(snap, app string, start, stop time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.appLocked(snap, app); a != nil {
		a.StartDuration, a.StopDuration = start, stop
	}
}

// SetService sets a service's state directly (no change is created).
func (s *Server) SetService(snap, app string, st AppState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.appLocked(snap, app); a != nil {
		a.Enabled, a.Active = st.Enabled, st.Active
	}
}

// SetSnapctlUnsuccessful makes "snapctl <command> ..." answer snapd's
// "unsuccessful" result (HTTP 200, type error, kind unsuccessful, value with
// stdout, stderr and exit-code). code 0 removes the rule.
func (s *Server) SetSnapctlUnsuccessful(command, stdout, stderr string, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if code == 0 {
		delete(s.unsuccessful, command)
		return
	}
	s.unsuccessful[command] = unsuccessfulRule{stdout, stderr, code}
}

type unsuccessfulRule struct {
	stdout, stderr string
	code           int
}
