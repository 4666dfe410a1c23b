package fake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// getSnapConf mirrors daemon/api_snap_conf.go getSnapConf: keys= is a
// comma-separated list; no keys is the whole document ({} when there is
// none, even for a snap that is not installed: snapd reads the
// configuration without checking the snap); a missing key is 400
// option-not-found with value {"SnapName","Key"} (config.NoOptionError
// serialised as it is).
func (s *Server) getSnapConf(r *http.Request, name string) *response {
	keys := commaList([]string{r.URL.Query().Get("keys")})
	s.mu.Lock()
	defer s.mu.Unlock()
	doc := map[string]any{}
	if ss := s.snaps[name]; ss != nil {
		doc = ss.config
	}
	if len(keys) == 0 {
		return syncResp(copyConfig(doc))
	}
	out := map[string]any{}
	for _, k := range keys {
		if _, err := parseConfigKey(k); err != nil {
			return errResp(500, "", nil, "%v", err)
		}
		v, ok := configGet(doc, k)
		if !ok {
			return errResp(400, "option-not-found", noOptionError{SnapName: name, Key: k},
				"snap %q has no %q configuration option", name, k)
		}
		out[k] = v
	}
	return syncResp(copyConfig(out))
}

// noOptionError is config.NoOptionError as encoding/json writes it.
type noOptionError struct {
	SnapName string
	Key      string
}

// putSnapConf mirrors daemon/api_snap_conf.go setSnapConf and
// overlord/configstate Configure: a "configure-snap" change (with
// snap-names) whose one run-hook task runs the snap's configure hook and
// commits the patch when the hook succeeds. Conflicts are 409
// snap-change-conflict (errToResponse), an unknown snap 404 snap-not-found.
func (s *Server) putSnapConf(name string, body []byte) *response {
	var patch map[string]any
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber() // jsonutil.DecodeWithNumber
	if err := d.Decode(&patch); err != nil {
		return badRequest("cannot decode request body into patch values: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.snaps[name]
	if ss == nil {
		return errResp(404, "snap-not-found", name, "snap %q is not installed", name)
	}
	if ce := s.conflictLocked([]string{name}, ""); ce != nil {
		return s.conflictResponseLocked(ce, true)
	}
	c := s.newChangeLocked("configure-snap", fmt.Sprintf("Change configuration of %q snap", name))
	c.snapNames = []string{name}
	s.addConfigureTaskLocked(c, ss, patch)
	s.updateChangeLocked(c)
	s.settleLocked()
	return asyncResp(c.id)
}

// addConfigureTaskLocked adds the run-hook task of configstate.Configure:
// optional ("... if present") when the patch is empty.
func (s *Server) addConfigureTaskLocked(c *change, ss *snapState, patch map[string]any) *task {
	summary := fmt.Sprintf("Run configure hook of %q snap", ss.name)
	if len(patch) == 0 {
		summary += " if present"
	}
	t := s.newTaskLocked(c, "run-hook", summary, ss.name)
	t.run = func() { s.runConfigureLocked(t, ss, patch) }
	return t
}

// runConfigureLocked runs the configure hook: a snap without one fails a
// non-empty patch ("snap %q has no %q hook", hookstate's runHookForTask),
// an invalid key fails the task when the hook context applies the patch,
// and otherwise the hook takes the snap's configure duration on the clock.
func (s *Server) runConfigureLocked(t *task, ss *snapState, patch map[string]any) {
	for k := range patch {
		if _, err := parseConfigKey(k); err != nil {
			s.failTaskLocked(t, err.Error())
			return
		}
	}
	hasHook := ss.info.hasHook("configure")
	if !hasHook {
		if len(patch) > 0 {
			s.failTaskLocked(t, fmt.Sprintf("snap %q has no %q hook", ss.name, "configure"))
			return
		}
		s.setTaskStatusLocked(t, StatusDone)
		return
	}
	t.onDone = func() {
		for k, v := range patch {
			configSet(ss.config, k, v)
		}
	}
	d := ss.info.ConfigureHookDuration
	if key := ss.info.ConfigureHookSleepKey; key != "" {
		after := copyConfig(ss.config)
		for k, v := range patch {
			configSet(after, k, v)
		}
		if v, ok := configGet(after, key); ok {
			if n, err := strconv.ParseFloat(fmt.Sprint(v), 64); err == nil && n >= 0 {
				d = time.Duration(n * float64(time.Second))
			}
		}
	}
	if d < 0 {
		// held: the test (or `fakesnapd ctl finish`) ends it
		t.run = nil
		return
	}
	if d == 0 {
		s.setTaskStatusLocked(t, StatusDone)
		return
	}
	s.afterLocked(d, func() {
		if !statusReady(t.status) {
			s.finishTaskLocked(t)
		}
		s.settleLocked()
	})
}
