package fake

import (
	"errors"
	"fmt"
	"strings"
)

// StoreRevision is a revision of a snap that the fake's store offers: what a
// refresh (POST /v2/snaps/{name} {"action":"refresh"}) installs. The fake has
// no real store: a snap with no StoreRevision is unknown to it.
type StoreRevision struct {
	// Revision is the store revision, a positive number ("42").
	Revision string
	// Version is the snap's version in that revision (default: the
	// installed one).
	Version string
	// Channel is the channel that offers it: "" or "stable" is
	// "latest/stable"; a refresh asking another channel finds nothing there.
	Channel string
	// Apps, when set, are the apps of the new revision: a service named as
	// an installed one keeps its enabled state, a new one takes its
	// Enabled (snapd enables new services unless install-mode: disable);
	// their durations, FailStart and DiesAfterStart apply from the
	// refresh's start-snap-services on. Nil keeps the installed apps as
	// they are.
	Apps []App
}

// WithStoreRevision makes the fake's store offer rev of snap (see
// SetStoreRevision).
func WithStoreRevision(snap string, rev StoreRevision) Option {
	return func(c *config) { c.store = append(c.store, storeEntry{snap, rev}) }
}

type storeEntry struct {
	snap string
	rev  StoreRevision
}

// SetStoreRevision makes the fake's store offer rev of snap in rev's
// channel, replacing what it offered there. A snap the store knows is a
// store snap: a refresh with nothing newer answers snapd's 400
// snap-no-update-available instead of snap-local. An installed snap whose
// revision is a number is known to the store too, with nothing newer.
func (s *Server) SetStoreRevision(snap string, rev StoreRevision) error {
	if err := rev.check(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.setStoreLocked(snap, rev)
	return nil
}

func (s *Server) setStoreLocked(snap string, rev StoreRevision) {
	if s.store == nil {
		s.store = map[string]map[string]StoreRevision{}
	}
	if s.store[snap] == nil {
		s.store[snap] = map[string]StoreRevision{}
	}
	rev.Apps = append([]App(nil), rev.Apps...)
	s.store[snap][channelKey(rev.Channel)] = rev
}

func (r StoreRevision) check() error {
	if r.Revision == "" || strings.HasPrefix(r.Revision, "x") || strings.TrimLeft(r.Revision, "0123456789") != "" {
		return fmt.Errorf("fake snapd: store revision %q is not a positive number", r.Revision)
	}
	for _, a := range r.Apps {
		if a.Name == "" {
			return errors.New("fake snapd: a store revision's app has no name")
		}
	}
	return nil
}

// channelKey normalises a channel to track/risk ("" and "stable" are
// "latest/stable", "edge" is "latest/edge").
func channelKey(ch string) string {
	if ch == "" {
		return "latest/stable"
	}
	if !strings.Contains(ch, "/") {
		switch ch {
		case "stable", "candidate", "beta", "edge":
			return "latest/" + ch
		}
		return ch + "/stable"
	}
	return ch
}

// storeKnowsLocked reports whether the store knows snap at all: a snap
// with store revisions, or one installed from the store (a numeric
// revision).
func (s *Server) storeKnowsLocked(ss *snapState) bool {
	if len(s.store[ss.name]) > 0 {
		return true
	}
	rev := ss.info.Revision
	return rev != "" && !strings.HasPrefix(rev, "x")
}
