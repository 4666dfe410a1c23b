package fake

import (
	"sort"
	"sync"
	"time"
)

// ManualClock is a Clock that only moves when told to. Timers fire
// synchronously, in deadline order, from Advance/AdvanceToNext/Set.
// It is safe for concurrent use.
type ManualClock struct {
	mu     sync.Mutex
	now    time.Time
	seq    int
	timers []*manualTimer
	// changed is closed and replaced whenever a timer is added.
	changed chan struct{}
}

type manualTimer struct {
	c        *ManualClock
	deadline time.Time
	seq      int
	f        func()
	stopped  bool
	fired    bool
}

// NewManualClock returns a ManualClock reading t0.
func NewManualClock(t0 time.Time) *ManualClock {
	return &ManualClock{now: t0, changed: make(chan struct{})}
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc registers f to run when the clock has advanced by d.
// A non-positive d runs f in a new goroutine right away, like time.AfterFunc.
func (c *ManualClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &manualTimer{c: c, deadline: c.now.Add(d), f: f}
	if d <= 0 {
		t.fired = true
		go f()
		return t
	}
	c.seq++
	t.seq = c.seq
	c.timers = append(c.timers, t)
	close(c.changed)
	c.changed = make(chan struct{})
	return t
}

func (t *manualTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.stopped || t.fired {
		return false
	}
	t.stopped = true
	for i, o := range t.c.timers {
		if o == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			break
		}
	}
	return true
}

// Advance moves the clock forward by d, firing every timer that falls due,
// each at its own deadline. Timers created by fired callbacks that fall due
// within the window fire too.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	c.advanceTo(target)
}

// Set moves the clock to t (which must not be before Now), firing due timers.
func (c *ManualClock) Set(t time.Time) { c.advanceTo(t) }

// AdvanceToNext moves the clock to the earliest pending timer's deadline and
// fires it (and any others due at that instant). It reports how far the
// clock moved and false when no timer was pending.
func (c *ManualClock) AdvanceToNext() (time.Duration, bool) {
	c.mu.Lock()
	if len(c.timers) == 0 {
		c.mu.Unlock()
		return 0, false
	}
	c.sortLocked()
	start := c.now
	target := c.timers[0].deadline
	c.mu.Unlock()
	c.advanceTo(target)
	return target.Sub(start), true
}

// Pending reports how many timers are waiting to fire.
func (c *ManualClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// NextDeadline returns the earliest pending timer's deadline.
func (c *ManualClock) NextDeadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.timers) == 0 {
		return time.Time{}, false
	}
	c.sortLocked()
	return c.timers[0].deadline, true
}

// TimerAdded returns a channel closed the next time a timer is registered;
// tests use it to wait until code under test has started waiting on the clock.
func (c *ManualClock) TimerAdded() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

func (c *ManualClock) sortLocked() {
	sort.SliceStable(c.timers, func(i, j int) bool {
		a, b := c.timers[i], c.timers[j]
		if !a.deadline.Equal(b.deadline) {
			return a.deadline.Before(b.deadline)
		}
		return a.seq < b.seq
	})
}

func (c *ManualClock) advanceTo(target time.Time) {
	for {
		c.mu.Lock()
		c.sortLocked()
		if len(c.timers) == 0 || c.timers[0].deadline.After(target) {
			if target.After(c.now) {
				c.now = target
			}
			c.mu.Unlock()
			return
		}
		t := c.timers[0]
		c.timers = c.timers[1:]
		if t.deadline.After(c.now) {
			c.now = t.deadline
		}
		t.fired = true
		c.mu.Unlock()
		t.f()
	}
}
