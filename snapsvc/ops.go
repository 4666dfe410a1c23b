package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
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
	// WaitedFor lists other changes the operation waited out.
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
	return c.runSync(ctx, "start", names, func(o *op) { o.enable = opts.Enable })
}

// Stop stops services and waits until snapd's change is ready.
func (c *Client) Stop(ctx context.Context, names []string, opts StopOptions) (*Result, error) {
	return c.runSync(ctx, "stop", names, func(o *op) { o.disable = opts.Disable })
}

// Restart restarts services and waits until snapd's change is ready.
func (c *Client) Restart(ctx context.Context, names []string, opts RestartOptions) (*Result, error) {
	return c.runSync(ctx, "restart", names, func(o *op) { o.reload = opts.Reload })
}

// StartAsync asks snapd to start services and returns as soon as snapd has
// accepted the request (after waiting out any conflict). Wait on the
// returned Operation for the outcome.
func (c *Client) StartAsync(ctx context.Context, names []string, opts StartOptions) (*Operation, error) {
	return c.runAsync(ctx, "start", names, func(o *op) { o.enable = opts.Enable })
}

// StopAsync is the asynchronous form of Stop.
func (c *Client) StopAsync(ctx context.Context, names []string, opts StopOptions) (*Operation, error) {
	return c.runAsync(ctx, "stop", names, func(o *op) { o.disable = opts.Disable })
}

// RestartAsync is the asynchronous form of Restart.
func (c *Client) RestartAsync(ctx context.Context, names []string, opts RestartOptions) (*Operation, error) {
	return c.runAsync(ctx, "restart", names, func(o *op) { o.reload = opts.Reload })
}

// Operation is an accepted request whose change may still be running.
type Operation struct {
	c      *Client
	op     op
	result Result
	done   bool
}

// ChangeID returns the change snapd made ("" in snapctl mode).
func (o *Operation) ChangeID() string { return o.result.ChangeID }

// Result returns what is known of the operation so far: the change,
// attempts, conflicts and changes waited for; Status is set once the
// change is known to be ready.
func (o *Operation) Result() Result { return o.result }

// Wait waits for the operation's change and returns its outcome. It may be
// called more than once.
func (o *Operation) Wait(ctx context.Context) (*Result, error) {
	if o.done {
		res := o.result
		return &res, nil
	}
	chg, err := o.c.WaitChange(ctx, o.result.ChangeID)
	if err != nil {
		return nil, o.c.opError(o.op, o.result.ChangeID, o.result.Attempts, err)
	}
	o.result.Status = chg.Status
	o.done = true
	res := o.result
	return &res, nil
}

