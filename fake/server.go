package fake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Server is an in-process snapd double serving snapd's REST API on two Unix
// sockets. Create it with New or NewServer; it is safe for concurrent use.
type Server struct {
	cfg      config
	clock    Clock
	dir      string
	ownDir   bool
	mainPath string
	snapPath string

	mu             sync.Mutex
	closed         bool
	closeCh        chan struct{}
	snaps          map[string]*snapState
	changes        []*change
	changeByID     map[string]*change
	lastChangeID   int
	lastTaskID     int
	notices        []*notice
	noticeByKey    map[string]*notice
	lastNoticeID   int
	lastNoticeTime time.Time
	noticeWake     chan struct{}
	stateWake      chan struct{}
	hooks          map[string]*Hook
	requests       []Request
	counters       Counters
	maint          *errorResult
	latency        time.Duration
	faults         []*InjectedFault
	unsuccessful   map[string]unsuccessfulRule
	timers         map[int]Timer
	timerSeq       int
	lastHookSeq    int
	listening      bool
	servers        []*http.Server
	stopping       chan struct{} // closed when the current listening session ends
	conns          map[net.Conn]bool
	inflight       int
	handlers       sync.WaitGroup
}

type unsuccessfulRule struct {
	stdout, stderr string
	code           int
}

// Request is one request the fake answered (or dropped), for assertions.
type Request struct {
	// Time is when the request arrived, on the fake's clock.
	Time time.Time
	// Done is when the answer was ready, on the fake's clock.
	Done time.Time
	// Socket is "main" (snapd.socket) or "snap" (snapd-snap.socket).
	Socket string
	// Method, Path, Query and Body are as received; UserAgent is the
	// User-Agent header (snapsvc sends "snapsvc", the snap CLI "snapd/VERSION ...").
	Method, Path, Query string
	Body                string
	UserAgent           string
	// Status is the HTTP status code of the answer, Kind the error kind and
	// Message the error message (both empty for success).
	Status        int
	Kind, Message string
	// Change is the change id of an async answer.
	Change string
	// Dropped reports that the connection was closed instead of answering.
	Dropped bool
	// Fault names the injected fault that applied ("drop", "cut",
	// "garble", "reject", "reply"), or is empty.
	Fault string
}

// Counters are aggregate statistics.
type Counters struct {
	// Requests counts requests per "METHOD /path" with ids replaced by
	// {id}, e.g. "POST /v2/apps", "GET /v2/changes/{id}".
	Requests map[string]int
	// Conflicts counts requests answered with a change conflict.
	Conflicts int
	// ChangesCreated counts changes created (by requests, hooks or AddChange).
	ChangesCreated int
}

// AppState is the current state of one service.
type AppState struct {
	Enabled, Active bool
}

