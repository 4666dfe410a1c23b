// Package snapd is snapsvc's wire client for snapd's REST API over its Unix
// sockets. It knows the envelope, the endpoints and the error shapes, and
// nothing about retrying, locking or waiting: those live in the retry and
// snapsvc packages.
//
// Every method takes a context.Context and is safe for concurrent use.
package snapd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"sync/atomic"
	"time"
)

// Default socket paths, as snapd's dirs package names them
// (dirs/dirs.go: SnapdSocket, SnapSocket).
const (
	// DefaultSocket is snapd's main socket: /v2/apps and everything else.
	DefaultSocket = "/run/snapd.socket"
	// DefaultSnapSocket is the socket snaps reach; it serves /v2/snapctl.
	DefaultSnapSocket = "/run/snapd-snap.socket"
)

// Client talks to one snapd socket. The zero value is not usable; build one
// with New.
type Client struct {
	socket        string
	dial          func(ctx context.Context) (net.Conn, error) // the socket's dialler (tests replace it)
	http          *http.Client
	ua            string
	longPollGrace time.Duration
	installRoot   string // CheckInstalled (installed.go)
	servedOnly    bool   // CheckServed (installed.go)
	closed        atomic.Bool
}

// New returns a client for the snapd socket at path (DefaultSocket when
// empty).
func New(path string) *Client {
	if path == "" {
		path = DefaultSocket
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	c := &Client{socket: path, ua: "snapsvc", longPollGrace: LongPollGrace}
	c.dial = func(ctx context.Context) (net.Conn, error) { return dialer.DialContext(ctx, "unix", path) }
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			conn, err := c.dial(ctx)
			if err != nil {
				return nil, err
			}
			return &countingConn{Conn: conn}, nil
		},
		MaxIdleConns:        8,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}
	c.http = &http.Client{Transport: transport}
	return c
}

// Socket returns the path of the socket this client dials.
func (c *Client) Socket() string { return c.socket }

// CloseIdleConnections closes connections kept alive for reuse.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Close closes the connections kept alive for reuse, and from now on
// keeps none: a request still in flight, or made later, closes its
// connection when it is done, so no connection (nor its goroutines)
// outlives Close. The Client stays usable.
func (c *Client) Close() {
	c.closed.Store(true)
	c.http.CloseIdleConnections()
}

// ConnectionError is a failure to reach snapd or to read its answer.
// Written reports whether the whole request had been written before the
// failure: for a POST that means snapd may have acted on it (for instance
// created a change) even though no answer arrived. Connected is false when
// no connection was made at all (no socket, nobody listening, not a
// socket): snapd certainly did nothing and cannot have been loaded by the
// attempt.
type ConnectionError struct {
	Socket       string
	Method, Path string
	Written      bool
	Connected    bool
	Err          error
}

func (e *ConnectionError) Error() string {
	state := "before the request was sent"
	switch {
	case e.Written:
		state = "after the request was sent"
	case !e.Connected:
		state = "cannot connect"
	}
	where := ""
	if e.Socket != "" {
		where = " at " + e.Socket
	}
	return fmt.Sprintf("cannot communicate with snapd%s (%s %s, %s): %v", where, e.Method, e.Path, state, e.Err)
}

func (e *ConnectionError) Unwrap() error { return e.Err }

// withCause returns err, a request's failure, so that it matches the
// cause of ctx when ctx has ended: a caller's bound (snapsvc's ErrGaveUp,
// the policy's time) is set as the cause of a context, and net/http
// reports only ctx.Err() before Go 1.23, the cause from then on.
func withCause(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	cause := context.Cause(ctx)
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w: %w", cause, err)
}

// ResponseError is an answer from snapd that is not a snapd envelope (for
// example a proxy's page, a body cut short, or one larger than snapd ever
// sends).
type ResponseError struct {
	Method, Path string
	StatusCode   int
	Err          error
}

func (e *ResponseError) Error() string {
	return fmt.Sprintf("cannot decode snapd response to %s %s (HTTP %d): %v", e.Method, e.Path, e.StatusCode, e.Err)
}

func (e *ResponseError) Unwrap() error { return e.Err }

