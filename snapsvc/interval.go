package snapsvc

import (
	"fmt"
	"strings"
	"time"
)

// keepInterval waits until every service o restarts was last restarted by
// this process at least the minimum restart interval ago
// (WithMinRestartInterval), so bursts of restarts cannot trip systemd's
// start limit. A whole-snap restart counts for each of its services and
// the other way round.
func (c *Client) keepInterval(k *call, o op) error {
	for c.mustKeepInterval(o) {
		wait := c.intervalLeft(o)
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

// mustKeepInterval reports whether o is a restart that must still wait.
func (c *Client) mustKeepInterval(o op) bool {
	return o.action == "restart" && c.minRestart > 0 && c.intervalLeft(o) > 0
}

func (c *Client) intervalLeft(o op) time.Duration {
	now := c.clock.Now()
	var wait time.Duration
	for _, s := range o.t.snaps {
		l := lockFor(c.instance, s)
		l.mu.Lock()
		for key, last := range l.lastRestart {
			if restartsOverlap(key, o.t.names) {
				if d := last.Add(c.minRestart).Sub(now); d > wait {
					wait = d
				}
			}
		}
		l.mu.Unlock()
	}
	return wait
}

// recordRestart notes that snapd accepted a restart of o's services now.
// Every Client records its restarts, with WithMinRestartInterval or not:
// the interval counts every restart made through the process.
func (c *Client) recordRestart(o op) {
	if o.action != "restart" {
		return
	}
	now := c.clock.Now()
	for _, s := range o.t.snaps {
		l := lockFor(c.instance, s)
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
