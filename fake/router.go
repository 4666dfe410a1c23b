package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

type errorResult struct {
	Message string `json:"message"`
	Kind    string `json:"kind,omitempty"`
	Value   any    `json:"value,omitempty"`
}

type response struct {
	status int
	typ    string
	result any
	change string
	// made is the change the request made when the answer does not name
	// it (snapctl's service commands): the request log's Request.Made.
	made string
	// bare responses are served before the handler runs (router 404,
	// 405, access-check 403): daemon/daemon.go Command.ServeHTTP adds
	// "maintenance" only to what a handler returns.
	bare bool
	// sources is findResponse's "sources" (GET /v2/snaps, /v2/find).
	sources []string
	// stream, when set, writes a non-envelope body (GET /v2/logs' json-seq)
	// after the status line; done is closed when the server stops.
	stream func(w http.ResponseWriter, r *http.Request, done <-chan struct{})
}

// respJSON mirrors daemon/response.go.
type respJSON struct {
	Type       string   `json:"type"`
	StatusCode int      `json:"status-code"`
	Status     string   `json:"status"`
	Result     any      `json:"result"`
	Change     string   `json:"change,omitempty"`
	Sources    []string `json:"sources,omitempty"`
	// WarningTimestamp and WarningCount are added to every non-error
	// answer while warnings are pending (daemon/daemon.go, addWarningCount).
	WarningTimestamp *time.Time   `json:"warning-timestamp,omitempty"`
	WarningCount     int          `json:"warning-count,omitempty"`
	Maintenance      *errorResult `json:"maintenance,omitempty"`
}

func syncResp(result any) *response { return &response{status: 200, typ: "sync", result: result} }

func asyncResp(id string) *response { return &response{status: 202, typ: "async", change: id} }

func errResp(status int, kind string, value any, format string, a ...any) *response {
	msg := format
	if len(a) > 0 {
		msg = fmt.Sprintf(format, a...)
	}
	return &response{status: status, typ: "error", result: &errorResult{Message: msg, Kind: kind, Value: value}}
}

func badRequest(format string, a ...any) *response { return errResp(400, "", nil, format, a...) }

func notFound(format string, a ...any) *response { return errResp(404, "", nil, format, a...) }

// forbidden is an access-check failure (daemon/access.go), served bare.
func forbidden(msg string) *response {
	r := errResp(403, "login-required", nil, "%s", msg)
	r.bare = true
	return r
}

// unauthorized is authenticatedAccess's refusal of a caller who is not
// root (daemon/access.go checkAccess: Unauthorized("access denied")),
// served bare.
func unauthorized(msg string) *response {
	r := errResp(401, "login-required", nil, "%s", msg)
	r.bare = true
	return r
}

// routeNotFound is the router's NotFoundHandler (daemon/daemon.go), bare.
func routeNotFound() *response {
	r := notFound("not found")
	r.bare = true
	return r
}

func methodNotAllowed(m string) *response {
	r := errResp(405, "", nil, "method %q not allowed", m)
	r.bare = true
	return r
}

func routeKey(method, path string) string {
	parts := strings.Split(path, "/")
	if len(parts) == 4 && parts[1] == "v2" && (parts[2] == "changes" || parts[2] == "notices") && parts[3] != "" {
		parts[3] = "{id}"
	}
	return method + " " + strings.Join(parts, "/")
}