// New starts a fake snapd. The caller must Close it.
func New(opts ...Option) (*Server, error) {
	cfg := config{version: Version277, clock: RealClock(), snapctlTimeout: 150 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	s := &Server{
		cfg:          cfg,
		clock:        cfg.clock,
		closeCh:      make(chan struct{}),
		snaps:        map[string]*snapState{},
		changeByID:   map[string]*change{},
		noticeByKey:  map[string]*notice{},
		noticeWake:   make(chan struct{}),
		stateWake:    make(chan struct{}),
		hooks:        map[string]*Hook{},
		unsuccessful: map[string]unsuccessfulRule{},
		timers:       map[int]Timer{},
		counters:     Counters{Requests: map[string]int{}},
	}
	for _, sn := range cfg.snaps {
		if err := s.addSnapLocked(sn); err != nil {
			return nil, err
		}
	}
	s.dir = cfg.dir
	if s.dir == "" {
		d, err := os.MkdirTemp("", "fakesnapd")
		if err != nil {
			return nil, fmt.Errorf("fake snapd: cannot create socket directory: %w", err)
		}
		s.dir, s.ownDir = d, true
	}
	s.mainPath = filepath.Join(s.dir, "snapd.socket")
	s.snapPath = filepath.Join(s.dir, "snapd-snap.socket")
	if !cfg.notListening {
		if err := s.StartListening(); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// NewServer starts a fake snapd for a test and closes it in t.Cleanup.
// It fails the test if the server cannot start.
func NewServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := New(opts...)
	if err != nil {
		t.Fatalf("fake snapd: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func cookieFor(name string) string {
	h := sha256.Sum256([]byte("fake-snapd-cookie/" + name))
	return hex.EncodeToString(h[:])[:44]
}

func (s *Server) addSnapLocked(sn Snap) error {
	if sn.Name == "" {
		return errors.New("fake snapd: snap without a name")
	}
	ss := &snapState{name: sn.Name, cookie: sn.Cookie, apps: map[string]*appState{}, config: map[string]any{}}
	if ss.cookie == "" {
		ss.cookie = cookieFor(sn.Name)
	}
	for _, a := range sn.Apps {
		if a.Daemon != "" && a.DaemonScope == "" {
			a.DaemonScope = "system"
		}
		a.Before = append([]string(nil), a.Before...)
		a.After = append([]string(nil), a.After...)
		ss.apps[a.Name] = &appState{App: a, snap: sn.Name}
	}
	s.snaps[sn.Name] = ss
	return nil
}

// InstallSnap adds or replaces a snap (its services take the given initial
// state). It creates no change.
func (s *Server) InstallSnap(sn Snap) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addSnapLocked(sn)
}

// SocketPath is the main socket (snapd.socket): /v2/apps, changes,
// notices, system-info.
func (s *Server) SocketPath() string { return s.mainPath }

// SnapSocketPath is the snap socket (snapd-snap.socket): /v2/snapctl, and
// changes and notices for snaps with snap-refresh-observe.
func (s *Server) SnapSocketPath() string { return s.snapPath }

// Dir is the directory holding both sockets.
func (s *Server) Dir() string { return s.dir }

// Version is the snapd version the fake imitates.
func (s *Server) Version() Version { return s.cfg.version }

// Clock is the fake's clock.
func (s *Server) Clock() Clock { return s.clock }

// Cookie returns snap's ephemeral context id (its SNAP_COOKIE), or "" for
// an unknown snap.
func (s *Server) Cookie(snap string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss := s.snaps[snap]; ss != nil {
		return ss.cookie
	}
	return ""
}

// Close stops listening, removes the sockets, cancels every timer and waits
// for in-flight handlers. Pending snapctl calls and long-polls are answered
// or cut. Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closeCh)
	for id, t := range s.timers {
		t.Stop()
		delete(s.timers, id)
	}
	s.mu.Unlock()
	s.StopListening()
	s.handlers.Wait()
	// wait (boundedly) for handlers still finishing their answer
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		n, wake := s.inflight, s.stateWake
		s.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-wake:
			continue
		case <-deadline.C:
		}
		break
	}
	if s.ownDir {
		os.RemoveAll(s.dir)
	}
	return nil
}

// StartListening creates both sockets and serves them (after StopListening
// or WithoutListening). It is a no-op when already listening.
func (s *Server) StartListening() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("fake snapd: closed")
	}
	if s.listening {
		return nil
	}
	var lns []net.Listener
	for _, p := range []string{s.mainPath, s.snapPath} {
		os.Remove(p)
		ln, err := net.Listen("unix", p)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("fake snapd: cannot listen on %s: %w", p, err)
		}
		lns = append(lns, ln)
	}
	s.stopping = make(chan struct{})
	s.servers = nil
	for i, ln := range lns {
		sock := "main"
		if i == 1 {
			sock = "snap"
		}
		srv := &http.Server{Handler: s.handler(sock), ReadHeaderTimeout: time.Minute, ConnState: s.trackConn}
		s.servers = append(s.servers, srv)
		s.handlers.Add(1)
		go func() {
			defer s.handlers.Done()
			srv.Serve(ln)
		}()
	}
	s.listening = true
	return nil
}

