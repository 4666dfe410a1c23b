package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
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
	c  *Client
	op op

	mu     sync.Mutex
	result Result
	done   bool
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

// Wait waits for the operation's change and returns its outcome. It may be
// called more than once, from several goroutines.
func (o *Operation) Wait(ctx context.Context) (*Result, error) {
	res := o.Result()
	o.mu.Lock()
	done := o.done
	o.mu.Unlock()
	if done {
		return &res, nil
	}
	chg, err := o.c.WaitChange(ctx, res.ChangeID)
	if err != nil {
		return nil, o.c.opError(o.op, res.ChangeID, res.Attempts, err)
	}
	o.mu.Lock()
	o.result.Status = chg.Status
	o.done = true
	o.mu.Unlock()
	res.Status = chg.Status
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
	return &OpError{Op: o.action, Snap: strings.Join(o.t.snaps, ","), Names: o.t.names, ChangeID: changeID, Attempts: attempts, Err: err}
}

// runner is the state of one operation while it runs.
type runner struct {
	c     *Client
	o     op
	log   *slog.Logger
	h     *held // nil while the locks are not held
	res   *Result
	rt    *retry.Retrier
	last  error
	skip  string // the running hook's own change, never a blocker
	known map[string]bool
}

// lock takes the snaps' locks (unless snapd only queues the command, in a
// configure hook: such a call cannot collide with our other operations,
// and making it wait for them could deadlock the hook), then waits for the
// changes earlier asynchronous operations of this process left running.
func (r *runner) lock(ctx context.Context) error {
	if r.c.queuesInHook() {
		return nil
	}
	h, err := r.c.lockSnaps(ctx, r.o.t.snaps)
	if err != nil {
		return err
	}
	r.h = h
	var pending []string
	for _, l := range h.mem {
		pending = append(pending, l.takePending()...)
	}
	if len(pending) == 0 {
		return nil
	}
	r.log.Debug("waiting for this process's earlier changes", "changes", pending)
	if _, err := r.c.waitReady(ctx, pending); err != nil {
		for _, l := range h.mem {
			for _, id := range pending {
				l.addPending(id)
			}
		}
		r.unlock()
		return err
	}
	return nil
}

func (r *runner) unlock() {
	if r.h != nil {
		r.h.release()
		r.h = nil
	}
}

func (r *runner) fail(changeID string, err error) (*Result, bool, error) {
	return nil, false, r.c.opError(r.o, changeID, r.res.Attempts, err)
}

