//go:build realsnapd

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// wire is a minimal raw client for snapd's REST API over a Unix socket; the
// tests use it to set up state and to look at what snapd really sends,
// independently of the code under test.
type wire struct {
	hc *http.Client
}

func newWire(t testing.TB, socket string) *wire {
	t.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &wire{hc: &http.Client{Transport: tr, Timeout: 90 * time.Second}}
}

// response is snapd's envelope, decoded loosely.
type response struct {
	StatusCode int             `json:"status-code"`
	Type       string          `json:"type"`
	Change     string          `json:"change"`
	Result     json.RawMessage `json:"result"`
	Raw        []byte          `json:"-"`
	HTTPStatus int             `json:"-"`
}

// errorResult is the result of an error response.
type errorResult struct {
	Message string          `json:"message"`
	Kind    string          `json:"kind"`
	Value   json.RawMessage `json:"value"`
}

func (w *wire) do(t testing.TB, method, path string, body any) response {
	t.Helper()
	r, err := w.doErr(method, path, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.StatusCode != r.HTTPStatus {
		t.Errorf("%s %s: HTTP %d but status-code %d", method, path, r.HTTPStatus, r.StatusCode)
	}
	return r
}

// doErr sends one request; body is JSON-encoded unless it is a string
// (sent as is, to send malformed JSON).
func (w *wire) doErr(method, path string, body any) (response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			return response{}, err
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequest(method, "http://localhost"+path, rd)
	if err != nil {
		return response{}, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := w.hc.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return response{}, fmt.Errorf("%s %s: reading body: %w", method, path, err)
	}
	var r response
	if err := json.Unmarshal(raw, &r); err != nil {
		return response{}, fmt.Errorf("%s %s: %d, body is not snapd's envelope: %v: %s", method, path, res.StatusCode, err, raw)
	}
	r.Raw = raw
	r.HTTPStatus = res.StatusCode
	return r, nil
}
