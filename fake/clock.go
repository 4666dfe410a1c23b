package fake

import "time"

// Clock is the fake's source of time. Every timestamp the fake records or
// serves (request times, spawn/ready times, notices, task logs) and every
// duration it waits (service start/stop durations, snapctl timeouts, notice
// long-poll timeouts, injected latency) goes through it.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// AfterFunc calls f in its own goroutine (real clock) or from Advance
	// (manual clock) once d has elapsed on this clock.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc call.
type Timer interface {
	// Stop prevents the call from happening; it reports whether it did so.
	Stop() bool
}

// RealClock returns a Clock backed by the time package.
func RealClock() Clock { return realClock{} }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer {
	return time.AfterFunc(d, f)
}
