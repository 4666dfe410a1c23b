package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// proxy sits between the CLI and the fake snapd and records every request
// as it arrives and as its answer leaves, so scripts can wait for "the CLI
// is now long-polling" or "the CLI has read the changes" instead of
// sleeping.
type proxy struct {
	dir  string
	path string
	ln   net.Listener
	srv  *http.Server
	tr   *http.Transport

	mu      sync.Mutex
	events  []proxyEvent
	changed chan struct{}
}

// proxyEvent is one request seen by the proxy: Phase "request" when it
// arrived, "response" once its answer was written back.
type proxyEvent struct {
	Phase, Method, Path, Query string
	Status                     int
}

func startProxy(target string) (*proxy, error) {
	// A short directory of its own: socket paths are limited to 108 bytes,
	// and the CLI's lock directory is derived from the socket's.
	dir, err := os.MkdirTemp("", "snapsvc-proxy")
	if err != nil {
		return nil, err
	}
	p := &proxy{dir: dir, path: filepath.Join(dir, "snapd.socket"), changed: make(chan struct{})}
	p.ln, err = net.Listen("unix", p.path)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.tr = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", target)
	}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme = "http"
			r.Out.URL.Host = "localhost"
		},
		Transport: p.tr,
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.record(proxyEvent{Phase: "request", Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery})
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		rp.ServeHTTP(sw, r)
		p.record(proxyEvent{Phase: "response", Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Status: sw.status})
	})}
	go p.srv.Serve(p.ln)
	return p, nil
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (p *proxy) record(ev proxyEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.events = append(p.events, ev)
	close(p.changed)
	p.changed = make(chan struct{})
}

// await blocks until n events match, or ctx ends.
func (p *proxy) await(ctx context.Context, n int, match func(proxyEvent) bool) error {
	for {
		p.mu.Lock()
		count := 0
		for _, ev := range p.events {
			if match(ev) {
				count++
			}
		}
		ch := p.changed
		p.mu.Unlock()
		if count >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// summary lists the events, for failure messages.
func (p *proxy) summary() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, ev := range p.events {
		b.WriteString(ev.Phase + " " + ev.Method + " " + ev.Path + "?" + ev.Query + "\n")
	}
	return b.String()
}

func (p *proxy) Close() {
	p.srv.Close()
	p.tr.CloseIdleConnections()
	os.RemoveAll(p.dir)
}