// Bounds on what is read of one answer, so a broken peer cannot make the
// client buffer without limit. The largest answer snapd sends is a change
// listing: it keeps at most 500 ready changes between prunings every 10
// minutes (overlord/overlord.go pruneMaxChanges, pruneInterval) plus those
// in progress, each a few KB and at most ~60 KB for a large install or
// refresh (tasks keep their last 10 log lines, overlord/state/task.go), so
// 32 MiB leaves a wide margin. Every other answer (one change, apps,
// notices filtered by key or time, snapctl output, system-info) is far
// below 4 MiB.
const (
	MaxListBody = 32 << 20
	MaxBody     = 4 << 20
)

// ErrTooLarge is the cause of a ResponseError for an answer over the
// bound of its request.
var ErrTooLarge = errors.New("answer larger than snapd ever sends")

// request is one call to snapd.
type request struct {
	method  string
	path    string
	query   url.Values
	body    any
	maxBody int64 // 0: MaxBody
	// upload, when set, is the body instead of body's JSON: each call
	// opens it afresh (net/http may send a request again), with its
	// content type and length (snaps.go).
	upload func() (*uploadBody, error)
}

// do sends req and decodes the envelope. A "type":"error" envelope comes
// back as *Error; transport failures as *ConnectionError.
func (c *Client) do(ctx context.Context, req request) (*Response, error) {
	// After Close, drop the connection this request returned to the pool
	// (this runs after the body is closed).
	defer func() {
		if c.closed.Load() {
			c.http.CloseIdleConnections()
		}
	}()
	var body io.Reader
	if req.body != nil {
		b, err := json.Marshal(req.body)
		if err != nil {
			return nil, fmt.Errorf("cannot encode %s %s request: %w", req.method, req.path, err)
		}
		body = bytes.NewReader(b)
	}
	var up *uploadBody
	if req.upload != nil {
		var err error
		if up, err = req.upload(); err != nil {
			return nil, err
		}
		body = up
	}
	u := url.URL{Scheme: "http", Host: "localhost", Path: req.path}
	if len(req.query) > 0 {
		u.RawQuery = req.query.Encode()
	}
	// net/http may send a request more than once: a request that failed
	// on a kept-alive connection before any byte reached the peer (the
	// peer closed it while idle, as snapd does when it stops) is sent
	// again on a new connection. Only the last attempt's facts say what
	// happened to the request, so each attempt starts afresh (GetConn
	// begins every attempt), and "written" is judged by the attempt's own
	// connection: the transport reports the request written once it is
	// in its buffer, before the flush that may fail.
	var at attempt
	sendBy, _ := ctx.Value(sendByKey{}).(time.Time)
	var conns []*countingConn // given sendBy, to clear once done
	defer func() {
		for _, cc := range conns {
			cc.sendBy.Store(nil)
		}
	}()
	trace := &httptrace.ClientTrace{
		GetConn: func(string) { at = attempt{} },
		GotConn: func(info httptrace.GotConnInfo) {
			at.connected = true
			if cc, ok := info.Conn.(*countingConn); ok {
				at.conn, at.base, at.failBase, at.refusedBase = cc, cc.written.Load(), cc.failed.Load(), cc.refused.Load()
				if !sendBy.IsZero() {
					cc.sendBy.Store(&sendBy)
					conns = append(conns, cc)
				}
			}
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) { at.wrote = info.Err == nil },
	}
	hreq, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), req.method, u.String(), body)
	if err != nil {
		if up != nil {
			up.Close()
		}
		return nil, fmt.Errorf("cannot build %s %s request: %w", req.method, req.path, err)
	}
	hreq.Header.Set("User-Agent", c.ua)
	switch {
	case up != nil:
		hreq.Header.Set("Content-Type", up.contentType)
		hreq.ContentLength = up.length
		hreq.GetBody = func() (io.ReadCloser, error) { return req.upload() }
	case body != nil:
		hreq.Header.Set("Content-Type", "application/json")
	}
	hrsp, err := c.http.Do(hreq)
	if err != nil {
		// The trace callbacks run on the transport's goroutines before Do
		// returns, so reading them here is ordered after them.
		if !at.connected {
			err = c.explainDial(err)
		}
		if at.conn != nil && at.conn.refused.Load() > at.refusedBase {
			err = fmt.Errorf("%w: %w", ErrSendDeadline, err)
		}
		return nil, &ConnectionError{Socket: c.socket, Method: req.method, Path: req.path, Written: at.written(), Connected: at.connected, Err: withCause(ctx, err)}
	}
	defer hrsp.Body.Close()
	limit := req.maxBody
	if limit <= 0 {
		limit = MaxBody
	}
	lr := &limitedReader{r: hrsp.Body, left: limit}
	var rsp Response
	derr := json.NewDecoder(lr).Decode(&rsp)
	switch {
	case lr.over:
		return nil, &ResponseError{Method: req.method, Path: req.path, StatusCode: hrsp.StatusCode, Err: fmt.Errorf("%w (more than %d bytes)", ErrTooLarge, limit)}
	case lr.err != nil:
		// The body was cut short: the answer was lost on the way.
		return nil, &ConnectionError{Socket: c.socket, Method: req.method, Path: req.path, Written: true, Connected: true, Err: withCause(ctx, lr.err)}
	case derr != nil && errors.Is(derr, io.ErrUnexpectedEOF):
		return nil, &ConnectionError{Socket: c.socket, Method: req.method, Path: req.path, Written: true, Connected: true, Err: withCause(ctx, derr)}
	}
	// Let the connection be reused: drain what a well-formed answer may
	// still have after its JSON value (a newline), within reason.
	_, _ = io.Copy(io.Discard, io.LimitReader(hrsp.Body, 4<<10))
	return envelope(req.method, req.path, hrsp.StatusCode, &rsp, derr)
}