// StopListening closes both sockets and removes the socket files, as when
// snapd stops: new connections fail (ENOENT), open connections are cut and
// in-flight notice long-polls are answered 500 "request canceled" first.
func (s *Server) StopListening() {
	s.mu.Lock()
	if !s.listening {
		s.mu.Unlock()
		return
	}
	s.listening = false
	close(s.stopping)
	srvs := s.servers
	s.servers = nil
	s.mu.Unlock()
	for _, srv := range srvs {
		srv.SetKeepAlivesEnabled(false)
	}
	// give long-polls/snapctl waits a moment to write their answers
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	for _, srv := range srvs {
		srv.Shutdown(ctx)
		srv.Close()
	}
	os.Remove(s.mainPath)
	os.Remove(s.snapPath)
}

func (s *Server) trackConn(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conns == nil {
		s.conns = map[net.Conn]bool{}
	}
	switch st {
	case http.StateNew:
		s.conns[c] = true
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	}
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

// Listening reports whether the sockets are being served.
func (s *Server) Listening() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listening
}

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

func (s *Server) appLocked(snap, app string) *appState {
	if ss := s.snaps[snap]; ss != nil {
		return ss.apps[app]
	}
	return nil
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

// ---- HTTP plumbing ----

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
	// bare responses are served before the handler runs (router 404,
	// 405, access-check 403): daemon/daemon.go Command.ServeHTTP adds
	// "maintenance" only to what a handler returns.
	bare bool
}

