package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	// Conflicts counts the attempts snapd refused with a change conflict.
	Conflicts int
	// WaitedFor lists other changes the operation waited out, where it
	// listed them (a conflict retried at a state file rewrite, or on the
	// blind cadence where the blocker cannot be listed, names none: see
	// EventConflict).
	WaitedFor []string
	// Shared is true when the call merged into an identical restart that
	// was waiting for the same snap, and reports that restart's change.
	Shared bool
}

// op is one validated request.
type op struct {
	action  string
	enable  bool
	disable bool
	reload  bool
	t       target
}

func (o op) instruction() snapd.AppInstruction {
	return snapd.AppInstruction{Action: o.action, Names: o.t.names, Enable: o.enable, Disable: o.disable, Reload: o.reload}
}

func (o op) snapctlArgs() []string {
	args := []string{o.action}
	switch {
	case o.enable:
		args = append(args, "--enable")
	case o.disable:
		args = append(args, "--disable")
	case o.reload:
		args = append(args, "--reload")
	}
	return append(args, o.t.names...)
}

// key identifies identical requests (for coalescing).
func (o op) key() string {
	names := slices.Clone(o.t.names)
	slices.Sort(names)
	return fmt.Sprintf("%s|%t|%t|%t|%s", o.action, o.enable, o.disable, o.reload, strings.Join(names, ","))
}

// Start starts services ("snap.app") or all services of snaps ("snap") and
// waits until snapd's change is ready. Conflicts with other changes are
// waited out and retried; the result reports the change snapd made.
func (c *Client) Start(ctx context.Context, names []string, opts StartOptions) (*Result, error) {
	return c.observedSync(ctx, "start", names, func(o *op) { o.enable = opts.Enable })
}

// Stop stops services and waits until snapd's change is ready.
func (c *Client) Stop(ctx context.Context, names []string, opts StopOptions) (*Result, error) {
	return c.observedSync(ctx, "stop", names, func(o *op) { o.disable = opts.Disable })
}

// Restart restarts services and waits until snapd's change is ready.
func (c *Client) Restart(ctx context.Context, names []string, opts RestartOptions) (*Result, error) {
	return c.observedSync(ctx, "restart", names, func(o *op) { o.reload = opts.Reload })
}

// StartAsync asks snapd to start services and returns as soon as snapd has
// accepted the request (after waiting out any conflict). Wait on the
// returned Operation for the outcome.
func (c *Client) StartAsync(ctx context.Context, names []string, opts StartOptions) (*Operation, error) {
	return c.observedAsync(ctx, "start", names, func(o *op) { o.enable = opts.Enable })
}

// StopAsync is the asynchronous form of Stop.
func (c *Client) StopAsync(ctx context.Context, names []string, opts StopOptions) (*Operation, error) {
	return c.observedAsync(ctx, "stop", names, func(o *op) { o.disable = opts.Disable })
}

// RestartAsync is the asynchronous form of Restart.
func (c *Client) RestartAsync(ctx context.Context, names []string, opts RestartOptions) (*Operation, error) {
	return c.observedAsync(ctx, "restart", names, func(o *op) { o.reload = opts.Reload })
}

