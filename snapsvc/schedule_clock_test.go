package snapsvc_test

import (
	"fmt"
	"sync"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)

// scheduleClock is snapd's clock in a schedule: off the client's by a
// skew, then stepped at an instant of the run. It remembers, for every
// reading it gave, the client's clock at that moment, so that the judge
// reads each of snapd's stamps (changes, requests, services' histories) on
// the client's clock, whatever the step did to their order.
type scheduleClock struct {
	skew, step time.Duration

	mu     sync.Mutex
	at     time.Time           // the step's instant (zero: none yet)
	client map[int64]time.Time // a reading's UnixNano -> the client's clock then
}

func newScheduleClock(skew, step time.Duration) *scheduleClock {
	return &scheduleClock{skew: skew, step: step, client: map[int64]time.Time{}}
}

// Now is snapd's clock.
func (c *scheduleClock) Now() time.Time {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	off := c.skew
	if !c.at.IsZero() && !now.Before(c.at) {
		off += c.step
	}
	t := now.Add(off)
	c.client[t.UnixNano()] = now
	return t
}

// AfterFunc is the real timer (the fake's timers count durations).
func (c *scheduleClock) AfterFunc(d time.Duration, f func()) fake.Timer {
	return time.AfterFunc(d, f)
}

// wall is the machine's wall clock at a client's reading t: it steps with
// snapd's, as on one machine (the skew is snapd's alone, a snapd with a
// clock of its own).
func (c *scheduleClock) wall(t time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && !t.Before(c.at) {
		return t.Round(0).Add(c.step)
	}
	return t.Round(0)
}

// stepAt makes the clock step at at (the client's clock).
func (c *scheduleClock) stepAt(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = at
}

// clientTime returns the client's clock when snapd's read t (zero stays
// zero). A stamp the clock never gave is the judge's own mistake.
func (c *scheduleClock) clientTime(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ct, ok := c.client[t.UnixNano()]
	if !ok {
		panic(fmt.Sprintf("snapd's stamp %v was not read from the schedule's clock", t))
	}
	return ct
}

// changes returns the fake's changes by id, their times on the client's
// clock.
func (s *schedule) changes(srv *fake.Server) map[string]fake.ChangeInfo {
	m := map[string]fake.ChangeInfo{}
	for _, ci := range srv.Changes() {
		ci.SpawnTime, ci.ReadyTime = s.clock.clientTime(ci.SpawnTime), s.clock.clientTime(ci.ReadyTime)
		m[ci.ID] = ci
	}
	return m
}

// requests returns the fake's requests, their times on the client's
// clock.
func (s *schedule) requests(srv *fake.Server) []fake.Request {
	rs := srv.Requests()
	for i := range rs {
		rs[i].Time, rs[i].Done = s.clock.clientTime(rs[i].Time), s.clock.clientTime(rs[i].Done)
	}
	return rs
}

// history returns the fake's history of snap.app, its times on the
// client's clock.
func (s *schedule) history(srv *fake.Server, snap, app string) []fake.ServiceStateAt {
	h := srv.ServiceHistory(snap, app)
	for i := range h {
		h[i].At = s.clock.clientTime(h[i].At)
	}
	return h
}
