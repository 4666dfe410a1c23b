package snapsvc

import (
	"slices"
	"strings"
)

// The budget phase of an operation: which slots it takes (a slot per key
// of the services it disrupts), before the lock phase. The slots' life
// from then on is budget_lifecycle.go's.

// budgetKeys returns the budget keys of names: each "snap.app" name's key,
// and for a whole-snap name the keys of every one of its services (from
// snapd's apps listing, svcs when the caller read it already), so that a
// restart of "k8s" on one machine and of "k8s.kube-apiserver" on another
// take the same slot. A snap without services keeps its own name's key.
// It reads snapd only when a whole-snap name is given and svcs is nil.
func (k *call) budgetKeys(names []string, svcs []Service) ([]string, error) {
	c := k.c
	var snaps []string
	for _, n := range names {
		if !strings.Contains(n, ".") && !slices.Contains(snaps, n) {
			snaps = append(snaps, n)
		}
	}
	if len(snaps) > 0 && svcs == nil {
		var err error
		if svcs, err = k.services(snaps); err != nil {
			return nil, err
		}
	}
	var expanded []string
	for _, n := range names {
		if strings.Contains(n, ".") {
			expanded = append(expanded, n)
			continue
		}
		found := false
		for _, s := range svcs {
			if s.Snap == n {
				expanded, found = append(expanded, s.FullName()), true
			}
		}
		if !found {
			expanded = append(expanded, n)
		}
	}
	return c.budget.keysOf(expanded), nil
}

// applies reports whether o takes slots.
func (b *budgetRunner) applies(o op) bool {
	if b.c.queuesInHook() {
		return false
	}
	switch o.action {
	case "restart":
		return true
	case "stop", "start":
		return b.opts.StopsAndStarts
	}
	return false
}

// takeBudget is the budget phase of an operation: it takes (or, for a
// Start, finds) the slots o needs. A nil hold means o runs unbudgeted. A
// restart paced by WithMinRestartInterval waits out its interval first, so
// no slot is held while pacing.
func (c *Client) takeBudget(k *call, o op) (*hold, error) {
	b := c.budget
	if b == nil || !b.applies(o) {
		return nil, nil
	}
	if o.action == "start" {
		keys, err := k.budgetKeys(o.t.names, nil)
		if err != nil {
			return nil, c.opError(o, "", 0, err)
		}
		h := b.kept(keys)
		if h != nil {
			h.watch()
		}
		return h, nil
	}
	names := o.t.names
	var svcs []Service
	if o.action == "stop" {
		running, all, err := k.running(o)
		if err != nil {
			return nil, c.opError(o, "", 0, err)
		}
		names, svcs = running, all
	}
	keys, err := k.budgetKeys(names, svcs)
	if err != nil {
		return nil, c.opError(o, "", 0, err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	if err := k.keepInterval(o); err != nil { // a no-op unless a restart must be paced
		return nil, c.opError(o, "", 0, err)
	}
	h, err := b.takeAll(k.ctx, keys)
	if err != nil {
		return nil, c.opError(o, "", 0, err)
	}
	return h, nil
}

// running returns the names of o that name a running service (or a snap
// with one), and the services it read.
func (k *call) running(o op) ([]string, []Service, error) {
	svcs, err := k.services(o.t.names)
	if err != nil {
		return nil, nil, err
	}
	var out []string
	for _, n := range o.t.names {
		for _, s := range svcs {
			if s.Active && (s.FullName() == n || s.Snap == n) {
				out = append(out, n)
				break
			}
		}
	}
	return out, svcs, nil
}
