package fake

import (
	"context"
	"errors"
	"fmt"
)

// WaitIdle blocks until no change is in progress (or ctx ends). With a
// ManualClock nobody advances time for you: use AdvanceUntilIdle.
func (s *Server) WaitIdle(ctx context.Context) error {
	for {
		s.mu.Lock()
		busy := false
		for _, c := range s.changes {
			if !statusReady(c.status()) {
				busy = true
				break
			}
		}
		wake := s.stateWake
		s.mu.Unlock()
		if !busy {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closeCh:
			return errors.New("fake snapd: closed")
		}
	}
}

// WaitFor blocks until cond (called with the server's state locked, so it
// must only use the callbacks' arguments) returns true or ctx ends. It is
// re-evaluated after every state change.
func (s *Server) WaitFor(ctx context.Context, cond func(v View) bool) error {
	for {
		s.mu.Lock()
		ok := cond(View{s})
		wake := s.stateWake
		s.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closeCh:
			return errors.New("fake snapd: closed")
		}
	}
}

// View is a read-only look at the fake's state inside WaitFor.
type View struct{ s *Server }

// InProgress describes the changes that are not ready, in id order.
func (v View) InProgress() []ChangeInfo {
	var out []ChangeInfo
	for _, c := range v.s.changes {
		if !statusReady(c.status()) {
			out = append(out, v.s.infoLocked(c))
		}
	}
	return out
}

// Service returns snap.app's state.
func (v View) Service(snap, app string) (AppState, bool) {
	a := v.s.appLocked(snap, app)
	if a == nil || a.Daemon == "" {
		return AppState{}, false
	}
	return AppState{Enabled: a.Enabled, Active: a.Active}, true
}

// Requests returns how many requests have been handled so far, every
// route together (see Handled).
func (v View) Requests() int { return len(v.s.requests) }

// InFlight returns how many requests are being handled right now (e.g.
// snapctl calls waiting for their change, notice long-polls).
func (v View) InFlight() int { return v.s.inflight }

// AdvanceUntilReady drives a ManualClock until change id is ready, firing
// timers one deadline at a time; it fails when no timer is left to fire.
// With another clock it waits for the change (or ctx).
func (s *Server) AdvanceUntilReady(ctx context.Context, id string) error {
	ready := s.ChangeReady(id)
	if ready == nil {
		return fmt.Errorf("fake snapd: no change %q", id)
	}
	return s.advanceUntil(ctx, func() bool {
		select {
		case <-ready:
			return true
		default:
			return false
		}
	}, ready, fmt.Sprintf("change %s", id))
}

// AdvanceUntilIdle is AdvanceUntilReady for every change in progress.
func (s *Server) AdvanceUntilIdle(ctx context.Context) error {
	idle := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.changes {
			if !statusReady(c.status()) {
				return false
			}
		}
		return true
	}
	return s.advanceUntil(ctx, idle, nil, "all changes")
}

func (s *Server) advanceUntil(ctx context.Context, done func() bool, ready <-chan struct{}, what string) error {
	mc, manual := s.clock.(*ManualClock)
	for !done() {
		if manual {
			if _, ok := mc.AdvanceToNext(); !ok {
				if done() {
					return nil
				}
				return fmt.Errorf("fake snapd: %s cannot become ready by advancing the clock (nothing scheduled; a foreign change or hook needs Finish)", what)
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			continue
		}
		s.mu.Lock()
		wake := s.stateWake
		s.mu.Unlock()
		if done() {
			return nil
		}
		select {
		case <-wake:
		case <-ready:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.closeCh:
			return errors.New("fake snapd: closed")
		}
	}
	return nil
}

// Conflicts returns how many requests were answered with a change conflict.
func (v View) Conflicts() int { return v.s.counters.Conflicts }
