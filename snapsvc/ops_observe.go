package snapsvc

import (
	"context"
	"errors"
	"time"
)

// Operation events: every Start, Stop and Restart (and their Async forms)
// emits EventStarted, then EventAccepted once snapd accepted the request
// (from run.go), then exactly one of EventDone and EventFailed, each with
// Elapsed, the time since EventStarted, and ChangeID when a change was
// made. For an Async operation the end is emitted by the first Wait that
// sees it (an operation nobody waits for only reports its acceptance, or
// its failure to be accepted).

// opObs is what an Operation remembers for its end event.
type opObs struct {
	started time.Time
	ended   bool
}

// now is the client's clock.
func (c *Client) now() time.Time { return c.clock.Now() }

func (c *Client) opStarted(action string, names []string) time.Time {
	at := c.now()
	c.emit(Event{Kind: EventStarted, Op: action, Names: names})
	return at
}

// opEnded emits EventDone or EventFailed.
func (c *Client) opEnded(action string, names []string, started time.Time, res *Result, err error) {
	ev := Event{Kind: EventDone, Op: action, Names: names, Elapsed: c.now().Sub(started), Err: err}
	if res != nil {
		ev.ChangeID, ev.Status, ev.Attempt, ev.Conflicts = res.ChangeID, res.Status, res.Attempts, res.Conflicts
	}
	if err != nil {
		ev.Kind = EventFailed
		var oe *OpError
		if errors.As(err, &oe) {
			ev.ChangeID, ev.Attempt = oe.ChangeID, oe.Attempts
		}
	}
	c.emit(ev)
}

func (c *Client) observedSync(ctx context.Context, action string, names []string, set func(*op)) (*Result, error) {
	started := c.opStarted(action, names)
	res, err := c.runSync(ctx, action, names, set)
	c.opEnded(action, names, started, res, err)
	return res, err
}

func (c *Client) observedAsync(ctx context.Context, action string, names []string, set func(*op)) (*Operation, error) {
	started := c.opStarted(action, names)
	o, err := c.runAsync(ctx, action, names, set)
	if err != nil {
		c.opEnded(action, names, started, nil, err)
		return nil, err
	}
	o.mu.Lock()
	o.obs.started = started
	o.mu.Unlock()
	return o, nil
}

// Wait waits for the operation's change and returns its outcome. It may be
// called more than once, from several goroutines. The first call that sees
// the outcome emits EventDone or EventFailed; a Wait whose context ends
// first emits nothing (the operation has not ended).
func (o *Operation) Wait(ctx context.Context) (*Result, error) {
	res, err := o.wait(ctx)
	if err != nil && ctx.Err() != nil {
		return res, err
	}
	o.mu.Lock()
	started, ended := o.obs.started, o.obs.ended
	o.obs.ended = true
	o.mu.Unlock()
	if !ended && !started.IsZero() {
		o.c.opEnded(o.op.action, o.op.t.names, started, res, err)
	}
	return res, err
}
