package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
)

type snapctlReq struct {
	ContextID string   `json:"context-id"`
	Args      []string `json:"args"`
	Stdin     []byte   `json:"stdin,omitempty"`
}

type snapctlResult struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
}

// snapctl context: a running hook's or a snap's ephemeral one.
type ctlContext struct {
	snap *snapState
	hook *Hook // nil: ephemeral
}

// postSnapctl mirrors daemon/api_snapctl.go runSnapctl plus the bits of
// overlord/hookstate/ctlcmd the fake supports.
//
// uid is the caller's (0 with AllowNonRoot): ctlcmd.Run refuses a caller
// who is not root most commands before it parses them or looks at the
// context.
func (s *Server) postSnapctl(ctx context.Context, body []byte, uid int, stopping <-chan struct{}) *response {
	var req snapctlReq
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&req); err != nil {
		return badRequest("cannot decode snapctl request: %s", err)
	}
	if len(req.Args) == 0 {
		return badRequest("snapctl cannot run without args")
	}
	if !s.cfg.version.snapctlAllowed(uid, req.Args) {
		return snapctlForbidden(req.Args[0], uid)
	}
	prefix := s.cfg.version.snapctlPrefix()
	fail := func(format string, a ...any) *response {
		return badRequest("%s%s", prefix, fmt.Sprintf(format, a...))
	}

	s.mu.Lock()
	var cctx *ctlContext
	if h := s.hooks[req.ContextID]; h != nil && req.ContextID != "" {
		cctx = &ctlContext{snap: s.snaps[h.snap], hook: h}
	} else if req.ContextID != "" {
		for _, ss := range s.snaps {
			if ss.cookie == req.ContextID {
				cctx = &ctlContext{snap: ss}
			}
		}
	}
	unsucc, hasUnsucc := s.unsuccessful[req.Args[0]]
	s.mu.Unlock()

	cmd := req.Args[0]
	if !knownCommand(s.cfg.version, cmd) {
		return fail("Unknown command `%s'. Please specify one command of: %s", cmd, s.cfg.version.unknownCommandList())
	}
	// go-flags rejects bad flags and missing arguments while parsing,
	// before the command's Execute looks at the context (ctlcmd.Run).
	var sargs serviceArgs
	if cmd == "start" || cmd == "stop" || cmd == "restart" {
		var msg string
		if sargs, msg = parseServiceArgs(cmd, req.Args[1:]); msg != "" {
			return fail("%s", msg)
		}
	}
	if cctx == nil || cctx.snap == nil {
		// ctlcmd.MissingContextError
		return fail("cannot invoke snapctl operation commands (here %q) from outside of a snap", cmd)
	}
	if hasUnsucc {
		return &response{status: 200, typ: "error", result: &errorResult{
			Message: fmt.Sprintf("unsuccessful with exit code: %d", unsucc.code), Kind: "unsuccessful",
			Value: map[string]any{"stdout": unsucc.stdout, "stderr": unsucc.stderr, "exit-code": unsucc.code}}}
	}
	args := req.Args[1:]
	switch cmd {
	case "services":
		return s.snapctlServices(cctx, args, fail)
	case "start", "stop", "restart":
		return s.snapctlServiceCmd(ctx, cctx, cmd, sargs, fail, stopping)
	case "get":
		return s.snapctlGet(cctx, args, fail)
	case "set":
		return s.snapctlSet(cctx, args, fail)
	case "refresh":
		return s.snapctlRefresh(cctx, args, fail)
	case "unset":
		s.mu.Lock()
		for _, k := range args {
			configSet(cctx.snap.config, k, nil)
		}
		s.mu.Unlock()
		return syncResp(snapctlResult{})
	}
	return fail("fake snapd does not implement %q", cmd)
}

func knownCommand(v Version, cmd string) bool {
	if cmd == "refresh" {
		return true // hidden: in no go-flags list (ctlcmd/refresh.go cmd.hidden)
	}
	for _, c := range strings.Split(strings.NewReplacer(" or ", ", ").Replace(v.unknownCommandList()), ", ") {
		if c == cmd {
			return true
		}
	}
	return false
}

