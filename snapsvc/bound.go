package snapsvc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// Bounds: every call's are stated once, in call.go, and held by its call
// value. The policy's time is enforced as a deadline on every request, not
// only between attempts, so a snapd that accepts connections and never
// answers cannot hold a call. Nothing the call does is sent after its
// bound; what must still happen (looking up the change of a request cut
// off in flight, so the next operation waits for it) runs in the
// background, owned by the Client and ended by Close.

// policyTimeError is the cause of a context ended by the policy's
// MaxElapsedTime. It matches ErrGaveUp.
type policyTimeError struct{ d time.Duration }

func (e *policyTimeError) Error() string {
	return fmt.Sprintf("gave up after %v (the policy's MaxElapsedTime)", e.d)
}

func (e *policyTimeError) Is(target error) bool { return target == ErrGaveUp }

// lookupReserve is the most of a call's time a request to act leaves for
// looking up its change should its answer still be pending at the end; it
// is at most a quarter of the time left when the request is sent.
const lookupReserve = 100 * time.Millisecond

// reserveLookup returns ctx ended lookupReserve (or a quarter of the time
// left) before its deadline, for a request to act.
func reserveLookup(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	reserve := min(lookupReserve, time.Until(dl)/4)
	return context.WithDeadline(ctx, dl.Add(-reserve))
}

// deadlineCauseKey carries the cause of a call's deadline (bound).
type deadlineCauseKey struct{}

// deadlineCause returns why ctx ended, or will end at its deadline: the
// policy's time when bound set the earlier deadline, else the context's.
func deadlineCause(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if err, ok := ctx.Value(deadlineCauseKey{}).(error); ok {
		return err
	}
	return context.DeadlineExceeded
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
	at := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && !at.Before(dl) {
		return ctx, func() {} // the caller's deadline comes first
	}
	cause := &policyTimeError{d: d}
	ctx = context.WithValue(ctx, deadlineCauseKey{}, error(cause))
	return context.WithDeadlineCause(ctx, at, cause)
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