func (c *Client) prepare(action string, names []string, set func(*op)) (op, error) {
	o := op{action: action}
	set(&o)
	t, err := parseTarget(names)
	if err != nil {
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

func (c *Client) runSync(ctx context.Context, action string, names []string, set func(*op)) (*Result, error) {
	o, err := c.prepare(action, names, set)
	if err != nil {
		return nil, err
	}
	return c.coalesce(ctx, o)
}

func (c *Client) runAsync(ctx context.Context, action string, names []string, set func(*op)) (*Operation, error) {
	o, err := c.prepare(action, names, set)
	if err != nil {
		return nil, err
	}
	res, done, err := c.run(ctx, o, false)
	if err != nil {
		return nil, err
	}
	return &Operation{c: c, op: o, result: *res, done: done}, nil
}

func (c *Client) opError(o op, changeID string, attempts int, err error) error {
	return &OpError{Op: o.action, Names: o.t.names, ChangeID: changeID, Attempts: attempts, Err: err}
}

// run carries out one operation: lock, act, absorb conflicts, and (if
// wait) wait for the change. done reports whether the outcome is final.
func (c *Client) run(ctx context.Context, o op, wait bool) (res *Result, done bool, err error) {
	log := c.logger.With("snap", strings.Join(o.t.snaps, ","), "action", o.action, "names", o.t.String())
	// Pace before taking the lock, so a paced restart does not hold up
	// other operations on the snap.
	if err := c.paceRestart(ctx, o); err != nil {
		return nil, false, c.opError(o, "", 0, err)
	}
	h, err := c.lockSnaps(ctx, o.t.snaps)
	if err != nil {
		return nil, false, c.opError(o, "", 0, err)
	}
	defer h.release()
	onLocked(ctx)

	// Changes this process started asynchronously and nobody waited for
	// would only come back as conflicts: wait for them first.
	var pending []string
	for _, l := range h.mem {
		pending = append(pending, l.takePending()...)
	}
	if len(pending) > 0 {
		log.Debug("waiting for this process's earlier changes", "changes", pending)
		if _, err := c.waitReady(ctx, pending); err != nil {
			for _, l := range h.mem {
				for _, id := range pending {
					l.addPending(id)
				}
			}
			return nil, false, c.opError(o, "", 0, err)
		}
	}
	// Pace again under the lock: a restart of the same service may have
	// gone ahead while this one waited for the lock.
	if err := c.paceRestart(ctx, o); err != nil {
		return nil, false, c.opError(o, "", 0, err)
	}

	res = &Result{}
	rt := c.policy.NewRetrier()
	var last error
	unseenConflicts := 0
	for {
		if rt.Attempts() > 0 {
			if reason := rt.Exhausted(); reason != "" {
				return nil, false, c.opError(o, "", res.Attempts, &gaveUpError{reason: reason, last: last})
			}
		}
		res.Attempts = rt.Attempt()
		sentAt := time.Now()
		changeID, err := c.send(ctx, o)
		if err == nil {
			c.recordRestart(o)
			if c.queuesInHook() {
				log.Info("queued by snapd until the hook ends", "hook", c.hook, "attempt", res.Attempts)
				res.Queued = true
				return res, true, nil
			}
			if c.mode == ModeSnapctl {
				// snapctl answers once the change is ready and Done.
				res.Status = snapd.StatusDone
				log.Info("done", "attempt", res.Attempts)
				return res, true, nil
			}
			res.ChangeID = changeID
			log.Info("change created", "change", changeID, "attempt", res.Attempts)
			return c.finish(ctx, o, h, res, wait)
		}
		last = err
		if ctx.Err() != nil {
			return nil, false, c.opError(o, "", res.Attempts, interrupted(ctx, last))
		}
		switch retry.Classify(err) {
		case retry.Permanent:
			log.Info("failed", "attempt", res.Attempts, "error", err)
			return nil, false, c.opError(o, "", res.Attempts, asChangeFailure(err))
		case retry.Conflict:
			res.Conflicts++
			ce, _ := retry.AsConflict(err)
			ids, ferr := c.findBlockers(ctx, o.t.snaps, ce, "")
			if ferr != nil {
				log.Debug("cannot list changes to find the blocker", "error", ferr)
			}
			if len(ids) > 0 {
				unseenConflicts = 0
				ce.ChangeID = ids[0]
				log.Info("conflict; waiting for blocking changes", "changes", ids, "kind", ce.ChangeKind, "attempt", res.Attempts)
				res.WaitedFor = appendNew(res.WaitedFor, ids...)
				if _, werr := c.waitReady(ctx, ids); werr != nil {
					return nil, false, c.opError(o, "", res.Attempts, werr)
				}
				continue // retry at once: the blocker is done
			}
			unseenConflicts++
			if unseenConflicts == 1 && ferr == nil {
				// The blocker finished between our request and the
				// listing: try again straight away.
				log.Info("conflict; blocker already gone, retrying", "kind", ce.ChangeKind, "attempt", res.Attempts)
				continue
			}
			log.Info("conflict; blocker not visible, backing off", "kind", ce.ChangeKind, "attempt", res.Attempts)
		case retry.Indeterminate:
			id, ferr := c.adoptLost(ctx, o, sentAt)
			if ferr == nil && id != "" {
				c.recordRestart(o)
				res.ChangeID = id
				log.Info("request's answer was lost; adopting the change it made", "change", id, "attempt", res.Attempts)
				if c.mode == ModeSnapctl {
					chg, werr := c.WaitChange(ctx, id)
					if werr != nil {
						return nil, false, c.opError(o, id, res.Attempts, werr)
					}
					res.Status = chg.Status
					return res, true, nil
				}
				return c.finish(ctx, o, h, res, wait)
			}
			if ferr != nil {
				log.Debug("cannot look for the change of a lost request", "error", ferr)
			}
			log.Info("outcome unknown and no change found; retrying", "attempt", res.Attempts, "error", err)
		case retry.Transient:
			log.Info("snapd unavailable; backing off", "attempt", res.Attempts, "error", err)
		}
		if reason := rt.Exhausted(); reason != "" {
			return nil, false, c.opError(o, "", res.Attempts, &gaveUpError{reason: reason, last: last})
		}
		if perr := rt.Pause(ctx); perr != nil {
			return nil, false, c.opError(o, "", res.Attempts, interrupted(ctx, last))
		}
	}
}

// finish waits for the operation's change (wait) or records it as pending
// for the next operation on these snaps (async).
func (c *Client) finish(ctx context.Context, o op, h *held, res *Result, wait bool) (*Result, bool, error) {
	if !wait {
		for _, l := range h.mem {
			l.addPending(res.ChangeID)
		}
		return res, false, nil
	}
	chg, err := c.WaitChange(ctx, res.ChangeID)
	if err != nil {
		var ce *ChangeError
		if !errors.As(err, &ce) && ctx.Err() == nil {
			// Could not see the end; let the next operation wait for it.
			for _, l := range h.mem {
				l.addPending(res.ChangeID)
			}
		}
		c.logger.Info("change failed", "change", res.ChangeID, "action", o.action, "error", err)
		return nil, false, c.opError(o, res.ChangeID, res.Attempts, err)
	}
	res.Status = chg.Status
	c.logger.Info("change done", "change", res.ChangeID, "action", o.action, "attempt", res.Attempts)
	return res, true, nil
}

// send makes one request to act.
func (c *Client) send(ctx context.Context, o op) (string, error) {
	if c.mode == ModeSnapctl {
		_, err := c.ctl.RunSnapctl(ctx, snapd.SnapctlRequest{ContextID: c.cookie, Args: o.snapctlArgs()})
		return "", err
	}
	return c.main.PostApps(ctx, o.instruction())
}

// asChangeFailure turns snapctl's report of a failed change ("cannot
// perform the following tasks: ...") into a *ChangeError, keeping the
// snapd error in the chain.
func asChangeFailure(err error) error {
	var apiErr *snapd.Error
	if !errors.As(err, &apiErr) {
		return err
	}
	msg := apiErr.Message
	for _, p := range []string{"error running snapctl: ", "snapctl: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	if !strings.HasPrefix(msg, "cannot perform the following tasks") {
		return err
	}
	return errors.Join(&ChangeError{Kind: "service-control", Status: snapd.StatusError, Err: msg}, err)
}

// adoptLost looks for the change a request made although its answer was
// lost (or, through snapctl, timed out), so the action is never sent twice.
// It matches service-control changes by their task summaries and only
// considers changes spawned since shortly before the request.
func (c *Client) adoptLost(ctx context.Context, o op, sentAt time.Time) (string, error) {
	chgs, err := c.main.Changes(ctx, snapd.SelectAll, "")
	if err != nil {
		return "", err
	}
	best := ""
	for i := range chgs {
		chg := &chgs[i]
		if chg.Kind != "service-control" || !matchesOp(chg, o) {
			continue
		}
		// Spawn times come from snapd's clock (same machine); allow for
		// coarse clocks.
		if !chg.Ready || chg.SpawnTime.After(sentAt.Add(-2*time.Second)) {
			if best == "" || lessID(best, chg.ID) {
				best = chg.ID
			}
		}
	}
	return best, nil
}

// matchesOp reports whether a service-control change does what o asks, by
// the task summaries snapd writes (overlord/servicestate/servicestate.go
// serviceControlTs): `Run service command "restart" for services
// ["kubelet"] of snap "k8s"`, or `... for running services of snap "k8s"`
// for a whole-snap restart.
func matchesOp(chg *Change, o op) bool {
	action := o.action
	if o.reload {
		action = "reload-or-restart"
	}
	verb := fmt.Sprintf(`Run service command %q `, action)
	for _, s := range o.t.snaps {
		found := false
		suffix := fmt.Sprintf(" of snap %q", s)
		for _, t := range chg.Tasks {
			if t.Kind == "service-control" && strings.HasPrefix(t.Summary, verb) && strings.HasSuffix(t.Summary, suffix) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func appendNew(list []string, ids ...string) []string {
	for _, id := range ids {
		if !slices.Contains(list, id) {
			list = append(list, id)
		}
	}
	return list
}
