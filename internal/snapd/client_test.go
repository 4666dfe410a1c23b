package snapd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// serve answers every request with the golden body named by route (path
// → file under testdata/snapd-golden) and returns a client for it.
func serve(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "snapd.socket")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	c := New(sock)
	t.Cleanup(func() {
		c.CloseIdleConnections()
		srv.Close()
	})
	return c
}

func golden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "testdata", "snapd-golden", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func replay(t *testing.T, status int, body []byte) *Client {
	return serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(body)
	})
}

func TestParsesRealBodies(t *testing.T) {
	ctx := context.Background()

	apps, err := replay(t, 200, golden(t, "2.57.6/apps-snap.json")).Apps(ctx, []string{"svcdemo"}, false)
	if err != nil || len(apps) != 5 {
		t.Fatalf("apps: %v %+v", err, apps)
	}
	if !apps[0].Enabled || !apps[0].Active || apps[2].IsService() || apps[4].Enabled || apps[4].Daemon != "forking" {
		t.Errorf("apps decoded wrongly: %+v", apps)
	}

	chg, err := replay(t, 200, golden(t, "2.57.6/change-start-broken-error.json")).Change(ctx, "27")
	if err != nil || chg.Status != StatusError || !chg.Ready || chg.Err == "" || chg.ReadyTime == nil || len(chg.Tasks) != 1 {
		t.Fatalf("change: %v %+v", err, chg)
	}

	chg, err = replay(t, 200, golden(t, "2.77.1/lp-change-done.json")).Change(ctx, "29")
	if err != nil || chg.Tasks[0].Data.AffectedSnaps[0] != "svcdemo" {
		t.Fatalf("affected-snaps: %v %+v", err, chg)
	}

	chgs, err := replay(t, 200, golden(t, "2.57.6/changes-during-snapctl-stop.json")).Changes(ctx, SelectInProgress, "")
	if err != nil || len(chgs) != 1 || chgs[0].Tasks[0].Kind != "exec-command" || chgs[0].Ready {
		t.Fatalf("changes: %v %+v", err, chgs)
	}

	ns, err := replay(t, 200, golden(t, "2.77.1/notices-change-update.json")).Notices(ctx, NoticesOptions{Types: []string{NoticeChangeUpdate}})
	if err != nil || len(ns) == 0 || ns[0].Type != NoticeChangeUpdate || ns[0].LastRepeated.IsZero() || ns[0].LastData["kind"] == "" {
		t.Fatalf("notices: %v %+v", err, ns)
	}

	info, err := replay(t, 200, golden(t, "2.77.1/system-info.json")).SystemInfo(ctx)
	if err != nil || info.Version != "2.77.1-2" || !info.OnClassic {
		t.Fatalf("system-info: %v %+v", err, info)
	}

	id, err := replay(t, 202, golden(t, "2.57.6/post-start-alpha.json")).PostApps(ctx, AppInstruction{Action: ActionStart, Names: []string{"svcdemo.alpha"}})
	if err != nil || id == "" {
		t.Fatalf("post: %q %v", id, err)
	}

	out, err := replay(t, 200, golden(t, "2.57.6/snapctl-services.json")).RunSnapctl(ctx, SnapctlRequest{ContextID: "c", Args: []string{"services"}})
	if err != nil || out.Stdout == "" {
		t.Fatalf("snapctl: %v %+v", err, out)
	}

	_, err = replay(t, 400, golden(t, "2.57.6/conflict-restart-alpha.json")).PostApps(ctx, AppInstruction{Action: ActionRestart, Names: []string{"svcdemo.alpha"}})
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Kind != "" || apiErr.Message != `snap "svcdemo" has "service-control" change in progress` {
		t.Fatalf("conflict: %#v", err)
	}

	_, err = replay(t, 200, golden(t, "2.77.1/selfrestart-maintenance-body.json")).Change(ctx, "39")
	if err != nil {
		t.Fatalf("a sync body with maintenance is not an error: %v", err)
	}

	_, err = replay(t, 404, []byte(`{"type":"error","status-code":404,"status":"Not Found","result":{"message":"not found"}}`)).Notices(ctx, NoticesOptions{})
	if !IsNotFound(err) || errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown route: %v", err)
	}
	_, err = replay(t, 404, golden(t, "2.57.6/change-not-found.json")).Change(ctx, "999999")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing change: %v", err)
	}
}

