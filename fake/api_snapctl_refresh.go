package fake

import (
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// snapd's gating limits (overlord/snapstate/autorefresh.go): a snap may
// postpone its own refresh for 95 days since its last refresh, less a
// 5-day buffer.
const (
	maxPostponement       = 95 * 24 * time.Hour
	maxPostponementBuffer = 5 * 24 * time.Hour
)

// snapctlRefresh mirrors overlord/hookstate/ctlcmd/refresh.go (a hidden
// command, on every modelled version): --pending prints the calling snap's
// refresh candidate as YAML, --hold (gate-auto-refresh hook only) holds
// its auto-refresh and prints the time left ("hold: 2159h59m59s"),
// --proceed (gate-auto-refresh hook) lets it go; from a snap's ephemeral
// context --proceed needs snap-refresh-control, which no fake snap has.
// Only the snap's own refresh (a store revision newer than the installed
// one) affects it: the fake has no bases or kernels to gate.
// Hook.RefreshAction tells which the hook chose.
func (s *Server) snapctlRefresh(cctx *ctlContext, args []string, fail func(string, ...any) *response) *response {
	var pending, proceed, hold, showLock bool
	for _, a := range args {
		switch a {
		case "--pending":
			pending = true
		case "--proceed":
			proceed = true
		case "--hold":
			hold = true
		case "--show-lock":
			showLock = true
		default:
			if strings.HasPrefix(a, "-") {
				return fail("unknown flag `%s'", strings.TrimLeft(a, "-"))
			}
			return fail("too many arguments for command")
		}
	}
	if cctx.hook != nil && cctx.hook.name != "gate-auto-refresh" {
		return fail("can only be used from gate-auto-refresh hook")
	}
	which := ""
	for _, o := range []struct {
		on   bool
		name string
	}{{showLock, "--show-lock"}, {hold, "--hold"}, {proceed, "--proceed"}} {
		if o.on && which != "" {
			return fail("cannot use %s and %s together", o.name, which)
		}
		if o.on {
			which = o.name
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := cctx.snap
	var out strings.Builder
	if pending && !proceed {
		out.WriteString(s.pendingYAMLLocked(ss))
	}
	switch {
	case proceed:
		if cctx.hook == nil {
			return fail("cannot proceed: requires snap-refresh-control interface")
		}
		cctx.hook.refreshAction = "proceed"
		ss.gatingHold = time.Time{}
	case hold:
		if cctx.hook == nil {
			return fail("cannot hold outside of gate-auto-refresh hook")
		}
		if s.candidateLocked(ss) == nil {
			return fail("internal error: snap %q is not affected by any snaps", ss.name)
		}
		cctx.hook.refreshAction = "hold"
		now := s.nowLocked()
		if ss.gatingFirstHeld.IsZero() {
			ss.gatingFirstHeld = now
		}
		// holdDurationLeft for a snap holding itself: the smaller of what
		// is left since it was first held and since its last refresh
		mp := maxPostponement - maxPostponementBuffer
		left := ss.gatingFirstHeld.Add(mp).Sub(now)
		if d := ss.installed.Add(mp).Sub(now); d < left {
			left = d
		}
		if left <= 0 {
			return fail("snap %q cannot hold snap %q anymore, maximum refresh postponement exceeded", ss.name, ss.name)
		}
		ss.gatingHold = now.Add(left).UTC()
		b, _ := yaml.Marshal(map[string]string{"hold": left.String()})
		out.Write(b)
	case showLock:
		// no refresh in progress holds the snap's inhibition lock
	}
	return syncResp(snapctlResult{Stdout: out.String()})
}

// candidateLocked is the store revision a refresh of ss would install, or
// nil when there is none.
func (s *Server) candidateLocked(ss *snapState) *StoreRevision {
	offer, ok := s.store[ss.name][channelKey(ss.info.TrackingChannel)]
	if !ok || offer.Revision == s.currentRevLocked(ss).rev {
		return nil
	}
	return &offer
}

// pendingYAMLLocked is updateDetails as yaml.Marshal writes it: pending
// "ready" or "none", the channel, the candidate's version and revision,
// base and restart (always false here).
func (s *Server) pendingYAMLLocked(ss *snapState) string {
	type details struct {
		Pending  string `yaml:"pending,omitempty"`
		Channel  string `yaml:"channel,omitempty"`
		Version  string `yaml:"version,omitempty"`
		Revision int    `yaml:"revision,omitempty"`
		Base     bool   `yaml:"base"`
		Restart  bool   `yaml:"restart"`
	}
	d := details{Pending: "none", Channel: ss.info.TrackingChannel}
	if c := s.candidateLocked(ss); c != nil {
		d.Pending, d.Channel, d.Version = "ready", channelKey(c.Channel), c.Version
		fmt.Sscanf(c.Revision, "%d", &d.Revision)
	}
	b, _ := yaml.Marshal(d)
	return string(b)
}

// RefreshAction is what the hook (a gate-auto-refresh hook) answered
// through snapctl refresh: "hold", "proceed", or "" when neither.
func (h *Hook) RefreshAction() string {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.refreshAction
}
