package probe_test

import (
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
)

// manualClock adapts the fake's ManualClock to retry.Clock.
type manualClock struct{ mc *fake.ManualClock }

func (c manualClock) Now() time.Time { return c.mc.Now() }

func (c manualClock) NewTimer(d time.Duration) retry.Timer {
	ch := make(chan time.Time, 1)
	t := c.mc.AfterFunc(d, func() { ch <- c.mc.Now() })
	return manualTimer{ch: ch, t: t}
}

type manualTimer struct {
	ch chan time.Time
	t  fake.Timer
}

func (t manualTimer) C() <-chan time.Time { return t.ch }
func (t manualTimer) Stop() bool          { return t.t.Stop() }

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// drive runs the manual clock for code under test until errc yields: it
// fires the next timer whenever one is due within limit of now (timers
// further out, such as generous check timeouts, are left alone), and
// otherwise waits for a timer to be added.
func drive(t *testing.T, mc *fake.ManualClock, limit time.Duration, errc <-chan error) error {
	t.Helper()
	for {
		added := mc.TimerAdded()
		if dl, ok := mc.NextDeadline(); ok && !dl.After(mc.Now().Add(limit)) {
			mc.AdvanceToNext()
			continue
		}
		select {
		case err := <-errc:
			return err
		case <-added:
		}
	}
}