func TestUnsuccessfulSnapctl(t *testing.T) {
	body := []byte(`{"type":"error","status-code":200,"status":"OK","result":{"message":"unsuccessful with exit code: 3","kind":"unsuccessful","value":{"stdout":"o","stderr":"e","exit-code":3}}}`)
	_, err := replay(t, 200, body).RunSnapctl(context.Background(), SnapctlRequest{ContextID: "c", Args: []string{"is-connected", "x"}})
	var ue *UnsuccessfulError
	if !errors.As(err, &ue) || ue.ExitCode != 3 || ue.Stdout != "o" || ue.Stderr != "e" {
		t.Fatalf("%#v", err)
	}
}

func TestConnectionErrorKnowsWhetherRequestWasWritten(t *testing.T) {
	// Nothing listens: the request was never written.
	c := New(filepath.Join(t.TempDir(), "absent.socket"))
	_, err := c.PostApps(context.Background(), AppInstruction{Action: "start", Names: []string{"a.b"}})
	var ce *ConnectionError
	if !errors.As(err, &ce) || ce.Written {
		t.Fatalf("absent socket: %#v", err)
	}
	// The server reads the request, then hangs up without answering.
	c = serve(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	_, err = c.PostApps(context.Background(), AppInstruction{Action: "start", Names: []string{"a.b"}})
	if !errors.As(err, &ce) || !ce.Written || ce.Method != "POST" {
		t.Fatalf("dropped answer: %#v", err)
	}
}

func TestNoticesQueryAndCancel(t *testing.T) {
	got := make(chan string, 1)
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		got <- r.URL.RawQuery
		<-r.Context().Done() // hold like a long-poll
	})
	ctx, cancel := context.WithCancel(context.Background())
	after := time.Date(2026, 12, 2, 14, 0, 0, 5, time.FixedZone("x", 3600))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Notices(ctx, NoticesOptions{Types: []string{"change-update"}, Keys: []string{"1", "2"}, After: after, Timeout: 30 * time.Second})
		errc <- err
	}()
	q := <-got
	want := "after=2026-12-02T13%3A00%3A00.000000005Z&keys=1%2C2&timeout=30s&types=change-update"
	if q != want {
		t.Errorf("query %s, want %s", q, want)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled long-poll: %v", err)
	}
}

func TestAnswerBounds(t *testing.T) {
	ctx := context.Background()
	big := func(n int) []byte {
		// A valid envelope whose result is one long string.
		return append(append([]byte(`{"type":"sync","status-code":200,"status":"OK","result":"`), bytes.Repeat([]byte("x"), n)...), `"}`...)
	}
	_, err := replay(t, 200, big(MaxBody+1)).SystemInfo(ctx)
	var re *ResponseError
	if !errors.As(err, &re) || !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the bound: %v", err)
	}
	// Listings may be larger: the same body is read (and fails only on
	// its shape, a string where a list belongs).
	_, err = replay(t, 200, big(MaxBody+1)).Changes(ctx, SelectAll, "")
	if !errors.As(err, &re) || errors.Is(err, ErrTooLarge) {
		t.Fatalf("listing under its bound: %v", err)
	}
	_, err = replay(t, 200, big(MaxListBody+1)).Changes(ctx, SelectAll, "")
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("listing over its bound: %v", err)
	}
}

func TestCutAndGarbledAnswers(t *testing.T) {
	ctx := context.Background()
	body := golden(t, "2.57.6/post-start-alpha.json")
	cut := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.WriteHeader(202)
		w.Write(body[:len(body)/2])
	})
	_, err := cut.PostApps(ctx, AppInstruction{Action: ActionStart, Names: []string{"svcdemo.alpha"}})
	var ce *ConnectionError
	if !errors.As(err, &ce) || !ce.Written || !ce.Connected {
		t.Fatalf("cut body: %#v", err)
	}
	_, err = replay(t, 202, []byte("<html>bad gateway</html>")).PostApps(ctx, AppInstruction{Action: ActionStart, Names: []string{"svcdemo.alpha"}})
	var re *ResponseError
	if !errors.As(err, &re) || re.StatusCode != 202 || re.Method != "POST" {
		t.Fatalf("garbled body: %#v", err)
	}
}

