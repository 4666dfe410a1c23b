package fake_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

type env struct {
	Type        string          `json:"type"`
	StatusCode  int             `json:"status-code"`
	Status      string          `json:"status"`
	Result      json.RawMessage `json:"result"`
	Change      string          `json:"change"`
	Maintenance json.RawMessage `json:"maintenance"`
}

type errRes struct {
	Message string          `json:"message"`
	Kind    string          `json:"kind"`
	Value   json.RawMessage `json:"value"`
}

func client(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

func call(t testing.TB, sock, method, path, body string) (int, env) {
	t.Helper()
	code, e, err := callErr(sock, method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return code, e
}

func callErr(sock, method, path, body string) (int, env, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, "http://localhost"+path, rd)
	rsp, err := client(sock).Do(req)
	if err != nil {
		return 0, env{}, err
	}
	defer rsp.Body.Close()
	b, _ := io.ReadAll(rsp.Body)
	var e env
	if err := json.Unmarshal(b, &e); err != nil {
		return rsp.StatusCode, e, err
	}
	return rsp.StatusCode, e, nil
}

func errOf(t testing.TB, e env) errRes {
	t.Helper()
	var r errRes
	if err := json.Unmarshal(e.Result, &r); err != nil {
		t.Fatalf("bad error result %s: %v", e.Result, err)
	}
	return r
}

func decode(t testing.TB, raw json.RawMessage, v any) {
	t.Helper()
	if err := json.NewDecoder(bytes.NewReader(raw)).Decode(v); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
}

func bufioReader(rsp *http.Response) *bufio.Reader { return bufio.NewReader(rsp.Body) }
