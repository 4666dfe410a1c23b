package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ControlHandler returns an http.Handler serving the fake's test controls
// as JSON, for tools that are not written in Go (fakesnapd serves it on
// its control.socket; a Go program can mount it anywhere). Requests with a
// body take a JSON object; every answer is JSON, errors are
// {"error": "..."} with status 400 (bad input) or 404 (unknown snap,
// service or change).
//
//	GET  /state                      version, sockets, snaps with cookies and services, changes in progress
//	GET  /services?snap=S            services and their state
//	GET  /changes                    every change (the fake's view: ChangeInfo)
//	POST /changes                    {"kind","snap","summary","tasks":[{"kind","summary"}],"with-snap-names","without-snap-names"}: add a held foreign change (ChangeSpec); answers its ChangeInfo
//	POST /changes/ID/finish          finish its held tasks
//	POST /changes/ID/fail            {"message"}: fail its current held task
//	POST /changes/ID/next            finish its current held task only
//	POST /changes/ID/abort           abort it as POST /v2/changes/ID would
//	POST /maintenance                {"kind","message"} (default daemon-restart, "daemon is restarting")
//	DELETE /maintenance
//	POST /restart                    {"down":"2s"}: RestartDaemon; answers once the sockets are back
//	GET  /cookie?snap=S              {"cookie": SNAP_COOKIE}
//	POST /fail-start                 {"snap","app","message"}: make starts fail (message "" clears; omitted: systemctl's usual text)
//	POST /durations                  {"snap","app","start","stop"}: start/stop durations
//	POST /service                    {"snap","app","enabled","active"}: set a service's state
//	POST /store                      {"snap","revision","version","channel","apps":[app as in a snaps file]}: what a refresh finds in the store
//	GET  /hold?snap=S                {"until","level"}: the system hold of S's refreshes ("until" omitted when none)
//	POST /warnings                   {"message"}: add a snapd warning
//	POST /logs                       {"snap","app","message"}: add a line to a service's journal
//	POST /latency                    {"latency":"100ms"}: delay every answer
//	GET  /requests                   the request log (Request)
//	GET  /counters                   Counters
//	GET  /wait?conflicts=N&requests=N&idle=true&timeout=30s   block until at least N conflicts were answered / N requests logged / no change is in progress
func (s *Server) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /state", s.ctlState)
	mux.HandleFunc("GET /services", func(w http.ResponseWriter, r *http.Request) {
		out, err := s.servicesOf(r.URL.Query().Get("snap"))
		ctlReply(w, out, err)
	})
	mux.HandleFunc("GET /changes", func(w http.ResponseWriter, r *http.Request) { ctlReply(w, s.Changes(), nil) })
	mux.HandleFunc("POST /changes", s.ctlAddChange)
	mux.HandleFunc("POST /changes/{id}/{action}", s.ctlChangeAction)
	mux.HandleFunc("POST /maintenance", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Kind, Message string }
		if !ctlDecode(w, r, &req) {
			return
		}
		if req.Kind == "" {
			req.Kind, req.Message = "daemon-restart", "daemon is restarting"
		}
		s.BeginMaintenance(req.Kind, req.Message)
		ctlReply(w, map[string]string{"kind": req.Kind, "message": req.Message}, nil)
	})
	mux.HandleFunc("DELETE /maintenance", func(w http.ResponseWriter, r *http.Request) {
		s.EndMaintenance()
		ctlReply(w, map[string]any{}, nil)
	})
	mux.HandleFunc("POST /restart", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Down string }
		if !ctlDecode(w, r, &req) {
			return
		}
		down := time.Second
		if req.Down != "" {
			d, err := time.ParseDuration(req.Down)
			if err != nil || d < 0 {
				ctlReply(w, nil, badInput("down: %q is not a duration", req.Down))
				return
			}
			down = d
		}
		back := s.RestartDaemon(down)
		select {
		case <-back:
			ctlReply(w, map[string]any{"listening": s.Listening()}, nil)
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("GET /cookie", func(w http.ResponseWriter, r *http.Request) {
		snap := r.URL.Query().Get("snap")
		c := s.Cookie(snap)
		if c == "" {
			ctlReply(w, nil, notFoundErr("no snap %q", snap))
			return
		}
		ctlReply(w, map[string]string{"snap": snap, "cookie": c}, nil)
	})
	mux.HandleFunc("POST /fail-start", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Snap, App string
			Message   *string
		}
		if !ctlDecode(w, r, &req) || !s.ctlService(w, req.Snap, req.App) {
			return
		}
		msg := SystemctlJobFailed(req.Snap, req.App)
		if req.Message != nil {
			msg = *req.Message
		}
		s.SetFailStart(req.Snap, req.App, msg)
		ctlReply(w, map[string]string{"snap": req.Snap, "app": req.App, "fail-start": msg}, nil)
	})
	mux.HandleFunc("POST /durations", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Snap, App, Start, Stop string }
		if !ctlDecode(w, r, &req) || !s.ctlService(w, req.Snap, req.App) {
			return
		}
		var ds [2]time.Duration
		for i, v := range []string{req.Start, req.Stop} {
			if v == "" {
				continue
			}
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				ctlReply(w, nil, badInput("%q is not a duration", v))
				return
			}
			ds[i] = d
		}
		s.SetDurations(req.Snap, req.App, ds[0], ds[1])
		ctlReply(w, map[string]string{"start": ds[0].String(), "stop": ds[1].String()}, nil)
	})
	mux.HandleFunc("POST /service", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Snap, App       string
			Enabled, Active bool
		}
		if !ctlDecode(w, r, &req) || !s.ctlService(w, req.Snap, req.App) {
			return
		}
		s.SetService(req.Snap, req.App, AppState{Enabled: req.Enabled, Active: req.Active})
		st, _ := s.Service(req.Snap, req.App)
		ctlReply(w, st, nil)
	})
	mux.HandleFunc("POST /store", s.ctlStore)
	mux.HandleFunc("GET /hold", func(w http.ResponseWriter, r *http.Request) {
		snap := r.URL.Query().Get("snap")
		if s.Cookie(snap) == "" {
			ctlReply(w, nil, notFoundErr("no snap %q", snap))
			return
		}
		until, level := s.Hold(snap)
		out := map[string]any{"snap": snap}
		if !until.IsZero() {
			out["until"], out["level"] = until, level
		}
		ctlReply(w, out, nil)
	})
	mux.HandleFunc("POST /warnings", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Message string }
		if !ctlDecode(w, r, &req) {
			return
		}
		if req.Message == "" {
			ctlReply(w, nil, badInput("a warning needs a message"))
			return
		}
		s.AddWarning(req.Message)
		ctlReply(w, map[string]string{"message": req.Message}, nil)
	})
	mux.HandleFunc("POST /logs", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Snap, App, Message string }
		if !ctlDecode(w, r, &req) {
			return
		}
		if err := s.AppendLog(req.Snap, req.App, req.Message); err != nil {
			ctlReply(w, nil, notFoundErr("%v", err))
			return
		}
		ctlReply(w, map[string]string{"message": req.Message}, nil)
	})
	mux.HandleFunc("POST /latency", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Latency string }
		if !ctlDecode(w, r, &req) {
			return
		}
		d, err := time.ParseDuration(req.Latency)
		if err != nil || d < 0 {
			ctlReply(w, nil, badInput("latency: %q is not a duration", req.Latency))
			return
		}
		s.SetLatency(d)
		ctlReply(w, map[string]string{"latency": d.String()}, nil)
	})
	mux.HandleFunc("GET /requests", func(w http.ResponseWriter, r *http.Request) { ctlReply(w, s.Requests(), nil) })
	mux.HandleFunc("GET /counters", func(w http.ResponseWriter, r *http.Request) { ctlReply(w, s.Counters(), nil) })
	mux.HandleFunc("GET /wait", s.ctlWait)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		ctlReply(w, nil, notFoundErr("no control endpoint %s %s (see fake.Server.ControlHandler)", r.Method, r.URL.Path))
	})
	return mux
}