func TestDialErrorsSayWhatTheSocketIs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		filepath.Join(dir, "absent"): "does not exist",
		dir:                          "is a directory, not a socket",
		file:                         "is not a socket (a regular file)",
	} {
		_, err := New(path).Apps(context.Background(), nil, true)
		var ce *ConnectionError
		if !errors.As(err, &ce) || ce.Connected || ce.Written || ce.Socket != path || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", path, err, want)
		}
	}
}

// Issue 36: a path that is not a socket, and a socket connect(2) refuses
// permission to, are *SocketError (ErrNotSocket, fs.ErrPermission), so
// that nobody waits for them to change. Root passes every permission
// check, so the refusal is the dialler's.
func TestDialErrorsThatWaitingCannotChange(t *testing.T) {
	dir := t.TempDir()
	for path, want := range map[string]error{dir: ErrNotSocket} {
		_, err := New(path).Apps(context.Background(), nil, true)
		var se *SocketError
		if !errors.As(err, &se) || !errors.Is(err, want) || errors.Is(err, os.ErrPermission) {
			t.Errorf("%s: %v, want a *SocketError matching %v", path, err, want)
		}
	}
	sock := filepath.Join(dir, "snapd.socket")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := New(sock)
	c.dial = func(context.Context) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.EACCES)}
	}
	_, err = c.Apps(context.Background(), nil, true)
	var se *SocketError
	if !errors.As(err, &se) || !se.Denied || !errors.Is(err, os.ErrPermission) || errors.Is(err, ErrNotSocket) ||
		err.Error() != "cannot communicate with snapd at "+sock+" (GET /v2/apps, cannot connect): "+sock+" cannot be connected to: permission denied" {
		t.Errorf("EACCES: %v, want a *SocketError matching fs.ErrPermission", err)
	}
}

func TestLongPollOverdueIsGivenUp(t *testing.T) {
	release := make(chan struct{})
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		select { // hold far past the long-poll's timeout
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	c.longPollGrace = 20 * time.Millisecond
	_, err := c.Notices(context.Background(), NoticesOptions{Types: []string{NoticeChangeUpdate}, Timeout: time.Millisecond})
	var ce *ConnectionError
	if !errors.As(err, &ce) || !errors.Is(err, errLongPollOverdue) || ce.Method != "GET" {
		t.Fatalf("overdue long-poll: %v", err)
	}
}

// A request cut by a context's deadline or cancellation matches the
// context's cause, whatever the Go version: net/http reported only
// ctx.Err() before Go 1.23, and callers set their bound as the cause
// (snapsvc's ErrGaveUp). Found by the core's tests on Go 1.22.
func TestRequestErrorsCarryTheContextsCause(t *testing.T) {
	arrived := make(chan struct{}, 1)
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // a wedged snapd: never answers
	})
	bound := errors.New("the caller's bound")
	for _, method := range []string{"GET", "POST"} {
		send := func(ctx context.Context) (err error) {
			if method == "GET" {
				_, err = c.Change(ctx, "1")
			} else {
				_, err = c.Abort(ctx, "1")
			}
			return err
		}
		// Cancelled once snapd has the request.
		ctx, cancel := context.WithCancelCause(context.Background())
		go func() { <-arrived; cancel(bound) }()
		err := send(ctx)
		var ce *ConnectionError
		if !errors.Is(err, bound) || !errors.As(err, &ce) || !ce.Written {
			t.Errorf("cancelled %s: %v, want a ConnectionError after the request was sent, matching the context's cause", method, err)
		}
		// A deadline with a cause.
		ctx, stop := context.WithDeadlineCause(context.Background(), time.Now().Add(20*time.Millisecond), bound)
		err = send(ctx)
		stop()
		if !errors.Is(err, bound) || !errors.As(err, &ce) {
			t.Errorf("deadline %s: %v, want a ConnectionError matching the context's cause", method, err)
		}
		select {
		case <-arrived: // the deadline's request, if it arrived in time
		default:
		}
	}
	// A context that ended without a cause of its own adds nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := c.Change(ctx, "1")
	if !errors.Is(err, context.DeadlineExceeded) || strings.Count(err.Error(), "context deadline exceeded") != 1 {
		t.Errorf("plain deadline: %v", err)
	}
}

