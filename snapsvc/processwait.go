package snapsvc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// Waits in process scope (share.go says the rule): WaitChange and
// Operation.Wait on one change, and WaitIdle on one snap, the waits that
// take no lock. The first follower starts the watcher, a goroutine that
// waits on a call of its own that never gives up (detached from that
// follower's context, keeping its values, such as a logger); it publishes
// outcomes with the time their round of reads was sent, and since when
// snapd has been unreachable. It stops once its last follower left (or
// when no follower still needs a later round).
//
// Followers share a watcher only through Clients that would make the same
// requests: the same snapd (instance), socket, mode, hook and poll
// interval, on the real clock (a Client built WithClock shares only with
// itself).
type waitRegistry struct {
	mu    sync.Mutex
	waits map[string]*processWait
}

// processWait is one shared wait: its followers, and the facts its
// watcher publishes.
type processWait struct {
	joins   map[uint64]time.Time // when each follower still waiting joined (client clock)
	nextID  uint64
	cancel  func()        // stops the watcher
	news    chan struct{} // closed and replaced whenever a fact changes
	outcome *outcome      // the latest outcome, nil before the first
	// reachability
	downSince time.Time // zero while snapd answers
	downErr   error
}

// outcome is what one round of the watcher's reads found.
type outcome struct {
	val    any
	err    error
	readAt time.Time // when the round's reads were sent (client clock)
}

// processWaits holds the shared waits of the process.
var processWaits = waitRegistry{waits: map[string]*processWait{}}

// testHookSubscriptions is called, with the shared waits' lock held, at
// every subscription change (export_test.go sets it).
var testHookSubscriptions = func() {}

// newsLocked wakes the callers of w: a fact changed.
func (w *processWait) newsLocked() {
	close(w.news)
	w.news = make(chan struct{})
}

// clockKeys numbers the Clients built WithClock.
var clockKeys atomic.Uint64

// waitKey identifies what c waits for, for sharing.
func (c *Client) waitKey(what string) string {
	return fmt.Sprintf("%s\x00%s\x00%s\x00%v\x00%s\x00%s\x00%s", c.instance, c.main.Socket(), c.mode, c.poll, c.clockKey, c.hook, what)
}

// watchFunc is a shared wait's work: it runs on the watcher's call and
// tells read when each round of its reads was sent.
type watchFunc func(wk *call, read func(time.Time)) (any, error)

// share waits, on caller k's bounds, for an outcome of f read after k
// joined, running f on a watcher or joining the one under way for key. It
// reports whether the error, if any, is the outcome's (true) or the end of
// k's own bounds (false).
func (s *waitRegistry) share(k *call, key string, f watchFunc) (any, error, bool) {
	if err := k.ctx.Err(); err != nil {
		return nil, err, false
	}
	joined := k.c.clock.Now()
	s.mu.Lock()
	w := s.waits[key]
	if w == nil {
		w = s.start(k, key, f)
	}
	w.nextID++
	id := w.nextID
	w.joins[id] = joined
	testHookSubscriptions()
	s.mu.Unlock()
	defer s.leave(key, w, id)
	for {
		s.mu.Lock()
		out, news := w.outcome, w.news
		downSince, downErr := w.downSince, w.downErr
		s.mu.Unlock()
		if out != nil && !out.readAt.Before(joined) {
			return out.val, out.err, true
		}
		// The caller's own view of snapd's reachability, and its own
		// bound on it.
		k.noteSince(downErr, downSince)
		if err := k.exhausted(downErr); err != nil {
			return nil, err, false
		}
		if err := k.awaitNews(news); err != nil {
			return nil, err, false
		}
	}
}

// start begins a watcher for key on behalf of k, its first caller (s.mu
// held).
func (s *waitRegistry) start(k *call, key string, f watchFunc) *processWait {
	c := k.c
	wctx, cancel := context.WithCancel(context.WithoutCancel(k.ctx))
	w := &processWait{cancel: cancel, news: make(chan struct{}), joins: map[uint64]time.Time{}}
	s.waits[key] = w
	// The watcher's call never gives up: its callers do, each on its own
	// bounds. It paces its retries with the policy's intervals, but
	// re-dials a missing snapd at least as often as the default policy
	// does, whoever started it: a caller that joins later judges snapd's
	// absence by what the watcher sees, and re-dialling costs snapd
	// nothing, so a slow first caller must not make a later one give up
	// while snapd is already back.
	p := c.policy.WithDefaults()
	p.MaxElapsedTime, p.MaxUnreachable, p.MaxAttempts = -1, -1, 0
	p.RedialInterval = min(p.RedialInterval, retry.DefaultPolicy().RedialInterval)
	wk := &call{c: c, kind: callWait, rt: newRetrier(p), ev: k.ev, log: k.log, ctx: wctx, cancel: cancel, quiet: true}
	wk.onNote = func() {
		since, down := wk.rt.unreachableSince()
		s.mu.Lock()
		defer s.mu.Unlock()
		if !down {
			since = time.Time{}
		}
		if since.Equal(w.downSince) && (!down || wk.last == w.downErr) {
			return
		}
		w.downSince, w.downErr = since, nil
		if down {
			w.downErr = wk.last
		}
		w.newsLocked()
	}
	// scoped: ends once its last follower left (leave cancels it).
	go func() {
		defer cancel()
		for {
			var readAt time.Time
			val, err := f(wk, func(at time.Time) { readAt = at })
			if readAt.IsZero() {
				readAt = c.clock.Now()
			}
			s.mu.Lock()
			if wctx.Err() != nil { // every caller left
				if s.waits[key] == w {
					delete(s.waits, key)
				}
				s.mu.Unlock()
				return
			}
			w.outcome = &outcome{val: val, err: err, readAt: readAt}
			w.newsLocked()
			// Callers that joined after the round's reads were sent need
			// another round (the others take this outcome and leave);
			// with none, the watcher ends, and a caller that comes now
			// starts a new one.
			late := false
			for _, at := range w.joins {
				late = late || readAt.Before(at)
			}
			if !late {
				if s.waits[key] == w {
					delete(s.waits, key)
				}
				s.mu.Unlock()
				return
			}
			s.mu.Unlock()
		}
	}()
	return w
}

// leave ends a caller's subscription; the last one stops the watcher.
func (s *waitRegistry) leave(key string, w *processWait, id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(w.joins, id)
	if len(w.joins) == 0 {
		if s.waits[key] == w {
			delete(s.waits, key)
		}
		w.cancel()
	}
	testHookSubscriptions()
}

// change is waitChange for change id on k's bounds, shared with
// the process's other callers waiting for it.
func (s *waitRegistry) change(k *call, id string) (*snapd.Change, error) {
	c := k.c
	val, err, outcome := s.share(k, c.waitKey("change "+id), func(wk *call, read func(time.Time)) (any, error) {
		return waitChange(wk, id, waitOpts{read: read})
	})
	chg, _ := val.(*snapd.Change)
	if err != nil && !outcome {
		return nil, waitErr(err, []string{id})
	}
	return chg, err
}

// idle is waitIdle for snap on k's bounds, shared with the
// process's other callers waiting for snap to be idle.
func (s *waitRegistry) idle(k *call, snap string) error {
	c := k.c
	_, err, outcome := s.share(k, c.waitKey("idle "+snap), func(wk *call, read func(time.Time)) (any, error) {
		return nil, waitIdle(wk, snap, read)
	})
	if err != nil && !outcome {
		return fmt.Errorf("snapsvc: waiting for snap %q to be idle: %w", snap, err)
	}
	return err
}
