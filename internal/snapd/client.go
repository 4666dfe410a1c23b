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
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
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
	socket string
	http   *http.Client
	ua     string
}

// New returns a client for the snapd socket at path (DefaultSocket when
// empty).
func New(path string) *Client {
	if path == "" {
		path = DefaultSocket
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", path)
		},
		MaxIdleConns:        8,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{socket: path, http: &http.Client{Transport: transport}, ua: "snapsvc"}
}

// Socket returns the path of the socket this client dials.
func (c *Client) Socket() string { return c.socket }

// CloseIdleConnections closes connections kept alive for reuse.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// ConnectionError is a failure to reach snapd or to read its answer.
// Written reports whether the whole request had been written before the
// failure: for a POST that means snapd may have acted on it (for instance
// created a change) even though no answer arrived.
type ConnectionError struct {
	Method, Path string
	Written      bool
	Err          error
}

func (e *ConnectionError) Error() string {
	state := "before the request was sent"
	if e.Written {
		state = "after the request was sent"
	}
	return fmt.Sprintf("cannot communicate with snapd (%s %s, %s): %v", e.Method, e.Path, state, e.Err)
}

func (e *ConnectionError) Unwrap() error { return e.Err }

// ResponseError is an answer from snapd that is not a snapd envelope (for
// example a proxy's page, or a body cut short).
type ResponseError struct {
	Method, Path string
	StatusCode   int
	Err          error
}

func (e *ResponseError) Error() string {
	return fmt.Sprintf("cannot decode snapd response to %s %s (HTTP %d): %v", e.Method, e.Path, e.StatusCode, e.Err)
}

func (e *ResponseError) Unwrap() error { return e.Err }

// request is one call to snapd.
type request struct {
	method string
	path   string
	query  url.Values
	body   any
}

// do sends req and decodes the envelope. A "type":"error" envelope comes
// back as *Error; transport failures as *ConnectionError.
func (c *Client) do(ctx context.Context, req request) (*Response, error) {
	var body io.Reader
	if req.body != nil {
		b, err := json.Marshal(req.body)
		if err != nil {
			return nil, fmt.Errorf("cannot encode %s %s request: %w", req.method, req.path, err)
		}
		body = bytes.NewReader(b)
	}
	u := url.URL{Scheme: "http", Host: "localhost", Path: req.path}
	if len(req.query) > 0 {
		u.RawQuery = req.query.Encode()
	}
	written := false
	trace := &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			written = true
		}
	}}
	hreq, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), req.method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("cannot build %s %s request: %w", req.method, req.path, err)
	}
	hreq.Header.Set("User-Agent", c.ua)
	if body != nil {
		hreq.Header.Set("Content-Type", "application/json")
	}
	hrsp, err := c.http.Do(hreq)
	if err != nil {
		// The trace callback runs on the transport's goroutine before Do
		// returns, so reading written here is ordered after it.
		return nil, &ConnectionError{Method: req.method, Path: req.path, Written: written, Err: err}
	}
	defer hrsp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(hrsp.Body, 64<<20))
	if err != nil {
		return nil, &ConnectionError{Method: req.method, Path: req.path, Written: true, Err: err}
	}
	return decode(req.method, req.path, hrsp.StatusCode, data)
}

// Decode parses one envelope as snapd sent it in answer to method path
// with HTTP status. A "type":"error" envelope comes back as *Error.
func Decode(method, path string, status int, body []byte) (*Response, error) {
	return decode(method, path, status, body)
}

// decode parses one envelope.
func decode(method, path string, status int, data []byte) (*Response, error) {
	var rsp Response
	if err := json.Unmarshal(data, &rsp); err != nil || rsp.Type == "" {
		if err == nil {
			err = errors.New("no \"type\" in body")
		}
		return nil, &ResponseError{Method: method, Path: path, StatusCode: status, Err: err}
	}
	rsp.HTTPStatus = status
	if rsp.Type == TypeError {
		return &rsp, rsp.asError(method, path)
	}
	return &rsp, nil
}

// decodeResult unmarshals the envelope's result into v.
func decodeResult(method, path string, rsp *Response, v any) error {
	if err := json.Unmarshal(rsp.Result, v); err != nil {
		return &ResponseError{Method: method, Path: path, StatusCode: rsp.HTTPStatus, Err: fmt.Errorf("result: %w", err)}
	}
	return nil
}