func (s *Server) handler(sock string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		stopping := s.stopping
		req := Request{Time: s.nowLocked(), Socket: sock, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body), UserAgent: r.UserAgent(), UID: -1}
		if p := s.callerOf(r); p.ok {
			req.UID = p.uid
		}
		s.counters.Requests[routeKey(r.Method, r.URL.Path)]++
		s.inflight++
		s.wakeLocked()
		lat := s.latency
		fault := s.faultForLocked(req)
		if fault != nil {
			req.Fault = fault.Kind.String()
		}
		s.mu.Unlock()

		defer func() {
			s.mu.Lock()
			s.inflight--
			s.wakeLocked()
			s.mu.Unlock()
		}()
		if lat > 0 {
			ch := make(chan struct{})
			tm := s.clock.AfterFunc(lat, func() { close(ch) })
			select {
			case <-ch:
			case <-r.Context().Done():
				tm.Stop()
				return
			case <-s.closeCh:
				tm.Stop()
				return
			case <-stopping:
				tm.Stop()
				return
			}
		}

		if fault != nil && fault.Kind == FaultWedge {
			// Wedged: nothing happens until Hold is closed (a nil Hold
			// blocks for good), then the request is handled as usual.
			select {
			case <-fault.Hold:
			case <-stopping:
				return
			case <-s.closeCh:
				return
			}
			if r.Context().Err() != nil {
				// The client left: acted on with nobody to answer.
				w = discardWriter{}
				r = r.WithContext(context.WithoutCancel(r.Context()))
				req.Dropped = true
			}
			fault = nil
			req.Fault = FaultWedge.String()
		}
		if fault != nil && fault.Kind == FaultLate {
			closeWithoutAnswer(w)
			if f := fault.Hold; f != nil {
				select {
				case <-f:
				case <-stopping:
					return
				case <-s.closeCh:
					return
				}
			}
			// Acted on with nobody to answer: the request is logged once
			// handled, as any other.
			w = discardWriter{}
			r = r.WithContext(context.WithoutCancel(r.Context()))
			fault = nil
			req.Fault = FaultLate.String()
			req.Dropped = true
		}
		if fault != nil && !fault.Kind.handles() {
			if !holdAnswer(r, fault, stopping, s.closeCh) {
				return
			}
			s.answerFault(w, req, fault)
			return
		}

		rsp := s.route(sock, r, body, stopping)

		s.mu.Lock()
		req.Done = s.nowLocked()
		req.Status = rsp.status
		req.Change = rsp.change
		req.Made = rsp.change
		if rsp.made != "" {
			req.Made = rsp.made
		}
		if er, ok := rsp.result.(*errorResult); ok && rsp.typ == "error" {
			req.Kind, req.Message = er.Kind, er.Message
		}
		req.Dropped = req.Dropped || fault != nil && fault.Kind == FaultDrop
		s.logRequestLocked(req)
		if rsp.stream != nil {
			s.mu.Unlock()
			w.Header().Set("Content-Type", "application/json-seq")
			w.WriteHeader(rsp.status)
			done := make(chan struct{})
			go func() {
				select {
				case <-stopping:
				case <-s.closeCh:
				case <-r.Context().Done():
				}
				close(done)
			}()
			rsp.stream(w, r, done)
			return
		}
		out := respJSON{Type: rsp.typ, StatusCode: rsp.status, Status: http.StatusText(rsp.status), Result: rsp.result, Change: rsp.change, Sources: rsp.sources}
		if !rsp.bare {
			out.Maintenance = s.maint
			if rsp.typ != "error" {
				if n, stamp := s.warningsSummaryLocked(); n > 0 {
					out.WarningCount, out.WarningTimestamp = n, &stamp
				}
			}
		}
		s.mu.Unlock()

		buf, err := json.Marshal(out)
		if err != nil {
			buf = []byte(`{"type":"error","status-code":500,"status":"Internal Server Error","result":{"message":"internal error"}}`)
			rsp.status = 500
		}
		if fault != nil {
			if !holdAnswer(r, fault, stopping, s.closeCh) {
				return
			}
			switch fault.Kind {
			case FaultDrop:
				closeWithoutAnswer(w)
				return
			case FaultCut:
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Length", fmt.Sprint(len(buf)))
				w.WriteHeader(rsp.status)
				w.Write(buf[:len(buf)/2])
				if f, ok := w.(http.Flusher); ok {
					f.Flush()
				}
				closeWithoutAnswer(w)
				return
			case FaultGarble:
				buf = []byte(garbled)
				w.Header().Set("Content-Type", "text/html")
			}
		}
		if w.Header().Get("Content-Type") == "" {
			w.Header().Set("Content-Type", "application/json")
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(buf)))
		w.WriteHeader(rsp.status)
		w.Write(buf)
	})
}