// ctlError is an error with the control API status it answers.
type ctlError struct {
	status int
	msg    string
}

func (e *ctlError) Error() string { return e.msg }

func badInput(format string, a ...any) error {
	return &ctlError{http.StatusBadRequest, fmt.Sprintf(format, a...)}
}

func notFoundErr(format string, a ...any) error {
	return &ctlError{http.StatusNotFound, fmt.Sprintf(format, a...)}
}

func ctlReply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		status := http.StatusInternalServerError
		var ce *ctlError
		if errors.As(err, &ce) {
			status = ce.status
		}
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	json.NewEncoder(w).Encode(v)
}

// ctlDecode reads a JSON object body (an empty body is {}), keys matched
// case-insensitively with dashes ignored ("with-snap-names" fills
// WithSnapNames).
func ctlDecode(w http.ResponseWriter, r *http.Request, v any) bool {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(&raw); err != nil && !errors.Is(err, io.EOF) {
		ctlReply(w, nil, badInput("request body is not a JSON object: %v", err))
		return false
	}
	norm := map[string]json.RawMessage{}
	for k, val := range raw {
		norm[strings.ReplaceAll(k, "-", "")] = val
	}
	b, _ := json.Marshal(norm)
	d := json.NewDecoder(strings.NewReader(string(b)))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		ctlReply(w, nil, badInput("bad request body: %v", err))
		return false
	}
	return true
}