// Operation is an accepted request whose change may still be running.
type Operation struct {
	c  *Client
	op op

	mu     sync.Mutex
	result Result
	done   bool
	budget *asyncHold // WithRestartBudget: readiness and slot release
	obs    opObs      // observer events of the operation (ops_observe.go)
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
		chg, err = o.c.sharedWaitChange(k, res.ChangeID)
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

func (c *Client) prepare(action string, names []string, set func(*op)) (op, error) {
	o := op{action: action}
	set(&o)
	t, err := parseTarget(names)
	if err != nil {
		o.t.names = names // the error names the input
		return o, c.opError(o, "", 0, err)
	}
	o.t = t
	if c.mode == ModeSnapctl && c.ownSnap != "" {
		for _, s := range t.snaps {
			if s != c.ownSnap {
				return o, c.opError(o, "", 0, fmt.Errorf("%w: %q is not a service of snap %q, the only snap snapctl controls from here", ErrWrongSnap, s, c.ownSnap))
			}
		}
	}
	return o, nil
}

// runSync is the life of one synchronous operation (run.go): bound, pace
// and budget, lock to verdict (identical restarts coalesced), release.
func (c *Client) runSync(ctx context.Context, action string, names []string, set func(*op)) (*Result, error) {
	o, err := c.prepare(action, names, set)
	if err != nil {
		return nil, err
	}
	k := c.newOpCall(ctx, o)
	defer k.end()
	return c.operate(k, o)
}

// operate is budget, lock to verdict, and release of operation o on its
// call k.
func (c *Client) operate(k *call, o op) (*Result, error) {
	h, err := c.takeBudget(k, o)
	if err != nil {
		return nil, err
	}
	k.hold = h
	res, err := c.coalesce(k, o)
	if h != nil {
		err = c.releaseBudget(k, o, h, res, err)
	}
	if err != nil {
		return nil, err
	}
	return res, nil
}

// runAsync is runSync up to snapd's acceptance; the wait, and the release
// of the budget's slots, go on in the background (budget.go, holdAsync).
func (c *Client) runAsync(ctx context.Context, action string, names []string, set func(*op)) (*Operation, error) {
	o, err := c.prepare(action, names, set)
	if err != nil {
		return nil, err
	}
	k := c.newOpCall(ctx, o)
	defer k.end()
	h, err := c.takeBudget(k, o)
	if err != nil {
		return nil, err
	}
	k.hold = h
	res, done, err := c.run(k, o, false)
	if err != nil {
		if h != nil {
			err = c.releaseBudget(k, o, h, nil, err)
		}
		return nil, err
	}
	op := &Operation{c: c, op: o, result: *res, done: done}
	if h != nil {
		c.holdAsync(k, op, h, done)
	}
	return op, nil
}

// newOpCall begins the call of operation o, its log lines naming it.
func (c *Client) newOpCall(ctx context.Context, o op) *call {
	k := c.newCall(ctx, callOp, o.action, o.t.names)
	k.log = k.log.With("snap", strings.Join(o.t.snaps, ","), "action", o.action, "names", o.t.String())
	return k
}

func (c *Client) opError(o op, changeID string, attempts int, err error) error {
	return &OpError{Op: o.action, Snap: strings.Join(o.t.snaps, ","), Names: o.t.names, ChangeID: changeID, Attempts: attempts, Err: err}
}

// finish waits for the operation's change (wait) or records it as pending
// for the next operation on these snaps (async).
func (c *Client) finish(k *call, o op, res *Result, wait bool, wo waitOpts) (*Result, bool, error) {
	if !wait {
		c.addPending(o, res.ChangeID)
		return res, false, nil
	}
	chg, err := c.waitChange(k.ownChange(), res.ChangeID, wo)
	if err != nil {
		var ce *ChangeError
		if !errors.As(err, &ce) {
			// Could not see the end; let the next operation wait for it.
			c.addPending(o, res.ChangeID)
			if wo.found {
				err = adoptedWaitError(res.ChangeID, err)
			}
		}
		k.log.Info("change failed", "change", res.ChangeID, "error", err)
		return nil, false, c.opError(o, res.ChangeID, res.Attempts, err)
	}
	res.Status = chg.Status
	k.log.Info("change done", "change", res.ChangeID, "attempt", res.Attempts)
	return res, true, nil
}

// addPending records a change of this process that the next operation on
// the same snaps must wait for.
func (c *Client) addPending(o op, id string) {
	for _, s := range o.t.snaps {
		lockFor(c.instance, s).addPending(id)
	}
}

// send makes one request to act.
func (c *Client) send(ctx context.Context, o op) (string, error) {
	if c.mode == ModeSnapctl {
		_, err := c.ctl.RunSnapctl(ctx, snapd.SnapctlRequest{ContextID: c.cookie, Args: o.snapctlArgs()})
		return "", err
	}
	return c.main.PostApps(ctx, o.instruction())
}

func appendNew(list []string, ids ...string) []string {
	for _, id := range ids {
		if !slices.Contains(list, id) {
			list = append(list, id)
		}
	}
	return list
}
