package fake

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"time"
)

// snapJSON mirrors client.Snap (client/packages.go) as daemon/snap.go
// mapLocal fills it for an installed snap: the keys without omitempty are
// always there. links is "links,omitempy" (sic) from 2.62 to 2.68, so it
// is served even when null; it came with 2.62 (2.57.6 has only contact)
// and is omitempty from 2.69. grade came after 2.70 (it is in 2.77).
type snapJSON struct {
	ID               string     `json:"id"`
	Title            string     `json:"title,omitempty"`
	Summary          string     `json:"summary"`
	Description      string     `json:"description"`
	InstalledSize    int64      `json:"installed-size,omitempty"`
	InstallDate      *time.Time `json:"install-date,omitempty"`
	Name             string     `json:"name"`
	Developer        string     `json:"developer"`
	Status           string     `json:"status"`
	Type             string     `json:"type"`
	Base             string     `json:"base,omitempty"`
	Version          string     `json:"version"`
	Channel          string     `json:"channel"`
	TrackingChannel  string     `json:"tracking-channel,omitempty"`
	IgnoreValidation bool       `json:"ignore-validation"`
	Revision         string     `json:"revision"`
	Confinement      string     `json:"confinement"`
	Grade            *string    `json:"grade,omitempty"` // present (even "") from 2.77
	Private          bool       `json:"private"`
	DevMode          bool       `json:"devmode"`
	JailMode         bool       `json:"jailmode"`
	Apps             []appJSON  `json:"apps,omitempty"`
	License          string     `json:"license,omitempty"`
	MountedFrom      string     `json:"mounted-from,omitempty"`
	Contact          string     `json:"contact"`
	// Hold is the system hold of the snap's refreshes (snap refresh
	// --hold), from 2.58 (daemon/snap.go mapLocal).
	Hold *time.Time `json:"hold,omitempty"`
	// GatingHold is until when a snap's gate-auto-refresh hook held it.
	GatingHold *time.Time `json:"gating-hold,omitempty"`
}

// snapJSONLinksNull adds the always-present "links": null of 2.62..2.68.
type snapJSONLinksNull struct {
	snapJSON
	Links map[string][]string `json:"links"`
}

// snapFakeInstalledSize is the installed-size the fake reports (the size
// of a small .snap file; the fake has no file).
const snapFakeInstalledSize = 4096

func (s *Server) snapJSONLocked(ss *snapState) any {
	in := ss.info
	def := func(v, d string) string {
		if v == "" {
			return d
		}
		return v
	}
	rev := def(in.Revision, "x1")
	installed := ss.installed.UTC()
	j := snapJSON{
		Summary: in.Summary, Description: in.Description,
		InstalledSize: snapFakeInstalledSize, InstallDate: &installed,
		Name: ss.name, Status: "active", Type: def(in.Type, "app"), Base: in.Base,
		Version: def(in.Version, "1"), TrackingChannel: in.TrackingChannel, License: in.License,
		Revision: rev, Confinement: def(in.Confinement, "strict"),
		MountedFrom: "/var/lib/snapd/snaps/" + ss.name + "_" + rev + ".snap",
	}
	if in.TrackingChannel != "" {
		j.Channel = in.TrackingChannel
	}
	if ss.hold != nil && s.cfg.version.hasHold() {
		h := ss.hold.until
		j.Hold = &h
	}
	if !ss.gatingHold.IsZero() && s.cfg.version.hasHold() {
		g := ss.gatingHold
		j.GatingHold = &g
	}
	var names []string
	for n := range ss.apps {
		names = append(names, n)
	}
	sort.Strings(names) // snap.AppInfoBySnapApp
	for _, n := range names {
		j.Apps = append(j.Apps, appToJSON(ss.apps[n]))
	}
	v := s.cfg.version
	if v.atLeast("2.77") {
		g := def(in.Grade, "stable")
		j.Grade = &g
	}
	if v.atLeast(Version262) && !v.atLeast("2.69") {
		return snapJSONLinksNull{snapJSON: j}
	}
	return j
}

// getSnaps mirrors daemon/api_snaps.go getSnapsInfo for local snaps:
// select= "", "all" or "enabled" (and "refresh-inhibited" from 2.63, which
// no fake snap is), snaps= a comma-separated filter; the envelope carries
// "sources":["local"] (findResponse). The fake lists snaps in name order
// (snapd walks a map). q= or sources=store would search the store: the
// fake's store is empty.
func (s *Server) getSnaps(r *http.Request) *response {
	q := r.URL.Query()
	if _, ok := q["q"]; ok {
		return s.findStore(r)
	}
	if src, ok := q["sources"]; ok && (len(src) == 0 || strings.Contains(src[0], "store")) {
		return s.findStore(r)
	}
	sel := q.Get("select")
	switch sel {
	case "", "all", "enabled":
	case "refresh-inhibited":
		if !s.cfg.version.atLeast("2.63") {
			return badRequest("invalid select parameter: %q", sel)
		}
		rsp := syncResp([]any{})
		rsp.sources = []string{"local"}
		return rsp
	default:
		if s.cfg.version.atLeast("2.63") {
			// 2.63+ formats the (zero) snapSelect value, not the string
			return badRequest("invalid select parameter: %q", rune(0))
		}
		return badRequest("invalid select parameter: %q", sel)
	}
	var wanted map[string]bool
	if ns := commaList([]string{q.Get("snaps")}); len(ns) > 0 {
		wanted = map[string]bool{}
		for _, n := range ns {
			wanted[n] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for n := range s.snaps {
		if wanted == nil || wanted[n] {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	out := []any{}
	for _, n := range names {
		out = append(out, s.snapJSONLocked(s.snaps[n]))
	}
	rsp := syncResp(out)
	rsp.sources = []string{"local"}
	return rsp
}

// getSnap mirrors getSnapInfo: the installed snap, or 404 snap-not-found
// "snap not installed" with the name as value.
func (s *Server) getSnap(name string) *response {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.snaps[name]
	if ss == nil {
		return errResp(404, "snap-not-found", name, "snap not installed")
	}
	return syncResp(s.snapJSONLocked(ss))
}

// findStore answers GET /v2/find (daemon/api_find.go) as a store that
// has no snaps: name=X is 404 snap-not-found "snap not found" (findOne),
// a search an empty list with "sources":["store"].
func (s *Server) findStore(r *http.Request) *response {
	q := r.URL.Query()
	if name := q.Get("name"); name != "" && name[len(name)-1] != '*' {
		return errResp(404, "snap-not-found", name, "snap not found")
	}
	rsp := syncResp([]json.RawMessage{})
	rsp.sources = []string{"store"}
	return rsp
}
