package snapsvc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Shared waits: the callers of one process that wait for the same thing
// on the same snapd share one wait, so snapd's load does not grow with
// their number.
//
// Operations need nothing more: those on one snap hold the snap's lock in
// turn (lock.go), so however many callers of a process restart services
// of a snap behind a blocker, one of them at a time waits it out, and
// identical restarts merge (coalesce.go). What is shared here are the
// waits that take no lock: WaitChange and Operation.Wait on one change,
// and WaitIdle on one snap. The first caller's wait runs on its own
// (detached from that caller's context, keeping its values, such as a
// logger); every later caller subscribes to it; each caller returns at
// its own context's end, and the wait stops when the last one has left.
// Its outcome (the change, or the failure to see it) is every
// subscriber's; its events carry the first caller's template.
//
// Callers share a wait only through Clients that would make the same
// requests: the same snapd (instance), socket, mode, hook and poll interval, on
// the real clock (a Client built WithClock shares only with itself).
type sharedWaits struct {
	mu      sync.Mutex
	waits   map[string]*sharedWait
	changed chan struct{} // closed and replaced at every subscription change (tests)
}

type sharedWait struct {
	done   chan struct{}
	val    any
	err    error
	refs   int
	cancel context.CancelFunc
}

// processWaits holds the shared waits of the process.
var processWaits = sharedWaits{waits: map[string]*sharedWait{}, changed: make(chan struct{})}

// changedLocked wakes whoever waits for a subscription change.
func (s *sharedWaits) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// clockKeys numbers the Clients built WithClock.
var clockKeys atomic.Uint64

// waitKey identifies what c waits for, for sharing.
func (c *Client) waitKey(what string) string {
	return fmt.Sprintf("%s\x00%s\x00%s\x00%v\x00%s\x00%s\x00%s", c.instance, c.main.Socket(), c.mode, c.poll, c.clockKey, c.hook, what)
}

// share runs f, or subscribes to the run of f already under way for key,
// and returns its outcome, or ctx's end.
func (s *sharedWaits) share(ctx context.Context, key string, f func(context.Context) (any, error)) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	w := s.waits[key]
	if w == nil {
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		w = &sharedWait{done: make(chan struct{}), cancel: cancel}
		s.waits[key] = w
		go func() {
			val, err := f(wctx)
			s.mu.Lock()
			if s.waits[key] == w {
				delete(s.waits, key)
			}
			w.val, w.err = val, err
			s.mu.Unlock()
			close(w.done)
			cancel()
		}()
	}
	w.refs++
	s.changedLocked()
	s.mu.Unlock()
	select {
	case <-w.done:
		return w.val, w.err
	case <-ctx.Done():
		s.mu.Lock()
		if w.refs--; w.refs == 0 {
			if s.waits[key] == w {
				delete(s.waits, key)
			}
			w.cancel()
		}
		s.changedLocked()
		s.mu.Unlock()
		return nil, ctx.Err()
	}
}

// awaitSubscribers blocks until n callers wait on key's shared wait, or
// ctx ends (tests).
func (s *sharedWaits) awaitSubscribers(ctx context.Context, key string, n int) error {
	for {
		s.mu.Lock()
		refs := 0
		if w := s.waits[key]; w != nil {
			refs = w.refs
		}
		changed := s.changed
		s.mu.Unlock()
		if refs == n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%d callers share the wait, want %d: %w", refs, n, ctx.Err())
		}
	}
}

// sharedWaitChange is waitChange(ctx, id, waitOpts{ev: ev}), shared with
// the process's other callers waiting for change id.
func (c *Client) sharedWaitChange(ctx context.Context, id string, ev Event) (*snapd.Change, error) {
	val, err := processWaits.share(ctx, c.waitKey("change "+id), func(wctx context.Context) (any, error) {
		return c.waitChange(wctx, id, waitOpts{ev: ev})
	})
	chg, _ := val.(*snapd.Change)
	if err != nil && ctx.Err() != nil && chg == nil {
		return nil, ctxErr(ctx, "waiting for change "+id)
	}
	return chg, err
}

// sharedWaitIdle is waitIdle(ctx, snap), shared with the process's other
// callers waiting for snap to be idle.
func (c *Client) sharedWaitIdle(ctx context.Context, snap string) error {
	_, err := processWaits.share(ctx, c.waitKey("idle "+snap), func(wctx context.Context) (any, error) {
		return nil, c.waitIdle(wctx, snap)
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("snapsvc: waiting for snap %q to be idle: %w", snap, ctxErr(ctx, "waiting"))
	}
	return err
}