// resolveServicesLocked mirrors ctlcmd getServiceInfos: names are "<snap>"
// (all services at once, ignoring the names after it) or "<snap>.<app>" of
// the context's own snap, in the order given; anything else is unknown.
func (s *Server) resolveServicesLocked(cctx *ctlContext, names []string) ([]*appState, string) {
	var out []*appState
	seen := map[*appState]bool{}
	for _, n := range names {
		if n == cctx.snap.name {
			return cctx.snap.services(), ""
		}
		appName, ok := strings.CutPrefix(n, cctx.snap.name+".")
		if !ok {
			return nil, n
		}
		a := cctx.snap.apps[appName]
		if a == nil || a.Daemon == "" {
			return nil, n
		}
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out, ""
}

func (s *Server) snapctlServices(cctx *ctlContext, names []string, fail func(string, ...any) *response) *response {
	s.mu.Lock()
	defer s.mu.Unlock()
	apps := cctx.snap.services()
	if len(names) > 0 {
		var bad string
		apps, bad = s.resolveServicesLocked(cctx, names)
		if bad != "" {
			return fail("unknown service: %q", bad)
		}
	}
	apps = append([]*appState(nil), apps...)
	sort.Slice(apps, func(i, j int) bool { return apps[i].Name < apps[j].Name })
	if len(apps) == 0 {
		// ctlcmd/services.go prints nothing, not even the header
		return syncResp(snapctlResult{})
	}
	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 5, 3, 2, ' ', 0)
	fmt.Fprintln(w, "Service\tStartup\tCurrent\tNotes")
	for _, a := range apps {
		startup, current := "disabled", "inactive"
		if a.Enabled {
			startup = "enabled"
		}
		if a.Active {
			current = "active"
		}
		fmt.Fprintf(w, "%s.%s\t%s\t%s\t-\n", a.snap, a.Name, startup, current)
	}
	w.Flush()
	return syncResp(snapctlResult{Stdout: buf.String()})
}

type serviceArgs struct {
	enable, disable, reload bool
	names                   []string
}

// parseServiceArgs parses start/stop/restart arguments as go-flags would.
func parseServiceArgs(cmd string, args []string) (serviceArgs, string) {
	var sa serviceArgs
	for _, a := range args {
		switch {
		case a == "--enable" && cmd == "start":
			sa.enable = true
		case a == "--disable" && cmd == "stop":
			sa.disable = true
		case a == "--reload" && cmd == "restart":
			sa.reload = true
		case strings.HasPrefix(a, "-"):
			return sa, fmt.Sprintf("unknown flag `%s'", strings.TrimLeft(a, "-"))
		default:
			sa.names = append(sa.names, a)
		}
	}
	if len(sa.names) == 0 {
		return sa, "the required argument `<service> (at least 1 argument)` was not provided"
	}
	return sa, ""
}

