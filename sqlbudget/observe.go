package sqlbudget

// Whose clock decides expiry: the observer's monotonic clock.
//
// Every write that renews a row (a holder's renewal or fence, a
// waiter's write) bumps its renewal counter, beat, and says how long the
// row lives without another one (lease_ms). An observer (a waiter, a
// Status reader) remembers, on its own monotonic clock, when it first saw
// each row's current beat: from the end of the transaction that read it,
// which is after the write that made it committed. Only once it has seen
// a row keep one beat for the row's lease may it treat the row as
// expired, and then it removes or overrides it in a transaction that
// reads the same beat (a renewal that raced it wins). The holder, for its
// part, takes itself for lost ClockSkew before the send time of its last
// answered renewal plus the TTL: before any observer can have watched
// that long. The database's clock is only recorded, for humans (Status);
// it decides nothing, so a step of it (an NTP step after a VM pause, a
// node booted with a wrong RTC, a dqlite leader change between nodes
// whose clocks disagree) frees no slot and holds none back. This is how
// etcd's lessor times leases on its leader's monotonic clock, and why
// Chubby's and Consul's lock-delays count from the observer's own
// judgement (Burrows, "The Chubby lock service", OSDI 2006, 2.4; Consul's
// session lock-delay).
//
// The cost: an observer that has seen nothing (a new process, one
// restarted) must watch a row for its lease before it may expire it, so
// a vanished holder's slot comes free up to one TTL later in a process
// that starts after the holder vanished than in one that watched it.

import (
	"sync"
	"time"
)

// sighting is what an observer knows of one row: the beat it saw, and
// when (local monotonic clock) it first saw that beat.
type sighting struct {
	beat  int64
	since time.Time // end of the transaction that first read beat
	last  time.Time // end of the transaction that last read it
}

// observer is a Budget's memory of the rows it has read, shared by its
// waiters, holders and Status.
type observer struct {
	mu      sync.Mutex
	seen    map[string]sighting // by token
	records int
}

// forgetAfter is how long a row unread is remembered.
const forgetAfter = 2 * maxInterval

// silent returns how long the observer has seen token keep beat, at now:
// zero when it has never seen that beat (it has not seen the row, or the
// row was renewed since).
func (o *observer) silent(token string, beat int64, now time.Time) time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.seen[token]
	if !ok || s.beat != beat {
		return 0
	}
	return max(now.Sub(s.since), 0)
}

// beats is what one transaction read: the beat of each row.
type beats map[string]int64

func (b *beats) add(token string, beat int64) {
	if b == nil {
		return
	}
	if *b == nil {
		*b = beats{}
	}
	(*b)[token] = beat
}

// record notes what a transaction that returned at at read.
func (o *observer) record(read beats, at time.Time) {
	if len(read) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen == nil {
		o.seen = map[string]sighting{}
	}
	for token, beat := range read {
		s, ok := o.seen[token]
		if !ok || s.beat != beat {
			s = sighting{beat: beat, since: at}
		}
		s.last = at
		o.seen[token] = s
	}
	o.records++
	if o.records%256 == 0 {
		for token, s := range o.seen {
			if at.Sub(s.last) > forgetAfter {
				delete(o.seen, token)
			}
		}
	}
}
