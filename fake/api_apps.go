package fake

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// appsForLocked mirrors daemon/api_apps.go appInfosFor: a requested snap
// without apps of the wanted kind is reported first ("snap %q has no
// services"/"apps"); then the first requested name not found (snapd walks a
// map, so with several unknown names which one it reports varies; the fake
// takes the first in request order): a bare snap name gives snap-not-found,
// a "snap.app" name app-not-found even when the snap itself is unknown.
func (s *Server) appsForLocked(names []string, serviceOnly bool) ([]*appState, *response) {
	kind := "app"
	if serviceOnly {
		kind = "service"
	}
	requested := map[string]bool{}
	snapNames := map[string]bool{}
	for _, n := range names {
		requested[n] = true
		sn, _, _ := strings.Cut(n, ".")
		snapNames[sn] = true
	}
	var snapList []string
	for n := range s.snaps {
		if len(names) == 0 || snapNames[n] {
			snapList = append(snapList, n)
		}
	}
	sort.Strings(snapList)
	found := map[string]bool{}
	var out []*appState
	for _, sn := range snapList {
		ss := s.snaps[sn]
		var apps []*appState
		for _, a := range ss.apps {
			if !serviceOnly || a.Daemon != "" {
				apps = append(apps, a)
			}
		}
		if len(apps) == 0 && requested[sn] {
			return nil, errResp(404, "app-not-found", nil, "snap %q has no %ss", sn, kind)
		}
		all := len(requested) == 0 || requested[sn]
		if all {
			found[sn] = true
		}
		for _, a := range apps {
			if all || requested[sn+"."+a.Name] {
				out = append(out, a)
				found[sn+"."+a.Name] = true
			}
		}
	}
	for _, n := range names {
		if found[n] {
			continue
		}
		if snapNames[n] {
			return nil, errResp(404, "snap-not-found", n, "snap %q not found", n)
		}
		sn, app, _ := strings.Cut(n, ".")
		return nil, errResp(404, "app-not-found", nil, "snap %q has no %s %q", sn, kind, app)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].snap != out[j].snap {
			return out[i].snap < out[j].snap
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// appJSON mirrors client.AppInfo: everything but name is omitempty, so a
// disabled inactive service has no "enabled"/"active" keys.
type appJSON struct {
	Snap        string `json:"snap,omitempty"`
	Name        string `json:"name"`
	Daemon      string `json:"daemon,omitempty"`
	DaemonScope string `json:"daemon-scope,omitempty"`
	Enabled     bool   `json:"enabled,omitempty"`
	Active      bool   `json:"active,omitempty"`
}

func appToJSON(a *appState) appJSON {
	j := appJSON{Snap: a.snap, Name: a.Name}
	if a.Daemon != "" {
		j.Daemon, j.DaemonScope, j.Enabled, j.Active = a.Daemon, a.DaemonScope, a.Enabled, a.Active
	}
	return j
}

func (s *Server) getApps(r *http.Request) *response {
	q := r.URL.Query()
	sel := q.Get("select")
	if sel != "" && sel != "service" {
		return badRequest("invalid select parameter: %q", sel)
	}
	// "global" came with 2.63 (daemon/api_apps.go readMaybeBoolValue)
	if g := q.Get("global"); g != "" && s.cfg.version.atLeast("2.63") {
		if _, err := strconv.ParseBool(g); err != nil {
			return badRequest("invalid global parameter: %q", g)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// only the first "names" value counts (query.Get + CommaSeparatedList)
	apps, rsp := s.appsForLocked(commaList([]string{q.Get("names")}), sel == "service")
	if rsp != nil {
		return rsp
	}
	out := []appJSON{}
	for _, a := range apps {
		out = append(out, appToJSON(a))
	}
	return syncResp(out)
}

type instruction struct {
	Action  string        `json:"action"`
	Names   []string      `json:"names"`
	Enable  bool          `json:"enable"`
	Disable bool          `json:"disable"`
	Reload  bool          `json:"reload"`
	Scope   scopeSelector `json:"scope"`
	Users   userSelector  `json:"users"`
}

// scopeSelector and userSelector decode like client.ScopeSelector and
// client.UserSelector (client/apps.go), whose errors make POST /v2/apps
// answer "cannot decode request body into service operation: ...".
type scopeSelector []string

func (ss *scopeSelector) UnmarshalJSON(b []byte) error {
	var scopes []string
	if err := json.Unmarshal(b, &scopes); err != nil {
		return errors.New("cannot unmarshal, expected a list of strings")
	}
	if len(scopes) > 2 {
		return fmt.Errorf("unexpected number of scopes: %v", scopes)
	}
	for _, sc := range scopes {
		if sc != "system" && sc != "user" {
			return errors.New(`cannot unmarshal, expected one of: "system", "user"`)
		}
	}
	*ss = scopes
	return nil
}

type userSelector struct{}

func (*userSelector) UnmarshalJSON(b []byte) error {
	var users []string
	if err := json.Unmarshal(b, &users); err == nil {
		return nil
	}
	var kw string
	if err := json.Unmarshal(b, &kw); err != nil {
		return errors.New("cannot unmarshal, expected a string or a list of strings")
	}
	if kw != "self" && kw != "all" {
		return errors.New(`cannot unmarshal, expected one of: "self", "all"`)
	}
	return nil
}

// buildOps groups services per snap, sorted by snap name (servicestate
// serviceControlTs); names "snap.app" are explicit.
func buildOps(action string, enable, disable, reload bool, apps []*appState, names []string, snaps map[string]*snapState) ([]svcOp, string) {
	switch action {
	case "start", "stop", "restart":
	default:
		return nil, action
	}
	explicit := map[string]bool{}
	for _, n := range names {
		if strings.Contains(n, ".") {
			explicit[n] = true
		}
	}
	by := map[string]*svcOp{}
	var order []string
	for _, a := range apps {
		op := by[a.snap]
		if op == nil {
			op = &svcOp{snap: snaps[a.snap], action: action}
			switch {
			case action == "start" && enable:
				op.modifier = "enable"
			case action == "stop" && disable:
				op.modifier = "disable"
			case action == "restart" && reload:
				op.action = "reload-or-restart"
			}
			by[a.snap] = op
			order = append(order, a.snap)
		}
		op.services = append(op.services, a)
		if explicit[a.snap+"."+a.Name] {
			op.explicit = append(op.explicit, a)
		}
	}
	sort.Strings(order)
	var out []svcOp
	for _, n := range order {
		op := *by[n]
		// serviceControlTs sorts each snap's services and explicit services
		byName := func(l []*appState) {
			sort.Slice(l, func(i, j int) bool { return l[i].Name < l[j].Name })
		}
		byName(op.services)
		byName(op.explicit)
		out = append(out, op)
	}
	return out, ""
}

func (s *Server) conflictResponseLocked(ce *conflictErr, as409 bool) *response {
	s.counters.Conflicts++
	if as409 {
		v := map[string]string{}
		if ce.changeKind != "" {
			v["change-kind"] = ce.changeKind
		}
		if ce.snap != "" {
			v["snap-name"] = ce.snap
		}
		return errResp(409, "snap-change-conflict", v, "%s", ce.Error())
	}
	// daemon/api_apps.go checks for a value-typed ServiceActionConflictError
	// while servicestate returns a pointer, so snapd answers a plain 400.
	return badRequest("%s", ce.Error())
}

// postApps mirrors daemon/api_apps.go postApps.
func (s *Server) postApps(body []byte) *response {
	var inst instruction
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&inst); err != nil {
		return badRequest("cannot decode request body into service operation: %v", err)
	}
	if len(inst.Names) == 0 {
		return badRequest("cannot perform operation on services without a list of services to operate on")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	apps, rsp := s.appsForLocked(inst.Names, true)
	if rsp != nil {
		return rsp
	}
	var snapNames []string
	for _, a := range apps {
		snapNames = append(snapNames, a.snap)
	}
	snapNames = sortedUnique(snapNames)
	if ce := s.conflictLocked(snapNames, ""); ce != nil {
		return s.conflictResponseLocked(ce, s.cfg.conflictAs409)
	}
	ops, bad := buildOps(inst.Action, inst.Enable, inst.Disable, inst.Reload, apps, inst.Names, s.snaps)
	if bad != "" || ops == nil {
		return badRequest("unknown action %q", inst.Action)
	}
	c := s.newChangeLocked("service-control", "Running service command")
	c.snapNames = snapNames
	var prev *task
	for _, op := range ops {
		t := s.addServiceTaskLocked(c, op)
		if prev != nil {
			t.waitFor = append(t.waitFor, prev)
		}
		prev = t
	}
	s.updateChangeLocked(c)
	s.settleLocked()
	return asyncResp(c.id)
}

// sortedSnapNames returns the unique sorted names.
func sortedUnique(in []string) []string {
	m := map[string]bool{}
	var out []string
	for _, n := range in {
		if !m[n] {
			m[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}
