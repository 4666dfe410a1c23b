package fake

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	active         []*change // changes not seen ready yet, in creation order: what settling and conflicts read
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
	svcHistory     map[string][]ServiceStateAt // snap.app: its states (history.go)
	counters       Counters
	handled        map[string]int // requests in the log, per route (View.Handled)
	maint          *errorResult
	latency        time.Duration
	faults         []*InjectedFault
	unsuccessful   map[string]unsuccessfulRule
	timers         map[int]Timer
	timerSeq       int
	lastHookSeq    int
	listening      bool
	servers        []*http.Server
	listeners      []net.Listener  // of the servers, closed by StopListening
	serving        *sync.WaitGroup // the servers' Serve goroutines
	stopping       chan struct{}   // closed when the current listening session ends
	conns          map[net.Conn]bool
	inflight       int
	handlers       sync.WaitGroup
	warnings       []*warning
	logs           []logEntry
	logWake        chan struct{}
	lastPID        int
	stateDirty     bool
	store          map[string]map[string]StoreRevision // snap -> channel -> what the store offers (store.go)
	localInstalls  int                                 // sideloads so far (their temporary file names)
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
		logWake:      make(chan struct{}),
		hooks:        map[string]*Hook{},
		unsuccessful: map[string]unsuccessfulRule{},
		timers:       map[int]Timer{},
		counters:     Counters{Requests: map[string]int{}},
		handled:      map[string]int{},
	}
	for _, e := range cfg.store {
		if err := e.rev.check(); err != nil {
			return nil, err
		}
		s.setStoreLocked(e.snap, e.rev)
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
	ss := &snapState{name: sn.Name, cookie: sn.Cookie, apps: map[string]*appState{},
		config: copyConfig(sn.Config), info: sn, installed: s.nowLocked()}
	ss.info.Apps = nil
	ss.info.Hooks = append([]string(nil), sn.Hooks...)
	if ss.cookie == "" {
		ss.cookie = cookieFor(sn.Name)
	}
	for _, a := range sn.Apps {
		if a.Daemon != "" && a.DaemonScope == "" {
			a.DaemonScope = "system"
		}
		a.Before = append([]string(nil), a.Before...)
		a.After = append([]string(nil), a.After...)
		st := &appState{App: a, snap: sn.Name}
		if a.Daemon != "" && a.Active {
			// Running already: it has a main pid (its journal lines
			// carry it), as a started one gets.
			if s.lastPID == 0 {
				s.lastPID = 4000
			}
			s.lastPID++
			st.pid = s.lastPID
		}
		ss.apps[a.Name] = st
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
		// Anyone may connect, as to snapd's sockets: systemd creates
		// both with SocketMode=0666 (data/systemd/snapd.socket); snapd
		// itself refuses what a caller may not do.
		if err := os.Chmod(p, 0o666); err != nil {
			ln.Close()
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("fake snapd: %w", err)
		}
		lns = append(lns, ln)
	}
	s.stopping = make(chan struct{})
	s.servers = nil
	s.listeners = lns
	serving := &sync.WaitGroup{}
	s.serving = serving
	for i, ln := range lns {
		sock := "main"
		if i == 1 {
			sock = "snap"
		}
		srv := &http.Server{Handler: s.handler(sock), ReadHeaderTimeout: time.Minute, ConnState: s.trackConn, ConnContext: connContext}
		s.servers = append(s.servers, srv)
		s.handlers.Add(1)
		serving.Add(1)
		go func() { // reads nothing of s unlocked: a later StartListening replaces s.serving
			defer s.handlers.Done()
			defer serving.Done()
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
	srvs, lns, serving := s.servers, s.listeners, s.serving
	s.servers, s.listeners = nil, nil
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
	// Close the listeners here, and wait for their Serve goroutines: a
	// Serve that had not started when the servers shut down closes its
	// listener when it does start, and closing a Unix listener unlinks
	// its path — by then, perhaps, the socket of the next StartListening.
	for _, ln := range lns {
		ln.Close()
	}
	serving.Wait()
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

// Listening reports whether the sockets are being served.
func (s *Server) Listening() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listening
}

func (s *Server) appLocked(snap, app string) *appState {
	if ss := s.snaps[snap]; ss != nil {
		return ss.apps[app]
	}
	return nil
}
