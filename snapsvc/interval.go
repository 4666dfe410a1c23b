package snapsvc

import (
	"fmt"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// keepInterval waits until every service o restarts was last restarted by
// this process at least the minimum restart interval ago
// (WithMinRestartInterval), so bursts of restarts cannot trip systemd's
// start limit. A whole-snap restart counts for each of its services and
// the other way round.
func (k *call) keepInterval(o op) error {
	for k.c.interval.must(o) {
		wait := k.c.interval.left(o)
		if wait <= 0 {
			return nil
		}
		k.log.Info("pacing restart", "names", o.t.String(), "wait", wait)
		if err := k.sleep(wait); err != nil {
			return fmt.Errorf("waiting for the minimum restart interval: %w", err)
		}
	}
	return nil
}

// restartInterval keeps restarts of one service made through the process
// at least min apart (WithMinRestartInterval; 0: no limit). The last
// restart of each service is kept in the process's registry of snaps
// (lock.go), so every Client of the process counts.
type restartInterval struct {
	snaps processSnaps
	min   time.Duration
	clock retry.Clock
}

// must reports whether o is a restart that must still wait.
func (ri restartInterval) must(o op) bool {
	return o.action == "restart" && ri.min > 0 && ri.left(o) > 0
}

// left returns how long o must still wait.
func (ri restartInterval) left(o op) time.Duration {
	now := ri.clock.Now()
	var wait time.Duration
	for _, s := range o.t.snaps {
		l := ri.snaps.of(s)
		l.mu.Lock()
		for key, last := range l.lastRestart {
			if restartsOverlap(key, o.t.names) {
				if d := last.Add(ri.min).Sub(now); d > wait {
					wait = d
				}
			}
		}
		l.mu.Unlock()
	}
	return wait
}

// record notes that snapd accepted a restart of o's services now. Every
// Client records its restarts, with WithMinRestartInterval or not: the
// interval counts every restart made through the process.
func (ri restartInterval) record(o op) {
	if o.action != "restart" {
		return
	}
	now := ri.clock.Now()
	for _, s := range o.t.snaps {
		l := ri.snaps.of(s)
		l.mu.Lock()
		if l.lastRestart == nil {
			l.lastRestart = map[string]time.Time{}
		}
		for _, n := range o.t.names {
			if snapOf(n) == s {
				l.lastRestart[n] = now
			}
		}
		l.mu.Unlock()
	}
}

// restartsOverlap reports whether restarting names touches the service (or
// snap) key.
func restartsOverlap(key string, names []string) bool {
	for _, n := range names {
		if n == key || n == snapOf(key) || key == snapOf(n) {
			return true
		}
	}
	return false
}

func snapOf(name string) string {
	snap, _, _ := strings.Cut(name, ".")
	return snap
}