// attempt is what one attempt of a request (net/http may make several)
// did on its connection.
type attempt struct {
	connected   bool          // a connection was had
	conn        *countingConn // that connection (nil: not one of ours)
	base        int64         // its byte count when the attempt got it
	failBase    int64         // its failed writes then
	refusedBase int64         // its writes refused past a send-by time then
	wrote       bool          // the transport wrote the whole request to its buffer
}

// written reports whether the whole request reached the connection: the
// transport wrote it, and the connection took bytes during the attempt
// without a write failing (a request cut short is discarded by snapd's
// HTTP server, which acts on whole requests only).
func (a attempt) written() bool {
	if !a.wrote {
		return false
	}
	if a.conn == nil {
		return true // a wrapped transport's connection: trust the transport
	}
	return a.conn.written.Load() > a.base && a.conn.failed.Load() == a.failBase
}

// countingConn counts the bytes written to a connection and whether a
// write failed, so an attempt can tell what reached snapd; and it refuses
// to write once the send-by time of the request it carries has passed.
type countingConn struct {
	net.Conn
	written atomic.Int64
	failed  atomic.Int64 // writes that failed
	refused atomic.Int64 // writes refused past the send-by time
	// sendBy is the send-by of the request the connection carries (nil:
	// none; WithSendBy). It is the time.Time the caller gave, monotonic
	// reading and all, and is compared with time.Now(): when both carry a
	// monotonic reading (any time from time.Now, and what Add makes of
	// it) the comparison is of monotonic time, so a step of the machine's
	// wall clock (NTP, an operator's date) between the fence and the write
	// neither lets a request out after its confirmation ran out nor holds
	// one back (issue 41: the check compared Unix nanoseconds, and a
	// backward step let a late request through).
	sendBy atomic.Pointer[time.Time]
}

func (c *countingConn) Write(p []byte) (int, error) {
	if by := c.sendBy.Load(); by != nil && time.Now().After(*by) {
		c.refused.Add(1)
		c.failed.Add(1)
		return 0, &net.OpError{Op: "write", Net: "unix", Err: ErrSendDeadline}
	}
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	if err != nil {
		c.failed.Add(1)
	}
	return n, err
}

// ErrSendDeadline is the cause of a *ConnectionError for a request that was
// not sent because its send-by time (WithSendBy) had passed when its first
// byte was due: snapd saw nothing of it.
var ErrSendDeadline = errors.New("not sent: its send-by time had passed")

type sendByKey struct{}

// WithSendBy returns a context under which a request is written to snapd
// only before t: the check is made by the connection itself, right before
// the request's first byte is written, the last moment the client can
// hold a request back. Past t the request fails, unsent, with
// ErrSendDeadline. A restart budget's fence sets it (the time its
// confirmation stands), so a request is never sent on a confirmation that
// has run out, however long the client was held up between the fence and
// the write. Give a time derived from time.Now (as Add keeps its monotonic
// reading): the check is then made on the monotonic clock, which no step
// of the wall clock moves; a time without one (parsed, or stripped by
// Round(0)) is compared by the wall clock.
func WithSendBy(ctx context.Context, t time.Time) context.Context {
	return context.WithValue(ctx, sendByKey{}, t)
}