// ctlService checks that snap.app is a service of the fake.
func (s *Server) ctlService(w http.ResponseWriter, snap, app string) bool {
	if _, ok := s.Service(snap, app); !ok {
		ctlReply(w, nil, notFoundErr("no service %s.%s", snap, app))
		return false
	}
	return true
}

// ServiceInfo is a service's state in the control API.
type ServiceInfo struct {
	Snap    string `json:"snap"`
	Name    string `json:"name"`
	Daemon  string `json:"daemon"`
	Enabled bool   `json:"enabled"`
	Active  bool   `json:"active"`
}

func (s *Server) servicesOf(snap string) ([]ServiceInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for n := range s.snaps {
		if snap == "" || n == snap {
			names = append(names, n)
		}
	}
	if len(names) == 0 && snap != "" {
		return nil, notFoundErr("no snap %q", snap)
	}
	sort.Strings(names)
	out := []ServiceInfo{}
	for _, n := range names {
		for _, a := range s.snaps[n].services() {
			out = append(out, ServiceInfo{Snap: n, Name: a.Name, Daemon: a.Daemon, Enabled: a.Enabled, Active: a.Active})
		}
	}
	return out, nil
}

func (s *Server) ctlState(w http.ResponseWriter, r *http.Request) {
	type snapInfo struct {
		Name     string        `json:"name"`
		Cookie   string        `json:"cookie"`
		Services []ServiceInfo `json:"services"`
	}
	svcs, _ := s.servicesOf("")
	s.mu.Lock()
	var names []string
	for n := range s.snaps {
		names = append(names, n)
	}
	sort.Strings(names)
	var snaps []snapInfo
	for _, n := range names {
		si := snapInfo{Name: n, Cookie: s.snaps[n].cookie, Services: []ServiceInfo{}}
		for _, sv := range svcs {
			if sv.Snap == n {
				si.Services = append(si.Services, sv)
			}
		}
		snaps = append(snaps, si)
	}
	var busy []ChangeInfo
	for _, c := range s.changes {
		if !statusReady(c.status()) {
			busy = append(busy, s.infoLocked(c))
		}
	}
	var maint any
	if s.maint != nil {
		maint = s.maint
	}
	s.mu.Unlock()
	ctlReply(w, map[string]any{
		"version": s.Version(), "socket": s.SocketPath(), "snap-socket": s.SnapSocketPath(),
		"listening": s.Listening(), "maintenance": maint, "snaps": snaps, "in-progress": busy,
	}, nil)
}