// answerFault answers a request a FaultReject or FaultReply applies to,
// without acting on it.
func (s *Server) answerFault(w http.ResponseWriter, req Request, f *Fault) {
	s.mu.Lock()
	req.Done = s.nowLocked()
	if f.Kind == FaultReply {
		req.Status = f.Status
		var env struct {
			Type   string      `json:"type"`
			Result errorResult `json:"result"`
		}
		if json.Unmarshal(f.Body, &env) == nil && env.Type == "error" {
			req.Kind, req.Message = env.Result.Kind, env.Result.Message
		}
	} else {
		req.Dropped = true
	}
	s.logRequestLocked(req)
	s.mu.Unlock()
	if f.Kind == FaultReject {
		closeWithoutAnswer(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(f.Body)))
	w.WriteHeader(f.Status)
	w.Write(f.Body)
}

// discardWriter is the answer to a request acted on after its connection
// was closed (FaultLate).
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (discardWriter) WriteHeader(int)             {}

// holdAnswer waits for a fault's Hold channel, if any. It returns false
// when the client or the server went away meanwhile.
func holdAnswer(r *http.Request, f *Fault, stopping, closed <-chan struct{}) bool {
	if f.Hold == nil {
		return true
	}
	select {
	case <-f.Hold:
		return true
	case <-r.Context().Done():
	case <-stopping:
	case <-closed:
	}
	return false
}

// closeWithoutAnswer closes the request's connection with nothing more
// written.
func closeWithoutAnswer(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			conn.Close()
			return
		}
	}
	panic(http.ErrAbortHandler)
}

func (s *Server) route(sock string, r *http.Request, body []byte, stopping <-chan struct{}) *response {
	p := r.URL.Path
	switch {
	case p == "/v2/apps":
		// daemon/daemon.go checks the method before access; then
		// daemon/access.go: openAccess/authenticatedAccess require snapd.socket
		if r.Method != "GET" && r.Method != "POST" {
			return methodNotAllowed(r.Method)
		}
		if sock != "main" {
			return forbidden("access denied")
		}
		if r.Method == "GET" {
			return s.getApps(r)
		}
		// WriteAccess: authenticatedAccess (2.57), with polkit (2.68),
		// interfaceAuthenticatedAccess{ros-snapd-support} (2.77)
		if rsp := s.requireAuthenticated(r); rsp != nil {
			return rsp
		}
		return s.postApps(body)
	case p == "/v2/changes":
		if r.Method != "GET" {
			return methodNotAllowed(r.Method)
		}
		if rsp := s.observeDenied(sock); rsp != nil {
			return rsp
		}
		return s.getChanges(r)
	case strings.HasPrefix(p, "/v2/changes/") && len(p) > len("/v2/changes/"):
		id := strings.TrimPrefix(p, "/v2/changes/")
		switch r.Method {
		case "GET":
			if rsp := s.observeDenied(sock); rsp != nil {
				return rsp
			}
			return s.getChange(id)
		case "POST":
			// authenticatedAccess{Polkit: polkitActionManage}
			if sock != "main" {
				return forbidden("access denied")
			}
			if rsp := s.requireAuthenticated(r); rsp != nil {
				return rsp
			}
			return s.abortChange(id, body)
		}
		return methodNotAllowed(r.Method)
	case p == "/v2/notices" || strings.HasPrefix(p, "/v2/notices/"):
		if !s.cfg.version.hasNotices() {
			return routeNotFound()
		}
		if r.Method != "GET" {
			return methodNotAllowed(r.Method)
		}
		if rsp := s.observeDenied(sock); rsp != nil {
			return rsp
		}
		if p == "/v2/notices" {
			return s.getNotices(r, stopping)
		}
		return s.getNotice(strings.TrimPrefix(p, "/v2/notices/"))
	case p == "/v2/snapctl":
		if r.Method != "POST" {
			return methodNotAllowed(r.Method)
		}
		// daemon/access.go snapAccess: only snapd-snap.socket
		if sock != "snap" {
			return forbidden("access denied")
		}
		p := s.callerOf(r)
		if !p.ok {
			return forbidden("access denied")
		}
		uid := p.uid
		if s.cfg.allowNonRoot {
			uid = 0
		}
		return s.postSnapctl(r.Context(), body, uid, stopping)
	case p == "/v2/snaps" || strings.HasPrefix(p, "/v2/snaps/"):
		return s.routeSnaps(sock, r, body)
	case p == "/v2/find":
		if r.Method != "GET" {
			return methodNotAllowed(r.Method)
		}
		if sock != "main" {
			return forbidden("access denied")
		}
		return s.findStore(r)
	case p == "/v2/logs":
		if r.Method != "GET" {
			return methodNotAllowed(r.Method)
		}
		// authenticatedAccess{Polkit: polkitActionManage}
		if sock != "main" {
			return forbidden("access denied")
		}
		if rsp := s.requireAuthenticated(r); rsp != nil {
			return rsp
		}
		return s.getLogs(r)
	case p == "/v2/warnings":
		if r.Method != "GET" && r.Method != "POST" {
			return methodNotAllowed(r.Method)
		}
		if sock != "main" {
			return forbidden("access denied")
		}
		if r.Method == "GET" {
			return s.getWarnings(r)
		}
		// authenticatedAccess{Polkit: polkitActionManage}
		if rsp := s.requireAuthenticated(r); rsp != nil {
			return rsp
		}
		return s.ackWarnings(body)
	case p == "/v2/system-info":
		if r.Method != "GET" {
			return methodNotAllowed(r.Method)
		}
		if sock != "main" {
			return forbidden("access denied")
		}
		return s.sysInfo()
	}
	// daemon/daemon.go: router.NotFoundHandler = NotFound("not found")
	return routeNotFound()
}

