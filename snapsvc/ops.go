package snapsvc

import (
	"context"
	"slices"
	"sync"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// StartOptions modify Start.
type StartOptions struct {
	// Enable also enables the services, so they start at boot.
	Enable bool
}

// StopOptions modify Stop.
type StopOptions struct {
	// Disable also disables the services, so they stay stopped at boot.
	Disable bool
}

// RestartOptions modify Restart.
type RestartOptions struct {
	// Reload reloads services that support it instead of restarting them.
	Reload bool
}

// Result is the outcome of an operation that succeeded.
type Result struct {
	// ChangeID is snapd's change for the operation. It is empty in snapctl
	// mode, where snapd does not report it.
	ChangeID string
	// Status is the change's final status ("Done"), or "" when Queued.
	Status string
	// Queued is true inside a configure or default-configure hook: snapd
	// queued the command to run after the hook ends.
	Queued bool
	// Attempts counts the requests sent to act (1 when nothing conflicted).
	Attempts int
	// Conflicts counts the other changes that held the snap and that the
	// operation waited out: one per blocking change, however many times
	// snapd refused while it ran. Where the blocker cannot be seen (a
	// blind wait: snapctl without snap-refresh-observe, see EventConflict),
	// refusals in a row naming the same change kind count as one, as do
	// the refusals retried at a state file rewrite before the blocker is
	// listed. A conflict followed through another process of the machine
	// (which sends nothing) counts too.
	Conflicts int
	// Refused counts the attempts snapd refused with a change conflict:
	// in a blind wait, one per poll (Attempts counts every request).
	Refused int
	// WaitedFor lists other changes the operation waited out, where it
	// listed them (a conflict retried at a state file rewrite, or on the
	// blind cadence where the blocker cannot be listed, names none: see
	// EventConflict).
	WaitedFor []string
	// Shared is true when the call merged into an identical restart that
	// was waiting for the same snap, and reports that restart's change.
	Shared bool
	// NoUpdate is set by a Refresh that snapd answered has no updates
	// available: it made no change (ChangeID is empty), and the snap and
	// its services are as they were. An outcome, not an error.
	NoUpdate bool
}

// Start starts services ("snap.app") or all services of snaps ("snap") and
// waits until snapd's change is ready. Conflicts with other changes are
// waited out and retried; the result reports the change snapd made.
func (c *Client) Start(ctx context.Context, names []string, opts StartOptions) (*Result, error) {
	return c.runSync(ctx, "start", names, func(o *request) { o.enable = opts.Enable })
}

// Stop stops services and waits until snapd's change is ready.
func (c *Client) Stop(ctx context.Context, names []string, opts StopOptions) (*Result, error) {
	return c.runSync(ctx, "stop", names, func(o *request) { o.disable = opts.Disable })
}

// Restart restarts services and waits until snapd's change is ready.
func (c *Client) Restart(ctx context.Context, names []string, opts RestartOptions) (*Result, error) {
	return c.runSync(ctx, "restart", names, func(o *request) { o.reload = opts.Reload })
}

// StartAsync asks snapd to start services and returns as soon as snapd has
// accepted the request (after waiting out any conflict). Wait on the
// returned Operation for the outcome.
func (c *Client) StartAsync(ctx context.Context, names []string, opts StartOptions) (*Operation, error) {
	return c.runAsync(ctx, "start", names, func(o *request) { o.enable = opts.Enable })
}

// StopAsync is the asynchronous form of Stop.
func (c *Client) StopAsync(ctx context.Context, names []string, opts StopOptions) (*Operation, error) {
	return c.runAsync(ctx, "stop", names, func(o *request) { o.disable = opts.Disable })
}

// RestartAsync is the asynchronous form of Restart.
func (c *Client) RestartAsync(ctx context.Context, names []string, opts RestartOptions) (*Operation, error) {
	return c.runAsync(ctx, "restart", names, func(o *request) { o.reload = opts.Reload })
}

// Operation is an accepted request whose change may still be running.
type Operation struct {
	c  *Client
	op request

	mu     sync.Mutex
	result Result
	done   bool
	budget *asyncHold // WithRestartBudget: readiness and slot release
	obs    opObs      // observer events of the operation (reporting.go)
}

// ChangeID returns the change snapd made ("" when snapd did not say, in
// snapctl mode).
func (o *Operation) ChangeID() string { return o.Result().ChangeID }

// Result returns what is known of the operation so far: the change,
// attempts, conflicts and changes waited for; Status is set once the
// change is known to be ready.
func (o *Operation) Result() Result {
	o.mu.Lock()
	defer o.mu.Unlock()
	res := o.result
	res.WaitedFor = slices.Clone(res.WaitedFor)
	return res
}

// wait is Wait without the observer events.
func (o *Operation) wait(ctx context.Context) (*Result, error) {
	res := o.Result()
	o.mu.Lock()
	done := o.done
	o.mu.Unlock()
	if done {
		return &res, o.budgetWait(ctx)
	}
	var chg *snapd.Change
	err := o.c.callOf(ctx, callWait, o.op.action, o.op.t.names, func(k *call) (err error) {
		chg, err = processWaits.change(k, res.ChangeID)
		return err
	})
	if err != nil {
		return nil, o.c.opError(o.op, res.ChangeID, res.Attempts, err)
	}
	o.mu.Lock()
	o.result.Status = chg.Status
	o.done = true
	o.mu.Unlock()
	res.Status = chg.Status
	return &res, o.budgetWait(ctx)
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
		o.c.events.opEnded(o.op.action, o.op.t.names, started, res, err)
	}
	return res, err
}
