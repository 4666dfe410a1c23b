package testclock

import "time"

// Lateness measures how late the machine's timers fire while a test runs:
// a 5 ms timer, again and again, on a goroutine of its own. Nothing the
// test times can be expected sooner than that: on a busy machine every
// goroutine is delayed alike, the code's as much as the test's. A test
// that asserts a real-time bound adds Stop's result to it, so that the
// bound stays about the code, not the machine.
type Lateness struct {
	stopped chan struct{}
	done    chan time.Duration
}

// StartLateness starts measuring.
func StartLateness() *Lateness {
	l := &Lateness{stopped: make(chan struct{}), done: make(chan time.Duration, 1)}
	go func() {
		var worst time.Duration
		const tick = 5 * time.Millisecond
		for {
			due := time.Now().Add(tick)
			t := time.NewTimer(tick)
			select {
			case <-t.C:
				worst = max(worst, time.Since(due))
			case <-l.stopped:
				t.Stop()
				l.done <- worst
				return
			}
		}
	}()
	return l
}

// Stop ends the measure and returns the latest a timer fired. It may be
// called once.
func (l *Lateness) Stop() time.Duration {
	close(l.stopped)
	return <-l.done
}
