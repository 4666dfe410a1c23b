package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Holds: snapd (>= 2.58) keeps a snap's refreshes back while an
// administrator's hold stands (POST /v2/snaps/NAME {"action": "hold",
// "time": "forever" or an RFC3339 time, "hold-level": "general" or
// "auto-refresh"}; daemon/api_snaps.go snapHoldMany). The hold is written
// at once: snapd answers with a change that has no tasks and is Done
// already, and never refuses it for a conflict. Holding and unholding are
// idempotent (the time is computed once, here), so a request whose answer
// was lost is simply sent again. GET /v2/snaps/NAME reads the hold back
// ("hold", and "gating-hold" for a snap's own gate-auto-refresh hold);
// snapd does not say its level.

// HoldLevel is which refreshes a hold keeps back.
type HoldLevel string

const (
	// HoldGeneral keeps back auto-refreshes and refreshes of all snaps
	// (`snap refresh` without names), as `snap refresh --hold NAME` does.
	// A refresh that names the snap (Refresh) still goes ahead.
	HoldGeneral HoldLevel = "general"
	// HoldAutoRefresh keeps back auto-refreshes only.
	HoldAutoRefresh HoldLevel = "auto-refresh"
)

// HoldOptions modify HoldRefresh.
type HoldOptions struct {
	// Level is the hold's level (default HoldGeneral, as snap's).
	Level HoldLevel
	// For is how long the hold stands, at least a second; 0 holds
	// forever, as `snap refresh --hold` does.
	For time.Duration
}

// RefreshHold is what snapd says of a snap's refresh holds.
type RefreshHold struct {
	// Snap is the snap.
	Snap string
	// Until is when the administrator's hold ends (HoldRefresh, `snap
	// refresh --hold`); zero when there is none.
	Until time.Time
	// Forever is set when Until is more than 100 years away, which is how
	// snapd keeps a hold without end (snap shows it as "forever").
	Forever bool
	// GatingUntil is when the longest hold a gate-auto-refresh hook put on
	// the snap ends (`snapctl refresh --hold`); zero when there is none.
	GatingUntil time.Time
	// ChangeID is the hold-snap or unhold-snap change snapd made (empty
	// when the hold was only read).
	ChangeID string
}

// Held reports whether an administrator's hold stands.
func (h RefreshHold) Held() bool { return !h.Until.IsZero() }

// SnapInfo is an installed snap as snapd reports it (GET /v2/snaps/NAME).
type SnapInfo struct {
	// Name, Version and Revision ("42", "x3" for a local one) are the
	// installed revision's.
	Name, Version, Revision string
	// Channel is the channel the revision came from ("" for a local file);
	// TrackingChannel the one the snap follows.
	Channel, TrackingChannel string
	// Publisher is the publisher's display name ("" for a local snap),
	// PublisherValidation "verified" or "starred" when the store vouches
	// for it.
	Publisher, PublisherValidation string
	// Hold is the snap's refresh holds.
	Hold RefreshHold
}

// foreverAfter is how far ahead a hold must end to be shown as forever:
// snapd stores "forever" as now + the longest time.Duration (about 292
// years); snap's client shows holds more than 100 years away as "forever"
// (cmd_snap_op.go showRefreshTimes).
const foreverAfter = 100 * 365 * 24 * time.Hour

func snapInfoOf(s *snapd.Snap) *SnapInfo {
	in := &SnapInfo{Name: s.Name, Version: s.Version, Revision: s.Revision, Channel: s.Channel, TrackingChannel: s.TrackingChannel}
	if p := s.Publisher; p != nil {
		in.Publisher, in.PublisherValidation = p.DisplayName, p.Validation
		if in.Publisher == "" {
			in.Publisher = p.Username
		}
	}
	in.Hold = RefreshHold{Snap: s.Name}
	if s.Hold != nil {
		in.Hold.Until = *s.Hold
		in.Hold.Forever = s.Hold.After(time.Now().Add(foreverAfter))
	}
	if s.GatingHold != nil {
		in.Hold.GatingUntil = *s.GatingHold
	}
	return in
}

// ErrHoldUnsupported matches, with errors.Is, a snapd too old to hold
// refreshes (before 2.58): it answers the hold action "unknown action".
var ErrHoldUnsupported = errors.New("snapd cannot hold refreshes")

// HoldUnsupportedError is a hold or unhold refused by a snapd that has no
// holds. It matches ErrHoldUnsupported.
type HoldUnsupportedError struct {
	// Version is the snapd's version ("" when it could not be read).
	Version string
	// Err is snapd's answer.
	Err error
}

// holdsSince is the first snapd release with refresh holds for named
// snaps (snapd 2.58: the hold and unhold actions of POST /v2/snaps).
const holdsSince = "2.58"

func (e *HoldUnsupportedError) Error() string {
	v := "this snapd"
	if e.Version != "" {
		v = "snapd " + e.Version
	}
	return fmt.Sprintf("%s cannot hold a snap's refreshes: holds need snapd %s or later (%v)", v, holdsSince, e.Err)
}

// Is matches ErrHoldUnsupported.
func (e *HoldUnsupportedError) Is(target error) bool { return target == ErrHoldUnsupported }

// Unwrap returns snapd's answer.
func (e *HoldUnsupportedError) Unwrap() error { return e.Err }