// limitedReader reads at most left bytes and records whether the body
// was longer, and the underlying read error (other than io.EOF).
type limitedReader struct {
	r    io.Reader
	left int64
	over bool
	err  error
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One more byte tells a body of exactly the limit from a longer one.
		var one [1]byte
		if n, _ := l.r.Read(one[:]); n > 0 {
			l.over = true
			return 0, ErrTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if err != nil && err != io.EOF {
		l.err = err
	}
	return n, err
}

// explainDial says why the socket could not be dialled when the reason is
// in the file system: no such file, a file that is not a socket (which
// connect reports as "connection refused"), or no permission to reach it.
// A path that is not a socket and a refused permission are *SocketError:
// waiting cannot change them.
func (c *Client) explainDial(err error) error {
	fi, serr := os.Stat(c.socket)
	switch {
	case errors.Is(serr, fs.ErrNotExist):
		if nerr := c.notInstalled(err); nerr != nil {
			return nerr
		}
		return fmt.Errorf("socket %s does not exist (is snapd running?): %w", c.socket, err)
	case errors.Is(serr, fs.ErrPermission) || errors.Is(err, fs.ErrPermission):
		// connect(2) answers EACCES without write permission on the
		// socket or search permission on a directory above it (or an
		// AppArmor denial, for a snap without snapd-control).
		return &SocketError{Socket: c.socket, Problem: "cannot be connected to: permission denied", Denied: true, Err: err}
	case serr != nil:
		return err
	case fi.IsDir():
		return &SocketError{Socket: c.socket, Problem: "is a directory, not a socket", Err: err}
	case fi.Mode()&fs.ModeSocket == 0:
		return &SocketError{Socket: c.socket, Problem: "is not a socket (" + fileKind(fi.Mode()) + ")", Err: err}
	}
	return err
}

// ErrNotSocket matches, with errors.Is, a dial of a path that exists but
// is not a socket (a directory, a regular file): a mistyped path, which
// no restart of snapd changes.
var ErrNotSocket = errors.New("not a socket")

// SocketError is a socket that cannot be dialled for a reason waiting
// cannot change: the path is not a socket (it matches ErrNotSocket), or
// this process may not connect to it (it matches fs.ErrPermission).
type SocketError struct {
	// Socket is the path dialled.
	Socket string
	// Problem says what is wrong, after the path: "is a directory, not a
	// socket", "is not a socket (a regular file)", "cannot be connected
	// to: permission denied".
	Problem string
	// Denied: connect(2) was refused permission (EACCES), rather than the
	// path not being a socket.
	Denied bool
	// Err is the dial error.
	Err error
}

func (e *SocketError) Error() string { return e.Socket + " " + e.Problem }

// Unwrap returns the dial error.
func (e *SocketError) Unwrap() error { return e.Err }

// Is matches ErrNotSocket for a path that is not a socket, and
// fs.ErrPermission for a refused permission.
func (e *SocketError) Is(target error) bool {
	if e.Denied {
		return target == fs.ErrPermission
	}
	return target == ErrNotSocket
}

func fileKind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}

// Decode parses one envelope as snapd sent it in answer to method path
// with HTTP status. A "type":"error" envelope comes back as *Error.
func Decode(method, path string, status int, body []byte) (*Response, error) {
	var rsp Response
	return envelope(method, path, status, &rsp, json.Unmarshal(body, &rsp))
}

// envelope checks a decoded envelope (err is the decoding error).
func envelope(method, path string, status int, rsp *Response, err error) (*Response, error) {
	if err != nil || rsp.Type == "" {
		if err == nil {
			err = errors.New("no \"type\" in body")
		}
		return nil, &ResponseError{Method: method, Path: path, StatusCode: status, Err: err}
	}
	rsp.HTTPStatus = status
	if rsp.Type == TypeError {
		err := rsp.asError(method, path)
		var apiErr *Error
		if !errors.As(err, &apiErr) {
			return nil, err // an error envelope whose result is not snapd's shape
		}
		return rsp, err
	}
	return rsp, nil
}

// decodeResult unmarshals the envelope's result into v.
func decodeResult(method, path string, rsp *Response, v any) error {
	if err := json.Unmarshal(rsp.Result, v); err != nil {
		return &ResponseError{Method: method, Path: path, StatusCode: rsp.HTTPStatus, Err: fmt.Errorf("result: %w", err)}
	}
	return nil
}
