package snapsvc

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// Test hooks: what the package's own tests need to see inside it, kept
// out of the package itself (as net/http's export_test.go does).

// subscriptionsChanged is closed and replaced at every subscription change
// of the shared waits (under processWaits.mu).
var subscriptionsChanged = make(chan struct{})

func init() {
	testHookSubscriptions = func() {
		close(subscriptionsChanged)
		subscriptionsChanged = make(chan struct{})
	}
}

// awaitSubscribers blocks until n callers wait on key's shared wait, or
// ctx ends.
func (s *waitRegistry) awaitSubscribers(ctx context.Context, key string, n int) error {
	for {
		s.mu.Lock()
		refs := 0
		if w := s.waits[key]; w != nil {
			refs = len(w.joins)
		}
		changed := subscriptionsChanged
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

// A move the hold lifecycle does not allow is a defect: every test of the
// package fails on one (budget_lifecycle.go, testHookBadMove).
var badMoves struct {
	sync.Mutex
	seen []string
}

func init() {
	testHookBadMove = func(from, to holdState) {
		badMoves.Lock()
		defer badMoves.Unlock()
		badMoves.seen = append(badMoves.seen, from.String()+" -> "+to.String())
	}
}

// BadHoldMoves returns the moves against the lifecycle seen so far.
func BadHoldMoves() []string {
	badMoves.Lock()
	defer badMoves.Unlock()
	return slices.Clone(badMoves.seen)
}

// SetFlightReadHook makes f run whenever a restart has read the phase of
// another process's flight it may join (machineflight.go), until the test ends.
func SetFlightReadHook(t interface{ Cleanup(func()) }, f func(phase string)) {
	testHookFlightRead = f
	t.Cleanup(func() { testHookFlightRead = func(string) {} })
}

// SetFactsWriteHook makes f run before each write of a machine observer's
// facts (machinewait.go), until the test ends.
func SetFactsWriteHook(t interface{ Cleanup(func()) }, f func()) {
	testHookFactsWrite = f
	t.Cleanup(func() { testHookFactsWrite = func() {} })
}

// SetWatchCloseHook makes f run as a Client's directory watch closes its
// inotify instance (watch.go), until the test ends.
func SetWatchCloseHook(t interface{ Cleanup(func()) }, f func()) {
	testHookWatchClose = f
	t.Cleanup(func() { testHookWatchClose = func() {} })
}
