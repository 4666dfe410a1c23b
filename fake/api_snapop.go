package fake

import (
	"bytes"
	"encoding/json"
	"fmt"
	"runtime"
	"sort"
)

// snapInstruction is the part of daemon/api_snaps.go's snapInstruction the
// fake reads. Unknown fields are ignored, as snapd's plain json.Decoder
// does; 2.57.6 has no time/hold-level, so it ignores those too.
type snapInstruction struct {
	Action    string `json:"action"`
	Channel   string `json:"channel"`
	Revision  string `json:"revision"`
	Time      string `json:"time"`
	HoldLevel string `json:"hold-level"`
}

// snapActions are the actions of snapInstructionDispTable: 2.57.6's seven,
// and hold/unhold from 2.58.
func (v Version) snapAction(a string) bool {
	switch a {
	case "install", "refresh", "remove", "revert", "enable", "disable", "switch":
		return true
	case "hold", "unhold":
		return v.hasHold()
	}
	return false
}

// postSnap mirrors daemon/api_snaps.go postSnap for one snap: decode,
// validate (the hold fields from 2.58), dispatch ("unknown action %s",
// unquoted, 400 without kind), then the action. refresh, hold and unhold
// are modelled; install, remove, revert, enable, disable and switch are
// refused with a 400 saying the fake does not do them.
func (s *Server) postSnap(name string, body []byte) *response {
	var inst snapInstruction
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&inst); err != nil {
		return badRequest("cannot decode request body into snap instruction: %v", err)
	}
	if s.cfg.version.hasHold() {
		if msg := validateHold(&inst); msg != "" {
			return badRequest("%s", msg)
		}
	}
	if !s.cfg.version.snapAction(inst.Action) {
		return badRequest("unknown action %s", inst.Action)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch inst.Action {
	case "refresh":
		return s.refreshLocked(name, &inst)
	case "hold":
		return s.holdLocked(name, &inst)
	case "unhold":
		return s.unholdLocked(name)
	}
	return badRequest("fake snapd does not %s snaps (POST /v2/snaps/%s)", inst.Action, name)
}

// refreshLocked mirrors snapUpdate for one snap (overlord/snapstate
// UpdateOne), as captured from 2.68.3:
//   - a snap that is not installed: from 2.68 snapstate's value
//     NotInstalledError, which errToResponse's pointer case misses: 400
//     without kind, `cannot refresh "x": snap "x" is not installed`;
//     2.57.6: 400 snap-not-installed, value "x", `snap "x" is not
//     installed` (the release in between is not pinned down);
//   - revision set to one a local snap still has (its sequence): a local
//     amend to that revision, a refresh-snap change (2.68+:
//     installActionsForAmend; 2.57.6 too, captured);
//   - a snap the store does not know (a sideloaded one): 400 snap-local
//     "cannot perform operation on local snap" with value "" -- before any
//     conflict check, so also while another change holds the snap;
//   - nothing newer in the store for the channel (or the revision asked is
//     the installed one): 400 snap-no-update-available "snap has no
//     updates available", value "" (the snap client prints `snap "x" has
//     no updates available` and exits 0); no change is made;
//   - a revision the store does not offer: 404 snap-revision-not-available;
//   - otherwise the conflict check (409 snap-change-conflict), then a
//     refresh-snap change. A hold does not stop a refresh that names the
//     snap (updatePlan.filterHeldSnaps filters only refresh-all and
//     auto-refresh).
func (s *Server) refreshLocked(name string, inst *snapInstruction) *response {
	ss := s.snaps[name]
	if ss == nil {
		if !s.cfg.version.atLeast(Version268) {
			// 2.57.6 returned a pointer: errToResponse's snap-not-installed (captured)
			return errResp(400, "snap-not-installed", name, "snap %q is not installed", name)
		}
		return badRequest("cannot refresh %q: snap %q is not installed", name, name)
	}
	cur := s.currentRevLocked(ss)
	if inst.Revision != "" && !s.storeKnowsLocked(ss) {
		if to, ok := ss.revision(inst.Revision); ok {
			if ce := s.conflictLocked([]string{name}, ""); ce != nil {
				return s.conflictResponseLocked(ce, true)
			}
			if to.rev == cur.rev {
				return errResp(400, "snap-no-update-available", "", "snap has no updates available")
			}
			op := &snapOp{kind: "refresh-snap", ss: ss, to: to, present: true}
			return s.startSnapOpLocked(op, refreshSummary(name, inst.Channel))
		}
	}
	if !s.storeKnowsLocked(ss) {
		return errResp(400, "snap-local", "", "cannot perform operation on local snap")
	}
	ch := inst.Channel
	if ch == "" {
		ch = ss.info.TrackingChannel
	}
	offer, ok := s.store[name][channelKey(ch)]
	if !ok && inst.Channel != "" {
		return s.channelNotAvailableLocked(name, inst.Channel)
	}
	if inst.Revision != "" && (!ok || offer.Revision != inst.Revision) {
		if inst.Revision == cur.rev {
			return errResp(400, "snap-no-update-available", "", "snap has no updates available")
		}
		return errResp(404, "snap-revision-not-available", name, "no snap revision available as specified")
	}
	if !ok || offer.Revision == cur.rev {
		return errResp(400, "snap-no-update-available", "", "snap has no updates available")
	}
	if ce := s.conflictLocked([]string{name}, ""); ce != nil {
		return s.conflictResponseLocked(ce, true)
	}
	to := revState{rev: offer.Revision, version: offer.Version, apps: offer.Apps}
	if to.version == "" {
		to.version = cur.version
	}
	if to.apps == nil {
		to.apps = cur.apps
	}
	op := &snapOp{kind: "refresh-snap", ss: ss, to: to, channel: channelKey(ch)}
	return s.startSnapOpLocked(op, refreshSummary(name, inst.Channel))
}

// refreshSummary mirrors installRefreshMessage (snapUpdate in 2.57).
func refreshSummary(name, channel string) string {
	if channel != "" && channel != "stable" {
		return fmt.Sprintf("Refresh %q snap from %q channel", name, channel)
	}
	return fmt.Sprintf("Refresh %q snap", name)
}

// channelNotAvailableLocked mirrors SnapRevisionNotAvailable
// (daemon/errors.go) for a store that has the snap on other channels of
// this architecture: 404 snap-channel-not-available "no snap revision on
// specified channel", with the releases the store offers.
func (s *Server) channelNotAvailableLocked(name, channel string) *response {
	arch := dpkgArch()
	var chans []string
	for ch := range s.store[name] {
		chans = append(chans, ch)
	}
	sort.Strings(chans)
	releases := []map[string]any{}
	for _, ch := range chans {
		releases = append(releases, map[string]any{"architecture": arch, "channel": ch})
	}
	return errResp(404, "snap-channel-not-available", map[string]any{
		"snap-name": name, "action": "refresh", "channel": channel, "architecture": arch, "releases": releases,
	}, "no snap revision on specified channel")
}

// dpkgArch is arch.DpkgArchitecture for the fake's own architecture.
func dpkgArch() string {
	switch runtime.GOARCH {
	case "386":
		return "i386"
	case "arm":
		return "armhf"
	case "ppc64le":
		return "ppc64el"
	}
	return runtime.GOARCH
}
