package snapsvc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// Bounds. A call returns by the earlier of its context's deadline and the
// end of its policy's MaxElapsedTime, on the policy's clock, plus a small
// epsilon (scheduling, closing the request in flight): the policy's time is
// enforced as a deadline on every request, not only between attempts, so
// a snapd that accepts connections and never answers cannot hold a call.
// Nothing the call does is sent after its bound; what must still happen
// (looking up the change of a request cut off in flight, so the next
// operation waits for it) runs in the background, owned by the Client and
// ended by Close.

// policyTimeError is the cause of a context ended by the policy's
// MaxElapsedTime. It matches ErrGaveUp.
type policyTimeError struct{ d time.Duration }

func (e *policyTimeError) Error() string {
	return fmt.Sprintf("gave up after %v (the policy's MaxElapsedTime)", e.d)
}

func (e *policyTimeError) Is(target error) bool { return target == ErrGaveUp }

// bound returns ctx, ended also once the policy's MaxElapsedTime has
// passed from now (when the policy sets one), on the real clock.
func (c *Client) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return boundBy(ctx, c.clock, c.policy.MaxElapsedTime)
}

// boundBy returns ctx ended also after d (d <= 0: no bound) on the real
// clock.
func boundBy(ctx context.Context, clock retry.Clock, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	if clock != nil && clock != retry.RealClock() {
		// A test's clock (WithClock) drives the pauses, and its timers
		// may fire at once: the policy's time is then checked between
		// attempts only.
		return ctx, func() {}
	}
	return context.WithDeadlineCause(ctx, time.Now().Add(d), &policyTimeError{d: d})
}

// background runs the work a Client still owes after a call returned
// (each job bounded); Close ends it and waits for it.
type background struct {
	mu     sync.Mutex
	closed bool
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newBackground() *background {
	b := &background{}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b
}

// do runs f in the background with a context ended by Close, at most d
// long. It reports false, without running f, once the Client is closed.
func (b *background) do(d time.Duration, f func(ctx context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		ctx, cancel := context.WithTimeout(b.ctx, d)
		defer cancel()
		f(ctx)
	}()
	return true
}

// close ends the background work and waits for it.
func (b *background) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}