// snapctlServiceCmd mirrors ctlcmd/helpers.go runServiceCommand/queueCommand.
func (s *Server) snapctlServiceCmd(ctx context.Context, cctx *ctlContext, cmd string, sa serviceArgs, fail func(string, ...any) *response, stopping <-chan struct{}) (rsp *response) {
	enable, disable, reload, names := sa.enable, sa.disable, sa.reload, sa.names
	s.mu.Lock()
	apps, bad := s.resolveServicesLocked(cctx, names)
	if bad != "" {
		s.mu.Unlock()
		return fail("unknown service: %q", bad)
	}
	ignore := ""
	if cctx.hook != nil {
		ignore = cctx.hook.c.id
	}
	if ce := s.conflictLocked([]string{cctx.snap.name}, ignore); ce != nil {
		s.counters.Conflicts++
		s.mu.Unlock()
		return fail("%s", ce.Error())
	}
	ops, _ := buildOps(cmd, enable, disable, reload, apps, names, s.snaps)
	var full []string
	for _, a := range apps {
		full = append(full, a.snap+"."+a.Name)
	}
	// servicestate.Control with CreateExecCommandTasks: "enable" then
	// "start", "disable" then "stop", "reload-or-restart" or "restart";
	// the names in the order getServiceInfos returned them.
	var ctlcmds []string
	switch {
	case enable:
		ctlcmds = []string{"enable", "start"}
	case disable:
		ctlcmds = []string{"disable", "stop"}
	case reload:
		ctlcmds = []string{"reload-or-restart"}
	default:
		ctlcmds = []string{cmd}
	}
	var execSummaries []string
	for _, cc := range ctlcmds {
		execSummaries = append(execSummaries, fmt.Sprintf("%s of %v", cc, full))
	}

	queue := cctx.hook != nil && (cctx.hook.name == "configure" || cctx.hook.name == "default-configure")
	var c *change
	var first []*task // what the first new task waits for
	if queue {
		// queued into the hook's change after every task already in it
		// (queueCommand: ts.WaitFor(t) for each task of the hook's lanes),
		// so they run once the hook and earlier queued commands are done;
		// snapctl returns at once.
		c = cctx.hook.c
		first = append(first, c.tasks...)
	} else {
		c = s.newChangeLocked("service-control", fmt.Sprintf("Running service command for snap %q", cctx.snap.name))
	}
	// snapctl names no change on the wire; the request log does
	// (Request.Made).
	defer func() { rsp.made = c.id }()
	var prev *task
	for _, sum := range execSummaries {
		t := s.newTaskLocked(c, "exec-command", sum)
		t.noUndo = true // cmdstate/cmdmgr.go: AddHandler("exec-command", doExec, nil)
		t.run = func() {
			s.logLocked(t, "INFO", "task ignored")
			s.setTaskStatusLocked(t, StatusDone)
		}
		if prev != nil {
			t.waitFor = []*task{prev}
		} else {
			t.waitFor = first
		}
		prev = t
	}
	for _, op := range ops {
		t := s.addServiceTaskLocked(c, op)
		if prev != nil {
			t.waitFor = []*task{prev}
		}
		prev = t
	}
	s.updateChangeLocked(c)
	s.settleLocked()
	if queue {
		s.mu.Unlock()
		return syncResp(snapctlResult{})
	}
	ready := c.readyCh
	timedOut := make(chan struct{})
	cancel := s.afterLocked(s.cfg.snapctlTimeout, func() {
		// decided under s.mu: a change that is already ready wins, so that
		// driving a ManualClock past both deadlines is deterministic.
		if !statusReady(c.status()) {
			close(timedOut)
		}
	})
	s.mu.Unlock()
	defer cancel()

	select {
	case <-ready:
		// Both may be closed by the time this goroutine runs (a test that
		// drives a ManualClock past the deadline, then the change's end).
		// The timer closes timedOut only while the change is not ready, so
		// a closed timedOut means the deadline came first.
		select {
		case <-timedOut:
			return fail("%s command is taking too long", cmd)
		default:
		}
	case <-timedOut:
		return fail("%s command is taking too long", cmd)
	case <-ctx.Done():
		return errResp(500, "", nil, "request canceled")
	case <-stopping:
		return errResp(500, "", nil, "request canceled")
	case <-s.closeCh:
		return errResp(500, "", nil, "request canceled")
	}
	s.mu.Lock()
	errText := c.errText()
	s.mu.Unlock()
	if errText != "" {
		return fail("%s", errText)
	}
	return syncResp(snapctlResult{})
}

func (s *Server) snapctlGet(cctx *ctlContext, keys []string, fail func(string, ...any) *response) *response {
	if len(keys) == 0 {
		return fail("get which option?")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	format := func(v any) string {
		if str, ok := v.(string); ok {
			return str
		}
		if v == nil {
			return ""
		}
		b, _ := json.MarshalIndent(v, "", "\t")
		return string(b)
	}
	if len(keys) == 1 {
		return syncResp(snapctlResult{Stdout: format(configValue(cctx.snap.config, keys[0])) + "\n"})
	}
	m := map[string]any{}
	for _, k := range keys {
		if v, ok := configGet(cctx.snap.config, k); ok {
			m[k] = v
		}
	}
	b, _ := json.MarshalIndent(m, "", "\t")
	return syncResp(snapctlResult{Stdout: string(b) + "\n"})
}

func (s *Server) snapctlSet(cctx *ctlContext, args []string, fail func(string, ...any) *response) *response {
	vals := map[string]any{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return fail("invalid parameter: %q (want key=value)", a)
		}
		var parsed any
		if err := json.Unmarshal([]byte(v), &parsed); err != nil {
			parsed = v
		}
		vals[k] = parsed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range vals {
		configSet(cctx.snap.config, k, v)
	}
	return syncResp(snapctlResult{})
}

// configValue is the value at key, or nil.
func configValue(doc map[string]any, key string) any {
	v, _ := configGet(doc, key)
	return v
}

// Config returns snap's configuration value for a (dotted) key, as set
// through snapctl set or PUT /v2/snaps/{name}/conf.
func (s *Server) Config(snap, key string) (any, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.snaps[snap]
	if ss == nil {
		return nil, false
	}
	v, ok := configGet(ss.config, key)
	return v, ok
}