func (s *Server) ctlAddChange(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Kind, Snap, Summary string
		Tasks               []struct{ Kind, Summary string }
		WithSnapNames       bool
		WithoutSnapNames    bool
	}
	if !ctlDecode(w, r, &req) {
		return
	}
	if req.Kind == "" {
		ctlReply(w, nil, badInput("a change needs a kind (e.g. configure-snap, auto-refresh)"))
		return
	}
	if req.Snap != "" && s.Cookie(req.Snap) == "" {
		ctlReply(w, nil, notFoundErr("no snap %q", req.Snap))
		return
	}
	spec := ChangeSpec{Kind: req.Kind, Snap: req.Snap, Summary: req.Summary, WithSnapNames: req.WithSnapNames, WithoutSnapNames: req.WithoutSnapNames}
	for _, t := range req.Tasks {
		if t.Kind == "" || t.Summary == "" {
			ctlReply(w, nil, badInput("every task needs a kind and a summary"))
			return
		}
		spec.Tasks = append(spec.Tasks, TaskSpec{Kind: t.Kind, Summary: t.Summary})
	}
	c := s.AddChange(spec)
	ctlReply(w, c.Info(), nil)
}

func (s *Server) ctlChangeAction(w http.ResponseWriter, r *http.Request) {
	id, action := r.PathValue("id"), r.PathValue("action")
	c := s.Change(id)
	if c == nil {
		ctlReply(w, nil, notFoundErr("no change %q", id))
		return
	}
	switch action {
	case "finish":
		c.Finish()
	case "next":
		c.Next()
	case "abort":
		c.Abort()
	case "fail":
		var req struct{ Message string }
		if !ctlDecode(w, r, &req) {
			return
		}
		if req.Message == "" {
			req.Message = "failed by fakesnapd ctl"
		}
		c.Fail(req.Message)
	default:
		ctlReply(w, nil, notFoundErr("no change action %q (finish, fail, next, abort)", action))
		return
	}
	ctlReply(w, c.Info(), nil)
}

func (s *Server) ctlWait(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	atoi := func(k string) (int, bool) {
		if q.Get(k) == "" {
			return 0, true
		}
		n, err := strconv.Atoi(q.Get(k))
		if err != nil || n < 0 {
			ctlReply(w, nil, badInput("%s: %q is not a count", k, q.Get(k)))
			return 0, false
		}
		return n, true
	}
	conflicts, ok1 := atoi("conflicts")
	requests, ok2 := atoi("requests")
	if !ok1 || !ok2 {
		return
	}
	idle := q.Get("idle") == "true"
	timeout := 30 * time.Second
	if v := q.Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			ctlReply(w, nil, badInput("timeout: %q is not a duration", v))
			return
		}
		timeout = d
	}
	// the control API runs on real time, whatever the fake's clock
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	err := s.WaitFor(ctx, func(v View) bool {
		return v.Conflicts() >= conflicts && v.Requests() >= requests && (!idle || len(v.InProgress()) == 0)
	})
	if err != nil {
		ctlReply(w, nil, &ctlError{http.StatusRequestTimeout, fmt.Sprintf("not reached within %s: %v", timeout, err)})
		return
	}
	ctlReply(w, s.Counters(), nil)
}

// ctlStore serves POST /store: SetStoreRevision, the apps given as in a
// snaps file (durations, fail-start, dies-after-start).
func (s *Server) ctlStore(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Snap, Revision, Version, Channel string
		Apps                             json.RawMessage
	}
	if !ctlDecode(w, r, &req) {
		return
	}
	if s.Cookie(req.Snap) == "" {
		ctlReply(w, nil, notFoundErr("no snap %q", req.Snap))
		return
	}
	rev := StoreRevision{Revision: req.Revision, Version: req.Version, Channel: req.Channel}
	if len(req.Apps) > 0 && string(req.Apps) != "null" {
		doc, _ := json.Marshal(map[string]any{"snaps": []any{map[string]any{"name": req.Snap, "apps": req.Apps}}})
		sns, err := ParseSnaps(doc)
		if err != nil {
			ctlReply(w, nil, badInput("apps: %v", err))
			return
		}
		rev.Apps = sns[0].Apps
		if rev.Apps == nil {
			rev.Apps = []App{}
		}
	}
	if err := s.SetStoreRevision(req.Snap, rev); err != nil {
		ctlReply(w, nil, badInput("%v", err))
		return
	}
	ctlReply(w, map[string]string{"snap": req.Snap, "revision": rev.Revision, "channel": channelKey(rev.Channel)}, nil)
}
