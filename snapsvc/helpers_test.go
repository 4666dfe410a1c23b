package snapsvc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

func TestMain(m *testing.M) {
	if runWorker() || runMachineWorker() || runIntentWorker() {
		return
	}
	code := m.Run()
	if bad := snapsvc.BadHoldMoves(); len(bad) > 0 {
		fmt.Fprintf(os.Stderr, "restart budget holds moved against their lifecycle: %q\n", bad)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// k8sSnap is a small Kubernetes-like snap whose services take a little
// real time to start and stop, so changes overlap when callers race.
func k8sSnap(d time.Duration) fake.Snap {
	svc := func(name string, after ...string) fake.App {
		return fake.App{Name: name, Daemon: "simple", Enabled: true, Active: true, After: after, StartDuration: d, StopDuration: d}
	}
	return fake.Snap{Name: "k8s", Apps: []fake.App{
		svc("containerd"),
		svc("kube-apiserver"),
		svc("kubelet", "containerd"),
		svc("kube-proxy", "kube-apiserver"),
		svc("kube-scheduler", "kube-apiserver"),
		{Name: "k8s"}, // the CLI app, not a service
	}}
}

// newClient builds a REST client for srv with test-friendly settings.
func newClient(t *testing.T, srv *fake.Server, opts ...snapsvc.Option) *snapsvc.Client {
	t.Helper()
	base := []snapsvc.Option{snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithSnapSocket(srv.SnapSocketPath()), snapsvc.WithMode(snapsvc.ModeREST)}
	c, err := snapsvc.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// logWatch is a slog handler that lets a test wait for a log message
// instead of sleeping.
type logWatch struct {
	mu      sync.Mutex
	lines   []string
	waiters map[string]chan struct{}
}

func newLogWatch() *logWatch { return &logWatch{waiters: map[string]chan struct{}{}} }

func (w *logWatch) logger() *slog.Logger { return slog.New(w) }

func (w *logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w *logWatch) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrHandler{w: w, attrs: as}
}
func (w *logWatch) WithGroup(string) slog.Handler { return w }
func (w *logWatch) Handle(_ context.Context, r slog.Record) error {
	w.record(r, nil)
	return nil
}

func (w *logWatch) record(r slog.Record, attrs []slog.Attr) {
	var b strings.Builder
	b.WriteString(r.Message)
	for _, a := range attrs {
		b.WriteString(" " + a.String())
	}
	r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, b.String())
	for sub, ch := range w.waiters {
		if strings.Contains(r.Message, sub) {
			close(ch)
			delete(w.waiters, sub)
		}
	}
}

// seen returns a channel closed once a message containing sub is logged.
func (w *logWatch) seen(sub string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := make(chan struct{})
	w.waiters[sub] = ch
	return ch
}

// note records a line logged elsewhere (a worker process's).
func (w *logWatch) note(msg string) {
	w.record(slog.NewRecord(time.Now(), slog.LevelInfo, msg, 0), nil)
}

// count returns how many lines contain sub.
func (w *logWatch) count(sub string) int {
	n := 0
	for _, l := range w.all() {
		if strings.Contains(l, sub) {
			n++
		}
	}
	return n
}

func (w *logWatch) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...)
}

type attrHandler struct {
	w     *logWatch
	attrs []slog.Attr
}

func (h *attrHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *attrHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &attrHandler{w: h.w, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}
func (h *attrHandler) WithGroup(string) slog.Handler { return h }
func (h *attrHandler) Handle(_ context.Context, r slog.Record) error {
	h.w.record(r, h.attrs)
	return nil
}

// instantClock fires every timer at once and records the pauses asked
// for, so backoff paths run without waiting.
type instantClock struct {
	mu      sync.Mutex
	pauses  []time.Duration
	onPause func(n int)
}

func (c *instantClock) Now() time.Time { return time.Now() }

func (c *instantClock) NewTimer(d time.Duration) retry.Timer {
	c.mu.Lock()
	c.pauses = append(c.pauses, d)
	n := len(c.pauses)
	f := c.onPause
	c.mu.Unlock()
	if f != nil {
		f(n)
	}
	ch := make(chan time.Time, 1)
	ch <- time.Now()
	return firedTimer{ch}
}

func (c *instantClock) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pauses)
}

type firedTimer struct{ ch chan time.Time }

func (t firedTimer) C() <-chan time.Time { return t.ch }
func (t firedTimer) Stop() bool          { return false }

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// whenBlocked runs call in a goroutine and, once the client has logged
// that it waits for blocking changes, runs release; it returns call's
// outcome. It fails the test if call returns before it blocked.
func whenBlocked(t *testing.T, logs *logWatch, call func() (*snapsvc.Result, error), release func()) (*snapsvc.Result, error) {
	t.Helper()
	blocked := logs.seen("waiting for blocking changes")
	type outcome struct {
		res *snapsvc.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := call()
		done <- outcome{res, err}
	}()
	timer := time.NewTimer(testWait)
	defer timer.Stop()
	select {
	case <-blocked:
	case o := <-done:
		t.Fatalf("returned before meeting the blocking change: %+v %v", o.res, o.err)
	case <-timer.C:
		t.Fatalf("never met the blocking change within %v", testWait)
	}
	release()
	o := recvT(t, done)
	return o.res, o.err
}