// run carries out one operation: lock, act, absorb conflicts, and (if
// wait) wait for the change. done reports whether the outcome is final.
func (c *Client) run(ctx context.Context, o op, wait bool) (*Result, bool, error) {
	r := &runner{
		c:     c,
		o:     o,
		log:   c.logger.With("snap", strings.Join(o.t.snaps, ","), "action", o.action, "names", o.t.String()),
		res:   &Result{},
		rt:    c.policy.NewRetrier(),
		known: map[string]bool{},
	}
	// A restart that must keep its distance from the last one waits with
	// the snap's locks released, so it holds up no other operation; a
	// restart of the same service may go ahead meanwhile, hence the loop.
	for {
		if err := r.lock(ctx); err != nil {
			return r.fail("", err)
		}
		if !c.mustPace(o) {
			break
		}
		r.unlock()
		if err := c.paceRestart(ctx, o); err != nil {
			return r.fail("", err)
		}
	}
	defer r.unlock()
	onLocked(ctx)
	if c.hook != "" {
		r.skip = c.ownHookChange(ctx, o.t.snaps)
	}

	unseenConflicts := 0
	fresh := false // an attempt is owed right after waiting out a blocker
	for {
		// Right after a blocker is done one attempt is owed even if the
		// policy's time ran out while waiting for it; its attempt count
		// still holds.
		if r.rt.Attempts() > 0 && (!fresh || r.rt.OutOfAttempts()) {
			if reason := r.rt.Exhausted(); reason != "" {
				return r.fail("", &gaveUpError{reason: reason, last: r.last})
			}
		}
		fresh = false
		r.res.Attempts = r.rt.Attempt()
		sentAt := time.Now()
		changeID, err := c.send(ctx, o)
		if err == nil {
			return r.succeeded(ctx, changeID, sentAt, time.Now(), wait)
		}
		r.last = err
		if ctx.Err() != nil {
			return r.fail("", interrupted(ctx, r.last))
		}
		switch retry.Classify(err) {
		case retry.Permanent:
			r.log.Info("failed", "attempt", r.res.Attempts, "error", err)
			return r.fail(c.changeFailure(ctx, o, sentAt, &err), err)
		case retry.Conflict:
			r.res.Conflicts++
			ce, _ := retry.AsConflict(err)
			r.last = ce
			ids, ferr := c.findBlockers(ctx, o.t.snaps, ce, r.skip)
			if ferr != nil {
				r.log.Debug("cannot list changes to find the blocker", "error", ferr)
			}
			if len(ids) > 0 {
				unseenConflicts = 0
				ce.ChangeID = ids[0]
				for _, id := range ids {
					r.known[id] = true
				}
				r.log.Info("conflict; waiting for blocking changes", "changes", ids, "kind", ce.ChangeKind, "attempt", r.res.Attempts)
				r.res.WaitedFor = appendNew(r.res.WaitedFor, ids...)
				if err := r.waitOut(ctx, ids, ce); err != nil {
					return r.fail("", err)
				}
				fresh = true
				continue // retry at once: the blocker is done
			}
			unseenConflicts++
			if unseenConflicts == 1 && ferr == nil {
				// The blocker finished between our request and the
				// listing: try again straight away.
				r.log.Info("conflict; blocker already gone, retrying", "kind", ce.ChangeKind, "attempt", r.res.Attempts)
				continue
			}
			r.log.Info("conflict; blocker not visible, backing off", "kind", ce.ChangeKind, "attempt", r.res.Attempts)
		case retry.Indeterminate:
			id, settled, err := r.resolveLost(ctx, sentAt)
			if err != nil {
				return r.fail("", err)
			}
			if settled {
				r.log.Info("outcome unknown; the services reached the state asked for", "attempt", r.res.Attempts)
				r.res.Status = snapd.StatusDone
				return r.res, true, nil
			}
			if id != "" {
				c.recordRestart(o)
				r.res.ChangeID = id
				r.log.Info("request's answer was lost; adopting the change it made", "change", id, "attempt", r.res.Attempts)
				return r.adopted(ctx, id, wait)
			}
			r.log.Info("the request made no change; sending it again", "attempt", r.res.Attempts, "error", r.last)
		case retry.Transient:
			r.log.Info("snapd unavailable; backing off", "attempt", r.res.Attempts, "error", err)
		}
		if reason := r.rt.Exhausted(); reason != "" {
			return r.fail("", &gaveUpError{reason: reason, last: r.last})
		}
		pause := r.rt.Pause
		if retry.Classify(r.last) == retry.Conflict {
			pause = r.rt.PauseConflict
		}
		if perr := pause(ctx); perr != nil {
			return r.fail("", interrupted(ctx, r.last))
		}
	}
}

// succeeded handles snapd's acceptance of the request.
func (r *runner) succeeded(ctx context.Context, changeID string, sentAt, answeredAt time.Time, wait bool) (*Result, bool, error) {
	c := r.c
	c.recordRestart(r.o)
	if c.queuesInHook() {
		r.log.Info("queued by snapd until the hook ends", "hook", c.hook, "attempt", r.res.Attempts)
		r.res.Queued = true
		return r.res, true, nil
	}
	if c.mode == ModeSnapctl {
		// Outside configure hooks snapctl answers once the change is ready
		// and Done (ctlcmd runServiceCommand waits for chg.Ready and
		// returns chg.Err). Where snapd lets us list changes, find the
		// change, and notice a command queued by a hook snapsvc could not
		// identify.
		if chgs, err := c.main.Changes(ctx, snapd.SelectAll, ""); err == nil {
			if id := queuedIn(chgs, r.o, sentAt, answeredAt); id != "" {
				r.log.Info("queued by snapd until the hook ends", "change", id, "attempt", r.res.Attempts)
				r.res.Queued, r.res.ChangeID = true, id
				return r.res, true, nil
			}
			r.res.ChangeID = c.pickOpChange(chgs, r.o, sentAt, answeredAt, r.known)
			if r.res.ChangeID != "" {
				c.rememberOwn(r.o, r.res.ChangeID)
			}
		}
		r.res.Status = snapd.StatusDone
		r.log.Info("done", "change", r.res.ChangeID, "attempt", r.res.Attempts)
		return r.res, true, nil
	}
	r.res.ChangeID = changeID
	c.rememberOwn(r.o, changeID)
	r.log.Info("change created", "change", changeID, "attempt", r.res.Attempts)
	return c.finish(ctx, r.o, r.res, wait)
}

// adopted finishes an operation whose change was found after its answer
// was lost.
func (r *runner) adopted(ctx context.Context, id string, wait bool) (*Result, bool, error) {
	r.c.rememberOwn(r.o, id)
	if r.c.mode == ModeSnapctl {
		chg, err := r.c.WaitChange(ctx, id)
		if err != nil {
			return r.fail(id, err)
		}
		r.res.Status = chg.Status
		return r.res, true, nil
	}
	return r.c.finish(ctx, r.o, r.res, wait)
}

