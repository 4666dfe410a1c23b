package fake

import (
	"fmt"
	"strconv"
	"time"
)

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
		before := stateOf(a)
		a.Enabled, a.Active = st.Enabled, st.Active
		s.noteServiceLocked(a, before)
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

// AddWarning records a warning, as snapd's state.Warnf does (adding the
// same message again only updates its last-added time). While it is
// pending every non-error answer carries warning-count and
// warning-timestamp, and the snap client prints "WARNING: There is 1 new
// warning. See 'snap warnings'.".
func (s *Server) AddWarning(message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	for _, w := range s.warnings {
		if w.message == message {
			w.lastAdded = now
			return
		}
	}
	s.warnings = append(s.warnings, &warning{message: message, firstAdded: now, lastAdded: now})
}

// AppendLog adds message to snap.app's journal as the service's own output
// (syslog identifier "snap.app", the service's pid), for GET /v2/logs and
// `snap logs`.
func (s *Server) AppendLog(snap, app, message string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.appLocked(snap, app)
	if a == nil || a.Daemon == "" {
		return fmt.Errorf("fake snapd: AppendLog: no service %s.%s", snap, app)
	}
	pid := "-"
	if a.pid != 0 {
		pid = strconv.Itoa(a.pid)
	}
	s.addLogLocked(a, snap+"."+app, pid, message)
	return nil
}
