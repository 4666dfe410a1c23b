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
func (op *operation) budgetKeys(names []string, svcs []Service) ([]string, error) {
	c, k := op.c, op.k
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
func (b *budgetRunner) applies(o request) bool {
	if b.c.queuesInHook() {
		return false
	}
	switch o.action {
	case "restart", "refresh":
		return true
	case "stop", "start":
		return b.opts.StopsAndStarts
	}
	return false
}

// takeBudget is the budget phase of an operation: it takes (or, for a
// Start, finds) the slots it needs; it takes none where it runs
// unbudgeted. It comes after the pace phase, so no slot is held while a
// restart waits out WithMinRestartInterval.
func (op *operation) takeBudget() error {
	c, k, o := op.c, op.k, op.o
	b := c.budget
	if b == nil || !b.applies(o) {
		return nil
	}
	if o.action == "start" {
		keys, err := op.budgetKeys(o.t.names, nil)
		if err != nil {
			return c.opError(o, "", 0, err)
		}
		if op.hold = b.kept(keys); op.hold != nil {
			op.hold.what = o
			op.hold.listenLost()
		}
		return nil
	}
	names := o.t.names
	var svcs []Service
	if o.action == "stop" {
		running, all, err := op.running()
		if err != nil {
			return c.opError(o, "", 0, err)
		}
		names, svcs = running, all
	}
	keys, err := op.budgetKeys(names, svcs)
	if err != nil {
		return c.opError(o, "", 0, err)
	}
	if len(keys) == 0 {
		return nil
	}
	h, err := b.takeAll(k.ctx, keys)
	if err != nil {
		return c.opError(o, "", 0, err)
	}
	h.what = o
	op.hold = h
	return nil
}

// running returns the names of the operation that name a running service (or a snap
// with one), and the services it read.
func (op *operation) running() ([]string, []Service, error) {
	k, o := op.k, op.o
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