// routeSnaps serves /v2/snaps, /v2/snaps/{name} (read access as
// /v2/changes: snap-refresh-observe on the snap socket) and
// /v2/snaps/{name}/conf (main socket only).
func (s *Server) routeSnaps(sock string, r *http.Request, body []byte) *response {
	rest, slash := strings.CutPrefix(strings.TrimPrefix(r.URL.Path, "/v2/snaps"), "/")
	name, sub, hasSub := strings.Cut(rest, "/")
	switch {
	case slash && name == "":
		return routeNotFound() // "/v2/snaps/" matches no route
	case hasSub && sub == "conf" && name != "":
		if r.Method != "GET" && r.Method != "PUT" {
			return methodNotAllowed(r.Method)
		}
		// authenticatedAccess for both (with
		// polkitActionManageConfiguration from 2.68 on)
		if sock != "main" {
			return forbidden("access denied")
		}
		if rsp := s.requireAuthenticated(r); rsp != nil {
			return rsp
		}
		if r.Method == "GET" {
			return s.getSnapConf(r, name)
		}
		return s.putSnapConf(name, body)
	case hasSub:
		return routeNotFound()
	}
	if r.Method != "GET" && r.Method != "POST" {
		return methodNotAllowed(r.Method)
	}
	if r.Method == "POST" {
		// authenticatedAccess{Polkit: polkitActionManage}
		if sock != "main" {
			return forbidden("access denied")
		}
		if rsp := s.requireAuthenticated(r); rsp != nil {
			return rsp
		}
		if rest == "" {
			return s.postSnaps(r, body)
		}
		return s.postSnap(name, body)
	}
	if rsp := s.observeDenied(sock); rsp != nil {
		return rsp
	}
	if rest == "" {
		return s.getSnaps(r)
	}
	return s.getSnap(name)
}

// observeDenied answers reads of changes/notices on the snap socket when
// WithSnapSocketObserveDenied is set, as snapd does for a caller it cannot
// map to a snap plugging snap-refresh-observe: "access denied" before 2.68,
// "could not determine snap name for pid: ..." from 2.68 on (the pid is the
// fake's own: the fake does not look up the peer).
func (s *Server) observeDenied(sock string) *response {
	switch {
	case sock == "main":
		return nil
	case s.cfg.noRefreshObserve:
		// A snap without snap-refresh-observe connected
		// (WithoutRefreshObserve).
		return forbidden("access denied")
	case s.cfg.snapSocketDenied:
		return forbidden(s.cfg.version.observeDeniedMessage(os.Getpid()))
	}
	return nil
}

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

// logRequestLocked enters req, handled (acted on, or refused by a fault), in the
// request log and wakes WaitFor conditions on it.
func (s *Server) logRequestLocked(req Request) {
	s.requests = append(s.requests, req)
	s.handled[routeKey(req.Method, req.Path)]++
	s.wakeLocked()
}