// foreignPost makes a change the way another tool would (a plain POST to
// /v2/apps) and returns its id.
func foreignPost(t *testing.T, srv *fake.Server, body string) string {
	t.Helper()
	id, err := postApps(srv.SocketPath(), body)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// foreignAgent is the User-Agent of foreign requests, so the fake's
// record tells them from snapsvc's even when their answer was lost.
const foreignAgent = "someone-else/1.0"

// postApps sends one POST /v2/apps on its own connection and returns the
// change id snapd answered with.
func postApps(sock, body string) (string, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequest("POST", "http://localhost/v2/apps", strings.NewReader(body))
	req.Header.Set("User-Agent", foreignAgent)
	req.Header.Set("Content-Type", "application/json")
	rsp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer rsp.Body.Close()
	var env struct {
		Change string `json:"change"`
	}
	b, _ := io.ReadAll(rsp.Body)
	if err := json.Unmarshal(b, &env); err != nil || env.Change == "" {
		return "", fmt.Errorf("foreign POST: %d %s", rsp.StatusCode, b)
	}
	return env.Change, nil
}

// bodyOf returns the body of the request that created change id.
func bodyOf(srv *fake.Server, id string) string {
	for _, r := range srv.Requests() {
		if r.Change == id {
			return r.Body
		}
	}
	return ""
}

// arrived returns a fault Match that reports matching requests on ch.
func arrived(ch chan<- struct{}, want func(fake.Request) bool) func(fake.Request) bool {
	return func(r fake.Request) bool {
		if want != nil && !want(r) {
			return false
		}
		select {
		case ch <- struct{}{}:
		default:
		}
		return true
	}
}

// skewedClock is the real clock off by a fixed offset: a snapd whose
// clock is not the client's.
type skewedClock struct{ off time.Duration }

func (c skewedClock) Now() time.Time { return time.Now().Add(c.off) }

func (c skewedClock) AfterFunc(d time.Duration, f func()) fake.Timer {
	return time.AfterFunc(d, f)
}

// countRequests is how many requests the fake got for method and path.
func countRequests(srv *fake.Server, method, path string) int {
	n := 0
	for _, r := range srv.Requests() {
		if r.Method == method && r.Path == path {
			n++
		}
	}
	return n
}

// checkLeaks verifies, after the test's other cleanups (registered later,
// so run earlier) have closed fakes and clients, that the test left no
// goroutine behind.
func checkLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// conflictsSeen returns an option that observes a client's conflicts, and
// a channel that gets a value at each (buffered; a full buffer drops
// them, never holding the client up).
func conflictsSeen() (snapsvc.Option, <-chan struct{}) { return eventsSeen(snapsvc.EventConflict) }

// awaitT waits for ch, or fails the test, naming what it waited for, once
// ctx ends: every wait of a test is bounded.
func awaitT[T any](t testing.TB, ctx context.Context, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("waited in vain for %s: %v", what, ctx.Err())
	}
	var zero T
	return zero
}

// lockDirOf is the lock directory procClient's Clients share on srv.
func lockDirOf(srv *fake.Server) string { return filepath.Join(srv.Dir(), ".snapsvc-lock") }

// awaitWatcher waits until a process watches snap for the machine in
// srv's lock directory: its wait record held, saying the snap is busy.
func awaitWatcher(t testing.TB, ctx context.Context, srv *fake.Server, snap string) {
	t.Helper()
	awaitWatcherIn(t, ctx, lockDirOf(srv), snap)
}

// awaitWatcherIn is awaitWatcher in the lock directory dir.
func awaitWatcherIn(t testing.TB, ctx context.Context, dir, snap string) {
	t.Helper()
	if err := snapsvc.AwaitLockDir(ctx, dir, func() bool { return snapsvc.Watching(dir, snap) }); err != nil {
		t.Fatalf("waiting for a watcher of %s: %v", snap, err)
	}
}

// eventsSeen returns an option that observes a client's events of kind,
// and a channel that gets a value at each (buffered; a full buffer drops
// them, never holding the client up).
func eventsSeen(kind snapsvc.EventKind) (snapsvc.Option, <-chan struct{}) {
	ch := make(chan struct{}, 100)
	return snapsvc.WithObserver(func(ev snapsvc.Event) {
		if ev.Kind == kind {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}), ch
}

// testWait bounds every wait of a test that has no context of its own
// (recvT): as long as ctxT's.
const testWait = 30 * time.Second

// recvT receives from ch, or fails the test once testWait has passed:
// every wait of a test is bounded, so a test that would hang fails,
// saying where, instead of holding up the whole run.
func recvT[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	timer := time.NewTimer(testWait)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waited %v in vain", testWait)
	}
	var zero T
	return zero
}
