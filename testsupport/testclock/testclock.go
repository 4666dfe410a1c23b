// Package testclock lets a test drive snapsvc's client (a retry.Clock) and
// the fake snapd (a fake.Clock) with one manual clock that only the test
// moves, so tests wait on timers instead of sleeping.
package testclock

import (
	"context"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
)

// Clock is a fake.ManualClock that is also a retry.Clock.
type Clock struct{ *fake.ManualClock }

// Of wraps an existing manual clock.
func Of(mc *fake.ManualClock) Clock { return Clock{mc} }

// NewTimer implements retry.Clock on the manual clock.
func (c Clock) NewTimer(d time.Duration) retry.Timer {
	ch := make(chan time.Time, 1)
	t := c.AfterFunc(d, func() { ch <- c.Now() })
	return timer{ch: ch, t: t}
}

type timer struct {
	ch chan time.Time
	t  fake.Timer
}

func (t timer) C() <-chan time.Time { return t.ch }
func (t timer) Stop() bool          { return t.t.Stop() }

// WaitTimerAt blocks until a timer falls due exactly at want; it fails the
// test if ctx ends first.
func WaitTimerAt(ctx context.Context, t testing.TB, mc *fake.ManualClock, want time.Time) {
	t.Helper()
	for {
		added := mc.TimerAdded()
		if dl, ok := mc.NextDeadline(); ok && dl.Equal(want) {
			return
		}
		select {
		case <-added:
		case <-ctx.Done():
			next, _ := mc.NextDeadline()
			t.Fatalf("no timer due at %v (next: %v)", want, next)
		}
	}
}

// Drive runs the manual clock for code under test until done yields (an
// error, or any outcome the test sends) and returns what it yielded: it
// fires the next timer whenever one is due within limit of now (timers
// further out are left alone), and otherwise waits for a timer to be
// added.
func Drive[T any](t testing.TB, mc *fake.ManualClock, limit time.Duration, done <-chan T) T {
	t.Helper()
	for {
		added := mc.TimerAdded()
		if dl, ok := mc.NextDeadline(); ok && !dl.After(mc.Now().Add(limit)) {
			mc.AdvanceToNext()
			continue
		}
		select {
		case v := <-done:
			return v
		case <-added:
		}
	}
}
