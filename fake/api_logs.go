package fake

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// The journal of the modelled services: what systemd logs when the fake
// starts and stops them (systemd 252's wording, Debian 12 and later), and
// lines a test adds as the services' own output (AppendLog).

type logEntry struct {
	time     time.Time
	unit     string // snap.S.A.service
	sid, pid string
	message  string
}

// logJSON mirrors client.Log (client/apps.go).
type logJSON struct {
	Timestamp time.Time `json:"timestamp"`
	Message   string    `json:"message"`
	SID       string    `json:"sid"`
	PID       string    `json:"pid"`
}

func unitName(a *appState) string { return "snap." + a.snap + "." + a.Name + ".service" }

func (s *Server) addLogLocked(a *appState, sid, pid, msg string) {
	// The journal keeps microseconds (__REALTIME_TIMESTAMP), and snapd
	// sends them in UTC (systemd/journal.go Log.Time).
	s.logs = append(s.logs, logEntry{time: s.nowLocked().Truncate(time.Microsecond), unit: unitName(a), sid: sid, pid: pid, message: msg})
	close(s.logWake)
	s.logWake = make(chan struct{})
}

// systemdLogLocked logs a line of systemd (pid 1) about a's unit; format
// gets the unit name and its description.
func (s *Server) systemdLogLocked(a *appState, format string) {
	desc := "Service for snap application " + a.snap + "." + a.Name
	s.addLogLocked(a, "systemd", "1", fmt.Sprintf(format, unitName(a), desc))
}

// startedLocked gives a starting service a main pid and logs systemd's
// "Started" line.
func (s *Server) startedLocked(a *appState) {
	if s.lastPID == 0 {
		s.lastPID = 4000
	}
	s.lastPID++
	a.pid = s.lastPID
	s.systemdLogLocked(a, "Started %s - %s.")
}

// getLogs mirrors daemon/api_apps.go getLogs: n (default 10, negative for
// all; from 2.73 on, 0 and negatives other than -1 are refused, "invalid
// value for n: 0") and follow are checked first, then names= as for /v2/apps
// (services only; none at all is 404 app-not-found "no matching
// services"). The answer is not an envelope but an application/json-seq
// stream of client.Log records, each "\x1e{...}\n"; with follow=true it
// stays open and streams new lines until the client hangs up.
func (s *Server) getLogs(r *http.Request) *response {
	q := r.URL.Query()
	n := 10
	if v := q.Get("n"); v != "" {
		m, err := strconv.ParseInt(v, 0, 32)
		if err != nil {
			return badRequest("invalid value for n: %q: %v", v, err)
		}
		n = int(m)
		if s.cfg.version.logsRefuseNonPositive() && n != -1 && n <= 0 {
			return badRequest("invalid value for n: %v", n)
		}
	}
	follow := false
	if v := q.Get("follow"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			return badRequest("invalid value for follow: %q: %v", v, err)
		}
		follow = f
	}
	s.mu.Lock()
	apps, rsp := s.appsForLocked(commaList([]string{q.Get("names")}), true)
	s.mu.Unlock()
	if rsp != nil {
		return rsp
	}
	if len(apps) == 0 {
		return errResp(404, "app-not-found", nil, "no matching services")
	}
	units := map[string]bool{}
	for _, a := range apps {
		units[unitName(a)] = true
	}
	return &response{status: 200, stream: func(w http.ResponseWriter, _ *http.Request, done <-chan struct{}) {
		s.streamLogs(w, units, n, follow, done)
	}}
}

func (s *Server) streamLogs(w http.ResponseWriter, units map[string]bool, n int, follow bool, done <-chan struct{}) {
	bw := bufio.NewWriter(w)
	write := func(es []logEntry) bool {
		for _, e := range es {
			b, _ := json.Marshal(logJSON{Timestamp: e.time, Message: e.message, SID: e.sid, PID: e.pid})
			bw.WriteByte(0x1e)
			bw.Write(b)
			bw.WriteByte('\n')
		}
		if err := bw.Flush(); err != nil {
			return false
		}
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		return true
	}
	s.mu.Lock()
	var sel []logEntry
	for _, e := range s.logs {
		if units[e.unit] {
			sel = append(sel, e)
		}
	}
	if n >= 0 && len(sel) > n {
		sel = sel[len(sel)-n:]
	}
	seen := len(s.logs)
	wake := s.logWake
	s.mu.Unlock()
	if !write(sel) || !follow {
		return
	}
	for {
		select {
		case <-wake:
		case <-done:
			return
		}
		s.mu.Lock()
		var more []logEntry
		for _, e := range s.logs[seen:] {
			if units[e.unit] {
				more = append(more, e)
			}
		}
		seen = len(s.logs)
		wake = s.logWake
		s.mu.Unlock()
		if !write(more) {
			return
		}
	}
}
