package snapsvc

import (
	"context"
	"sync"
	"time"
)

// background is the one tracker of the work a Client still owes after a
// call returned, or must finish beside a call without holding it up: a
// bounded look-up for the change of a request cut off before its answer, the
// facts a watcher publishes, a flight entered while the call's time ran
// out, a budget slot held until its change is ready, a slot's release and
// its retries. Close ends it and waits for it.
//
// Every other goroutine of the package is scoped: joined before the
// function that starts it returns, or by the owner that started it (a
// hold's listeners for lost slots, its MaxHold timer), or, for a wait
// shared by the callers of a process (processwait.go), ended by its last
// caller's leaving.
type background struct {
	mu      sync.Mutex
	closed  bool
	running int           // jobs under way
	idle    chan struct{} // closed while running is 0; a new one once it is not
	ctx     context.Context
	cancel  context.CancelFunc // ends the jobs of do (Close)
}

func newBackground() *background {
	b := &background{idle: make(chan struct{})}
	close(b.idle)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	return b
}

// start counts a job in (b.mu held).
func (b *background) startLocked() {
	if b.running == 0 {
		b.idle = make(chan struct{})
	}
	b.running++
}

// done counts a job out.
func (b *background) done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running--; b.running == 0 {
		close(b.idle)
	}
}

// do runs f in the background with a context ended by Close, at most d
// long. It reports false, without running f, once the Client is closed.
func (b *background) do(d time.Duration, f func(ctx context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	b.startLocked()
	go func() {
		defer b.done()
		ctx, cancel := context.WithTimeout(b.ctx, d)
		defer cancel()
		f(ctx)
	}()
	return true
}

// run runs f in the background, even once the Client is closed: work
// whose bounds are its own (a budget hold, which Close ends through its
// own context; a slot's release, whose first attempt runs whatever
// happens). Close waits for it.
func (b *background) run(f func()) {
	b.mu.Lock()
	b.startLocked()
	b.mu.Unlock()
	go func() {
		defer b.done()
		f()
	}()
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

// awaitIdle waits until no job runs, or for at most d: Close waits for a
// budget's releases this long (BudgetOptions.ReleaseTimeout).
func (b *background) awaitIdle(d time.Duration) {
	b.mu.Lock()
	idle := b.idle
	b.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}

// stop ends the jobs of do (their contexts) and refuses new ones.
func (b *background) stop() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
}

// close stops the background work and waits for all of it.
func (b *background) close() {
	b.stop()
	for {
		b.mu.Lock()
		idle, running := b.idle, b.running
		b.mu.Unlock()
		if running == 0 {
			return
		}
		<-idle
	}
}