// waitOut waits for blocking changes of others, bounded by what is left of
// the policy's time. It lets go of the cross-process locks meanwhile (a
// hook the blocker runs, a separate process, may need them) but keeps this
// process's own, so identical requests queued behind it can still merge.
// A blocker that sits in Wait (for a reboot) cannot be waited out.
func (r *runner) waitOut(ctx context.Context, ids []string, ce *retry.ConflictError) error {
	if r.h != nil {
		r.h.releaseFiles()
	}
	wctx := ctx
	if left, ok := r.rt.Remaining(); ok {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, left)
		defer cancel()
	}
	_, err := r.c.waitReadyOrStalled(wctx, ids)
	var stalled *ChangeError
	switch {
	case errors.As(err, &stalled):
		ce.ChangeID = stalled.ID
		return &gaveUpError{reason: fmt.Sprintf("blocking change %s (%s) is waiting, for a reboot or a manual step", stalled.ID, stalled.Kind), last: ce}
	case err != nil && ctx.Err() != nil:
		return interrupted(ctx, ce)
	case err != nil && wctx.Err() != nil:
		return &gaveUpError{reason: "gave up waiting for blocking change " + ce.ChangeID, last: ce}
	case err != nil:
		return err
	}
	if r.h != nil {
		return r.c.lockFiles(ctx, r.h, r.o.t.snaps)
	}
	return nil
}

// resolveLost finds out whether a request whose outcome is unknown made a
// change. It returns the change's id, or "" when the request certainly
// made none (so sending it again is safe). It never sends the action
// again itself: while the lookup fails it retries the lookup within the
// policy. When snapd refuses the lookup (snapctl without
// snap-refresh-observe), a start or stop is settled by watching the
// services reach the state asked for ("snapctl services" needs no
// interface); a restart cannot be told from the state, so it ends with
// ErrOutcomeUnknown rather than run twice.
func (r *runner) resolveLost(ctx context.Context, sentAt time.Time) (id string, settled bool, err error) {
	for {
		id, err := r.c.findOpChange(ctx, r.o, sentAt, r.known)
		if err == nil {
			return id, false, nil
		}
		if isForbidden(err) {
			if r.o.action == "restart" {
				return "", false, &outcomeUnknownError{reason: "the restart may have been carried out, and snapd does not let this client list changes to find out (connect snap-refresh-observe)", last: r.last}
			}
			return "", true, r.awaitState(ctx)
		}
		r.log.Debug("cannot look for the change of a request whose answer was lost", "error", err)
		if reason := r.rt.Exhausted(); reason != "" {
			return "", false, &outcomeUnknownError{reason: reason + " looking for the change of a request whose answer was lost", last: r.last}
		}
		if perr := r.rt.Pause(ctx); perr != nil {
			return "", false, interrupted(ctx, r.last)
		}
	}
}

// awaitState waits, within the policy, until the services o names are in
// the state o asks for.
func (r *runner) awaitState(ctx context.Context) error {
	for {
		svcs, err := r.c.Services(ctx, r.o.t.names...)
		if err == nil && r.o.reached(svcs) {
			return nil
		}
		if err != nil {
			r.log.Debug("cannot read service state", "error", err)
		}
		if reason := r.rt.Exhausted(); reason != "" {
			return &outcomeUnknownError{reason: reason + " waiting for the services to reach the state asked for", last: r.last}
		}
		if perr := r.rt.PauseConflict(ctx); perr != nil {
			return interrupted(ctx, r.last)
		}
	}
}

// reached reports whether svcs are in the state o asks for.
func (o op) reached(svcs []Service) bool {
	if len(svcs) == 0 {
		return false
	}
	for _, s := range svcs {
		switch {
		case o.action == "start" && (!s.Active || (o.enable && !s.Enabled)):
			return false
		case o.action == "stop" && (s.Active || (o.disable && s.Enabled)):
			return false
		}
	}
	return true
}

// finish waits for the operation's change (wait) or records it as pending
// for the next operation on these snaps (async).
func (c *Client) finish(ctx context.Context, o op, res *Result, wait bool) (*Result, bool, error) {
	if !wait {
		c.addPending(o, res.ChangeID)
		return res, false, nil
	}
	chg, err := c.WaitChange(ctx, res.ChangeID)
	if err != nil {
		var ce *ChangeError
		if !errors.As(err, &ce) {
			// Could not see the end; let the next operation wait for it.
			c.addPending(o, res.ChangeID)
		}
		c.logger.Info("change failed", "change", res.ChangeID, "action", o.action, "error", err)
		return nil, false, c.opError(o, res.ChangeID, res.Attempts, err)
	}
	res.Status = chg.Status
	c.logger.Info("change done", "change", res.ChangeID, "action", o.action, "attempt", res.Attempts)
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