// respJSON mirrors daemon/response.go.
type respJSON struct {
	Type        string       `json:"type"`
	StatusCode  int          `json:"status-code"`
	Status      string       `json:"status"`
	Result      any          `json:"result"`
	Change      string       `json:"change,omitempty"`
	Maintenance *errorResult `json:"maintenance,omitempty"`
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

// routeNotFound is the router's NotFoundHandler (daemon/daemon.go), bare.
func routeNotFound() *response {
	r := notFound("not found")
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
		req := Request{Time: s.nowLocked(), Socket: sock, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body), UserAgent: r.UserAgent()}
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
		if er, ok := rsp.result.(*errorResult); ok && rsp.typ == "error" {
			req.Kind, req.Message = er.Kind, er.Message
		}
		req.Dropped = fault != nil && fault.Kind == FaultDrop
		s.requests = append(s.requests, req)
		out := respJSON{Type: rsp.typ, StatusCode: rsp.status, Status: http.StatusText(rsp.status), Result: rsp.result, Change: rsp.change}
		if !rsp.bare {
			out.Maintenance = s.maint
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
	s.requests = append(s.requests, req)
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
			if sock != "main" {
				return forbidden("access denied")
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
		return s.postSnapctl(r.Context(), body, stopping)
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

// observeDenied answers reads of changes/notices on the snap socket when
// WithSnapSocketObserveDenied is set, as snapd does for a caller it cannot
// map to a snap plugging snap-refresh-observe: "access denied" before 2.68,
// "could not determine snap name for pid: ..." from 2.68 on (the pid is the
// fake's own: the fake does not look up the peer).
func (s *Server) observeDenied(sock string) *response {
	if sock == "main" || !s.cfg.snapSocketDenied {
		return nil
	}
	return forbidden(s.cfg.version.observeDeniedMessage(os.Getpid()))
}

func methodNotAllowed(m string) *response {
	r := errResp(405, "", nil, "method %q not allowed", m)
	r.bare = true
	return r
}

func (s *Server) sysInfo() *response {
	v := string(s.cfg.version)
	return syncResp(map[string]any{
		"series":         "16",
		"version":        v,
		"build-id":       "fakesnapd" + strings.ReplaceAll(v, ".", ""),
		"os-release":     map[string]string{"id": "debian", "version-id": "13"},
		"on-classic":     true,
		"managed":        false,
		"kernel-version": "6.0.0-fake",
		"locations":      map[string]string{"snap-mount-dir": "/snap", "snap-bin-dir": "/snap/bin"},
		"refresh":        map[string]string{"timer": "00:00~24:00/4"},
		"confinement":    "partial",
		"sandbox-features": map[string][]string{
			"confinement-options": {"classic", "devmode"},
		},
		"architecture":   "amd64",
		"virtualization": "none",
		"system-mode":    "run",
		"snapd-bin-from": "native-package",
		"features":       map[string]any{},
	})
}

// ---- waiting helpers for tests ----

// WaitIdle blocks until no change is in progress (or ctx ends). With a
// ManualClock nobody advances time for you: use AdvanceUntilIdle.
func (s *Server) WaitIdle(ctx context.Context) error {
	for {
		s.mu.Lock()
		busy := false
		for _, c := range s.changes {
			if !statusReady(c.status()) {
				busy = true
				break
			}
		}
		wake := s.stateWake
		s.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closeCh:
			return errors.New("fake snapd: closed")
		}
	}
}

// WaitFor blocks until cond (called with the server's state locked, so it
// must only use the callbacks' arguments) returns true or ctx ends. It is
// re-evaluated after every state change.
func (s *Server) WaitFor(ctx context.Context, cond func(v View) bool) error {
	for {
		s.mu.Lock()
		ok := cond(View{s})
		wake := s.stateWake
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closeCh:
			return errors.New("fake snapd: closed")
		}
	}
}

// View is a read-only look at the fake's state inside WaitFor.
type View struct{ s *Server }

// InProgress describes the changes that are not ready, in id order.
func (v View) InProgress() []ChangeInfo {
	var out []ChangeInfo
	for _, c := range v.s.changes {
		if !statusReady(c.status()) {
			out = append(out, v.s.infoLocked(c))
		}
	}
	return out
}

// Service returns snap.app's state.
func (v View) Service(snap, app string) (AppState, bool) {
	a := v.s.appLocked(snap, app)
	if a == nil || a.Daemon == "" {
		return AppState{}, false
	}
	return AppState{Enabled: a.Enabled, Active: a.Active}, true
}

// Requests returns how many requests were answered so far.
func (v View) Requests() int { return len(v.s.requests) }

// InFlight returns how many requests are being handled right now (e.g.
// snapctl calls waiting for their change, notice long-polls).
func (v View) InFlight() int { return v.s.inflight }

// ChangeInfo describes a change, for assertions.
type ChangeInfo struct {
	ID, Kind, Summary, Status string
	Ready                     bool
	Err                       string
	SpawnTime, ReadyTime      time.Time
	SnapNames                 []string
	Tasks                     []TaskInfo
}

// TaskInfo describes a task of a change.
type TaskInfo struct {
	ID, Kind, Summary, Status string
	Log                       []string
	AffectedSnaps             []string
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

// AdvanceUntilReady drives a ManualClock until change id is ready, firing
// timers one deadline at a time; it fails when no timer is left to fire.
// With another clock it waits for the change (or ctx).
func (s *Server) AdvanceUntilReady(ctx context.Context, id string) error {
	ready := s.ChangeReady(id)
	if ready == nil {
		return fmt.Errorf("fake snapd: no change %q", id)
	}
	return s.advanceUntil(ctx, func() bool {
		select {
		case <-ready:
			return true
		default:
			return false
		}
	}, ready, fmt.Sprintf("change %s", id))
}

// AdvanceUntilIdle is AdvanceUntilReady for every change in progress.
func (s *Server) AdvanceUntilIdle(ctx context.Context) error {
	idle := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.changes {
			if !statusReady(c.status()) {
				return false
			}
		}
		return true
	}
	return s.advanceUntil(ctx, idle, nil, "all changes")
}

func (s *Server) advanceUntil(ctx context.Context, done func() bool, ready <-chan struct{}, what string) error {
	mc, manual := s.clock.(*ManualClock)
	for !done() {
		if manual {
			if _, ok := mc.AdvanceToNext(); !ok {
				if done() {
					return nil
				}
				return fmt.Errorf("fake snapd: %s cannot become ready by advancing the clock (nothing scheduled; a foreign change or hook needs Finish)", what)
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			continue
		}
		s.mu.Lock()
		wake := s.stateWake
		s.mu.Unlock()
		if done() {
			return nil
		}
		select {
		case <-wake:
		case <-ready:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closeCh:
			return errors.New("fake snapd: closed")
		}
	}
	return nil
}

// sortedSnapNames returns the unique sorted names.
func sortedUnique(in []string) []string {
	m := map[string]bool{}
	var out []string
	for _, n := range in {
		if !m[n] {
			m[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