// A send-by is enforced at the write: a past one refuses the request
// before its first byte (ErrSendDeadline, nothing written), and one beyond
// what Unix nanoseconds can hold is no bound at all rather than an
// overflow into the past (issue 33, defect 1: such a send-by refused every
// write).
func TestSendBy(t *testing.T) {
	posts := 0
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		posts++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(202)
		fmt.Fprint(w, `{"type":"async","status-code":202,"status":"Accepted","result":null,"change":"7"}`)
	})
	ctx := context.Background()
	inst := AppInstruction{Action: "restart", Names: []string{"k8s.kubelet"}}
	_, err := c.PostApps(WithSendBy(ctx, time.Now().Add(-time.Second)), inst)
	var ce *ConnectionError
	if !errors.Is(err, ErrSendDeadline) || !errors.As(err, &ce) || ce.Written || posts != 0 {
		t.Fatalf("past send-by: %v (written %v), %d requests served; want ErrSendDeadline and nothing sent", err, ce != nil && ce.Written, posts)
	}
	for _, by := range []time.Time{time.Now().Add(time.Hour), time.Now().Add(time.Duration(1<<63 - 1)), time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		id, err := c.PostApps(WithSendBy(ctx, by), inst)
		if err != nil || id != "7" {
			t.Errorf("send-by %v: %q, %v; want the request sent", by.Year(), id, err)
		}
	}
}

// wallStepped returns t with its wall-clock reading moved by d (whole
// seconds) and its monotonic reading kept: the instant a fence computed
// before the machine's wall clock was stepped by -d, seen from after the
// step. time.Time offers no way to build one (Add moves both readings;
// Round(0) drops the monotonic one), so this writes its fields as
// package time lays them out (a monotonic time keeps its wall seconds
// since 1885 in bits 30-62 of wall, its monotonic reading in ext); the
// caller checks the result says what is meant.
func wallStepped(t time.Time, d time.Duration) time.Time {
	type layout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	const nsecShift, nsecMask, hasMonotonic = 30, 1<<30 - 1, 1 << 63
	p := (*layout)(unsafe.Pointer(&t))
	sec := int64(p.wall<<1>>(nsecShift+1)) + int64(d/time.Second)
	p.wall = p.wall&(hasMonotonic|nsecMask) | uint64(sec)<<nsecShift
	return t
}

// A send-by is a monotonic deadline: a step of the machine's wall clock
// between the fence and the write changes nothing (issue 41, item 2: the
// connection compared Unix nanoseconds, so after a backward step a
// request went out past the end of its confirmation, and after a forward
// one a request within it was refused).
func TestSendByIgnoresWallClockSteps(t *testing.T) {
	posts := 0
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		posts++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(202)
		fmt.Fprint(w, `{"type":"async","status-code":202,"status":"Accepted","result":null,"change":"7"}`)
	})
	ctx := context.Background()
	inst := AppInstruction{Action: "restart", Names: []string{"k8s.kubelet"}}

	// The confirmation ran out a second ago by the monotonic clock; the
	// wall clock was stepped back an hour since the fence, so by it an
	// hour is left.
	now := time.Now()
	ranOut := wallStepped(now.Add(-time.Second), time.Hour)
	if ranOut.Sub(now) != -time.Second || ranOut.UnixNano()-now.UnixNano() != int64(time.Hour-time.Second) {
		t.Fatalf("wallStepped: monotonic %s, wall %s from now; the test's model of time.Time no longer holds", ranOut.Sub(now), time.Duration(ranOut.UnixNano()-now.UnixNano()))
	}
	_, err := c.PostApps(WithSendBy(ctx, ranOut), inst)
	var ce *ConnectionError
	if !errors.Is(err, ErrSendDeadline) || !errors.As(err, &ce) || ce.Written || posts != 0 {
		t.Fatalf("send-by a second past by the monotonic clock, an hour ahead by the stepped wall clock: %v (written %v), %d requests served; want ErrSendDeadline and nothing sent", err, ce != nil && ce.Written, posts)
	}

	// An hour left by the monotonic clock; the wall clock stepped forward
	// two hours since the fence: the request goes.
	left := wallStepped(time.Now().Add(time.Hour), -2*time.Hour)
	if id, err := c.PostApps(WithSendBy(ctx, left), inst); err != nil || id != "7" || posts != 1 {
		t.Fatalf("send-by an hour ahead by the monotonic clock, an hour past by the stepped wall clock: %q, %v, %d served; want the request sent", id, err, posts)
	}
}
