package snapsvc

import (
	"context"
	"sync"
	"time"
)

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

// doAwaited runs f as do does and waits for it until ctx ends: work that
// a call should see done when it can (a lock let go of, a record written)
// but must not wait for past its bound (a write the file system holds up).
// Where the Client is closing, f runs in place.
func (b *background) doAwaited(ctx context.Context, d time.Duration, f func(ctx context.Context)) {
	done := make(chan struct{})
	if !b.do(d, func(ctx context.Context) { defer close(done); f(ctx) }) {
		f(context.Background())
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}