// Snap reads an installed snap, its refresh holds included. A snap that
// is not installed matches ErrNotFound.
func (c *Client) Snap(ctx context.Context, name string) (*SnapInfo, error) {
	if _, app, err := ValidateName(name); err != nil || app != "" {
		if err == nil {
			err = fmt.Errorf("%w %q: a snap, not a service", ErrInvalidName, name)
		}
		return nil, &OpError{Op: "read", Snap: name, Names: []string{name}, Err: err}
	}
	var in *SnapInfo
	err := c.callOf(ctx, callRead, "read", []string{name}, func(k *call) (err error) {
		in, err = k.readSnap(name)
		return err
	})
	if err != nil {
		return nil, &OpError{Op: "read", Snap: name, Names: []string{name}, Err: err}
	}
	return in, nil
}

// HoldRefresh holds the snap's refreshes (opts: level and duration) and
// returns the hold as snapd reads it back. snapd writes the hold at once,
// whatever else runs, and a refresh that names the snap (Refresh) still
// goes ahead. A snapd older than 2.58 cannot hold: the error matches
// ErrHoldUnsupported and says which version is needed.
func (c *Client) HoldRefresh(ctx context.Context, snap string, opts HoldOptions) (*RefreshHold, error) {
	inst := snapd.SnapInstruction{Action: snapd.ActionHold, HoldLevel: string(opts.Level), Time: "forever"}
	if inst.HoldLevel == "" {
		inst.HoldLevel = string(HoldGeneral)
	}
	o := request{action: "hold", t: target{names: []string{snap}, snaps: []string{snap}}}
	switch {
	case opts.Level != "" && opts.Level != HoldGeneral && opts.Level != HoldAutoRefresh:
		return nil, c.opError(o, "", 0, fmt.Errorf("%w: hold level %q (want %q or %q)", ErrInvalidRefresh, opts.Level, HoldGeneral, HoldAutoRefresh))
	case opts.For < 0 || (opts.For > 0 && opts.For < time.Second):
		return nil, c.opError(o, "", 0, fmt.Errorf("%w: cannot hold refreshes for less than a second (%s)", ErrInvalidRefresh, opts.For))
	case opts.For > 0:
		inst.Time = c.clock.Now().Add(opts.For).Format(time.RFC3339)
	}
	return c.holdOp(ctx, o, inst)
}

// UnholdRefresh removes the administrator's hold on the snap's refreshes
// (whatever its level) and returns what snapd reads back: a gate hook's
// hold, if any, stays. Unholding a snap that is not held succeeds. A snapd
// older than 2.58 fails as HoldRefresh does.
func (c *Client) UnholdRefresh(ctx context.Context, snap string) (*RefreshHold, error) {
	o := request{action: "unhold", t: target{names: []string{snap}, snaps: []string{snap}}}
	return c.holdOp(ctx, o, snapd.SnapInstruction{Action: snapd.ActionUnhold})
}

// holdOp sends a hold or unhold (inst) for o's snap, waits for its change
// (Done at once) and reads the hold back, on one call.
func (c *Client) holdOp(ctx context.Context, o request, inst snapd.SnapInstruction) (*RefreshHold, error) {
	snap := o.t.names[0]
	if _, app, err := ValidateName(snap); err != nil || app != "" {
		if err == nil {
			err = fmt.Errorf("%w %q: a hold takes a snap, not a service", ErrInvalidName, snap)
		}
		return nil, c.opError(o, "", 0, err)
	}
	if c.mode == ModeSnapctl {
		return nil, c.opError(o, "", 0, ErrRefreshInSnapctl)
	}
	k := c.newCall(ctx, callOp, o.action, o.t.names)
	defer k.end()
	var id string
	// Idempotent: asked again, even when the answer was lost (reading).
	err := k.request(o.action+"ing refreshes", reading, func(ctx context.Context) (err error) {
		id, err = c.main.PostSnap(ctx, snap, inst)
		return err
	})
	if err != nil {
		if tooOldForHolds(err) {
			err = &HoldUnsupportedError{Version: c.snapdVersion(k), Err: err}
		}
		return nil, c.opError(o, "", 0, err)
	}
	k.log.Info("refresh hold change made", "change", id, "action", inst.Action, "level", inst.HoldLevel, "time", inst.Time)
	if _, err := waitChange(k, id, waitOpts{}); err != nil {
		return nil, c.opError(o, id, 1, err)
	}
	in, err := k.readSnap(snap)
	if err != nil {
		return nil, c.opError(o, id, 1, err)
	}
	in.Hold.ChangeID = id
	return &in.Hold, nil
}

// tooOldForHolds reports whether err is a snapd without holds refusing
// one: 400 without a kind, "unknown action hold" (daemon/api_snaps.go
// postSnap, whose dispatch table before 2.58 has no hold or unhold).
func tooOldForHolds(err error) bool {
	var e *snapd.Error
	return errors.As(err, &e) && e.StatusCode == http.StatusBadRequest && e.Kind == "" &&
		(e.Message == "unknown action hold" || e.Message == "unknown action unhold")
}

// snapdVersion reads snapd's version on k, or "" (it only words an error).
func (c *Client) snapdVersion(k *call) string {
	ctx, cancel := context.WithTimeout(k.ctx, 2*time.Second)
	defer cancel()
	info, err := c.main.SystemInfo(ctx)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(info.Version)
}
