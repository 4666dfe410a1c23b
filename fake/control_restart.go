package fake

import (
	"net"
	"strings"
	"time"
)

// BeginMaintenance adds "maintenance":{"kind":kind,"message":message} to
// every response, as snapd does while a restart is pending, e.g.
// ("daemon-restart", "daemon is restarting") or ("system-restart",
// "system is restarting").
func (s *Server) BeginMaintenance(kind, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &errorResult{Kind: kind, Message: message}
	if kind == "system-restart" {
		op := "reboot"
		switch {
		case strings.Contains(message, "halt"):
			op = "halt"
		case strings.Contains(message, "power"):
			op = "poweroff"
		}
		m.Value = map[string]string{"op": op}
	}
	s.maint = m
}

// EndMaintenance removes the maintenance field again.
func (s *Server) EndMaintenance() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maint = nil
}

// RestartDaemon imitates "systemctl restart snapd": maintenance
// {"kind":"daemon-restart","message":"daemon is restarting"} is set, the
// sockets go away (in-flight long-polls get 500 "request canceled"), and
// after down on the fake's clock the sockets come back without maintenance.
// Changes keep running meanwhile, as they do across a real restart. The
// returned channel is closed once the sockets are back.
func (s *Server) RestartDaemon(down time.Duration) <-chan struct{} {
	back := make(chan struct{})
	s.BeginMaintenance("daemon-restart", "daemon is restarting")
	s.StopListening()
	s.clock.AfterFunc(down, func() {
		defer close(back)
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return
		}
		s.EndMaintenance()
		s.StartListening()
	})
	return back
}

// SetLatency delays every answer by d on the fake's clock (slow snapd).
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// DropNextResponse makes the next request with this method and path (e.g.
// "POST", "/v2/apps") be handled fully — a POST creates its change — and
// then have its connection closed without an answer.
func (s *Server) DropNextResponse(method, path string) {
	s.InjectFault(Fault{Kind: FaultDrop, Method: method, Path: path, Times: 1})
}

// DropConnections closes every open client connection at once (requests in
// flight get no answer; snapctl calls and long-polls are cut), while the
// sockets keep listening.
func (s *Server) DropConnections() {
	s.mu.Lock()
	var cs []net.Conn
	for c := range s.conns {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}
