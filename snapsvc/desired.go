package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// EnsureResult reports what EnsureRunning or EnsureStopped did.
type EnsureResult struct {
	// Changed lists the services ("snap.app") that were acted on, sorted.
	Changed []string
	// Unchanged lists the services already in the desired state, sorted.
	Unchanged []string
	// Result is the operation's result; nil when nothing needed doing.
	Result *Result
}

// EnsureRunning makes the named services (or all services of named snaps)
// active and enabled, acting only on the difference: it reads their state
// first and sends one "start --enable" for those that are inactive or
// disabled (a service left disabled, for example by a snap revert, is
// re-enabled even if it is running). When every service is already active
// and enabled it sends no request to act, so it is cheap to call at every
// daemon start. Oneshot services that have exited count as inactive and
// are started again.
func (c *Client) EnsureRunning(ctx context.Context, names []string) (*EnsureResult, error) {
	return c.ensure(ctx, "start", names, func(s Service) bool { return !s.Active || !s.Enabled }, func(o *request) { o.enable = true })
}

// EnsureStopped makes the named services inactive, acting only on the
// difference: it stops the active ones in one request, and with
// opts.Disable also disables the enabled ones (active or not). When
// nothing differs it sends no request to act.
func (c *Client) EnsureStopped(ctx context.Context, names []string, opts StopOptions) (*EnsureResult, error) {
	return c.ensure(ctx, "stop", names, func(s Service) bool { return s.Active || (opts.Disable && s.Enabled) }, func(o *request) { o.disable = opts.Disable })
}

// ensure is one call: the read of the services' state and the operation
// on those that differ share its bounds.
func (c *Client) ensure(ctx context.Context, action string, names []string, differs func(Service) bool, set func(*request)) (*EnsureResult, error) {
	if len(names) == 0 {
		return nil, &OpError{Op: "ensure " + action, Err: ErrNoNames}
	}
	if err := validateNames(names); err != nil {
		return nil, &OpError{Op: "ensure " + action, Names: names, Err: err}
	}
	k := c.newCall(ctx, callOp, action, names)
	defer k.end()
	svcs, err := k.services(names)
	if err != nil {
		return nil, &OpError{Op: "ensure " + action, Names: names, Err: err}
	}
	out := &EnsureResult{}
	for _, s := range svcs {
		if differs(s) {
			out.Changed = append(out.Changed, s.FullName())
		} else {
			out.Unchanged = append(out.Unchanged, s.FullName())
		}
	}
	slices.Sort(out.Changed)
	slices.Sort(out.Unchanged)
	if len(out.Changed) == 0 {
		k.log.Debug("services already in the desired state", "action", action, "names", strings.Join(names, ","))
		return out, nil
	}
	k.log.Info("bringing services to the desired state", "action", action, "names", strings.Join(out.Changed, ","))
	o, err := c.prepare(action, out.Changed, set)
	if err != nil {
		return nil, err
	}
	if err := c.awaitStartup(ctx, o); err != nil {
		return nil, err
	}
	started := c.events.opStarted(action, out.Changed)
	op := c.operationOn(k, o)
	var res *Result
	if err = op.recordIntent(); err == nil {
		res, err = op.run()
		op.intent.end(ctx, res, err)
	}
	c.events.opEnded(action, out.Changed, started, res, err)
	if err != nil {
		return nil, err
	}
	out.Result = res
	return out, nil
}

// WaitActive waits until snapd reports every named service (or every
// service of named snaps) active, reading their state at the client's poll
// interval on its clock. It is bounded by ctx (on its end the error names
// the services still inactive) and by the policy's MaxUnreachable: failures
// to reach snapd are retried until either ends (ErrGaveUp); an unknown
// service fails at once.
func (c *Client) WaitActive(ctx context.Context, names []string) error {
	if len(names) == 0 {
		return &OpError{Op: "wait active", Err: ErrNoNames}
	}
	if err := validateNames(names); err != nil {
		return &OpError{Op: "wait active", Names: names, Err: err}
	}
	k := c.newCall(ctx, callWait, "wait", names)
	defer k.end()
	ctx = k.ctx
	var (
		inactive []string
		last     error
	)
	for {
		svcs, err := k.services(names)
		switch {
		case err == nil:
			last = nil
			inactive = inactive[:0]
			for _, s := range svcs {
				if !s.Active {
					inactive = append(inactive, s.FullName())
				}
			}
			if len(inactive) == 0 {
				return nil
			}
		case ctx.Err() != nil:
			// Its end is reported below, with what is still inactive and
			// what the read was retrying (not the end itself again).
			if ie := (*interruptedError)(nil); errors.As(err, &ie) {
				last = ie.last
			}
		default:
			// The read already asked again what the retry rule allows,
			// within the call's bounds: what is left is final.
			return &OpError{Op: "wait active", Names: names, Err: err}
		}
		if err := k.sleep(c.poll); err != nil {
			if ctx.Err() == nil {
				return &OpError{Op: "wait active", Names: names, Err: err} // MaxUnreachable
			}
			return &OpError{Op: "wait active", Names: names, Err: waitActiveErr(ctx, inactive, last)}
		}
	}
}

func waitActiveErr(ctx context.Context, inactive []string, last error) error {
	var b strings.Builder
	b.WriteString("waiting for services to be active")
	if len(inactive) > 0 {
		fmt.Fprintf(&b, " (still inactive: %s)", strings.Join(inactive, ", "))
	}
	if last != nil {
		return fmt.Errorf("%s: %w (last error: %w)", b.String(), context.Cause(ctx), last)
	}
	return fmt.Errorf("%s: %w", b.String(), context.Cause(ctx))
}
