package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// The gate-auto-refresh hook: with snapd's experimental flag set (`snap
// set system experimental.gate-auto-refresh-hook=true`; off by default up
// to 2.77 at least), snapd runs a snap's gate-auto-refresh hook before an
// auto-refresh that affects it, and the hook answers with `snapctl refresh
// --proceed` or `--hold` (overlord/hookstate/ctlcmd/refresh.go). Its answer
// takes effect when the hook ends (the hook handler, hookstate/hooks.go
// gateAutoRefreshHookHandler.Done): on proceed, the refresh runs later in
// the same auto-refresh change; on hold, snapd holds the snap's
// auto-refreshes for as long as it allows a snap to hold itself (95 days
// from its last refresh, less 5: snapstate maxPostponement), and runs the
// hook again only once that hold ends, or when the snap asks, outside the
// hook, with `snapctl refresh --proceed` (snap-refresh-control). A hook
// that fails is taken as a hold; one that ends without an answer, as
// proceed.

// ErrNotGateHook: GateAutoRefresh was called outside a gate-auto-refresh
// hook (another hook, or outside snapctl mode), where snapd refuses
// `snapctl refresh --hold` ("can only be used from gate-auto-refresh
// hook").
var ErrNotGateHook = errors.New("not in a gate-auto-refresh hook")

// DefaultGateMaxWait is GateOptions.MaxWait's default: well within the
// ten minutes snapd gives a hook (hookstate defaultHookTimeout), while
// the auto-refresh change waits for the hook.
const DefaultGateMaxWait = time.Minute

// GateOptions modify GateAutoRefresh.
type GateOptions struct {
	// MaxWait bounds how long the hook waits for the budget's slot, a
	// pause of its key, and the admission check, before it answers
	// --hold (default DefaultGateMaxWait).
	MaxWait time.Duration
}

// GateDecision is how GateAutoRefresh answered snapd.
type GateDecision string

const (
	// GateProceed: `snapctl refresh --proceed`; the refresh runs once the
	// hook ends.
	GateProceed GateDecision = "proceed"
	// GateHold: `snapctl refresh --hold`; snapd holds the snap's
	// auto-refreshes.
	GateHold GateDecision = "hold"
)

// GateResult is what GateAutoRefresh did.
type GateResult struct {
	// Decision is the answer given to snapd.
	Decision GateDecision
	// Keys are the budget keys of the snap's services.
	Keys []string
	// Why says why the refresh was held: the budget's wait, its pause or
	// halt, the admission check's refusal, or the budget's failure.
	Why error
	// HeldFor is how long snapd holds the refresh, as its answer to
	// --hold says.
	HeldFor time.Duration
	// Change is the auto-refresh change the hook runs in, when snapd lets
	// the snap list changes (snap-refresh-observe); recorded in the
	// budget's history with the act.
	Change string
}

// GateAutoRefresh answers snapd from a snap's gate-auto-refresh hook under
// the Client's restart budget (WithRestartBudget), so that a fleet's
// auto-refresh disrupts at most the budget's number of machines at a
// time: it takes the slots of the snap's services (the keys a whole-snap
// restart takes), confirms them (fence) and asks the admission check, then
// answers `snapctl refresh --proceed`; when the slots are taken by other
// machines, the key is paused or halted, or the admission check refuses,
// through opts.MaxWait, it answers `snapctl refresh --hold` instead and
// gives the slots back. The Client must be in snapctl mode with the hook's
// cookie (the default inside the hook). Without a restart budget it
// proceeds.
//
// snapd refreshes the snap only after the hook has ended, so the hook
// cannot wait for the refreshed services: on proceed the slots are let go
// of as a crashed holder's would be (budget.Abandoner), after the act is
// recorded (outcome "abandoned"), and the budget frees them once their
// lease has run out and their lock-delay has passed (etcdbudget and
// sqlbudget: Config.LockDelay, ended early by Config.HolderReady when the
// machine's services are seen ready again after the act). Set the
// lock-delay to cover the refresh and the services' return.
//
// A snap held this way is held by snapd until the hold snapd allows ends
// (up to 90 days), or until the snap asks again from outside the hook
// (`snapctl refresh --proceed`, which needs the snap-refresh-control
// interface): an application that wants its turn soon calls that from its
// daemon once the budget has room. The hook is experimental in snapd and
// runs only with `snap set system experimental.gate-auto-refresh-hook=true`.
func (c *Client) GateAutoRefresh(ctx context.Context, opts GateOptions) (*GateResult, error) {
	snap := c.ownSnap
	o := request{action: "refresh", t: target{names: []string{snap}, snaps: []string{snap}}}
	switch {
	case c.mode != ModeSnapctl:
		return nil, c.opError(o, "", 0, fmt.Errorf("%w: the client is in %s mode; the hook answers through snapctl", ErrNotGateHook, c.mode))
	case c.hook != "" && c.hook != "gate-auto-refresh":
		return nil, c.opError(o, "", 0, fmt.Errorf("%w: running in the %s hook", ErrNotGateHook, c.hook))
	case snap == "":
		return nil, c.opError(o, "", 0, fmt.Errorf("%w: the snap's name is unknown (SNAP_INSTANCE_NAME unset; see WithSnap)", ErrNotGateHook))
	}
	maxWait := opts.MaxWait
	if maxWait <= 0 {
		maxWait = DefaultGateMaxWait
	}
	k := c.newCall(ctx, callOp, "gate-auto-refresh", o.t.names)
	defer k.end()
	op := c.operationOn(k, o)
	res := &GateResult{}
	if c.budget == nil {
		return c.gateAnswer(k, o, res, GateProceed, nil)
	}
	res.Change = ownHookChange(k, o.t.snaps)
	keys, err := op.budgetKeys(o.t.names, nil)
	if err != nil {
		return nil, c.opError(o, "", 0, err)
	}
	res.Keys = keys
	wctx, stop := clockTimeout(k.ctx, c.clock, maxWait, fmt.Errorf("%w: no slot came free, or the key stayed paused, within the gate's %s", ErrBudgetWait, maxWait))
	defer stop()
	h, err := c.budget.takeAll(wctx, keys)
	if err != nil {
		return c.gateHoldOn(k, o, res, err)
	}
	h.what = o
	h.setChange(res.Change)
	if err := h.fence(wctx); err != nil {
		h.release(k.ctx)
		return c.gateHoldOn(k, o, res, err)
	}
	if _, err := h.admit(wctx, o); err != nil {
		h.release(k.ctx)
		return c.gateHoldOn(k, o, res, err)
	}
	if err := h.fence(wctx); err != nil {
		h.release(k.ctx)
		return c.gateHoldOn(k, o, res, err)
	}
	actx := k.ctx
	if !h.sendBy.IsZero() {
		actx = snapd.WithSendBy(actx, h.sendBy)
	}
	_, err = c.ctl.RunSnapctl(actx, snapd.SnapctlRequest{ContextID: c.cookie, Args: []string{"refresh", "--proceed"}})
	k.note(err)
	if err != nil && !mayHaveWritten(err) {
		h.release(k.ctx)
		return nil, c.opError(o, "", 1, fmt.Errorf("answering snapd's auto-refresh: %w", err))
	}
	// snapd may have taken the answer (a lost one too): the refresh may
	// run once the hook ends, so the slots stay held as a crash's would.
	h.acted()
	h.abandon(k.ctx)
	if err != nil {
		return nil, c.opError(o, "", 1, fmt.Errorf("answering snapd's auto-refresh (the answer may have been taken; the budget's slots are held as a crashed holder's): %w", err))
	}
	res.Decision = GateProceed
	k.log.Info("auto-refresh proceeds under the restart budget; the slots are held until their lease and lock-delay run out", "keys", strings.Join(keys, ", "), "change", res.Change)
	return res, nil
}

// gateHoldOn answers --hold because of why (the budget's), unless why is
// the caller's own end.
func (c *Client) gateHoldOn(k *call, o request, res *GateResult, why error) (*GateResult, error) {
	if k.parent.Err() != nil {
		return nil, c.opError(o, "", 0, why)
	}
	return c.gateAnswer(k, o, res, GateHold, why)
}

// gateAnswer runs `snapctl refresh --proceed` or `--hold`.
func (c *Client) gateAnswer(k *call, o request, res *GateResult, d GateDecision, why error) (*GateResult, error) {
	var out *snapd.SnapctlResult
	err := k.request("answering the auto-refresh", reading, func(ctx context.Context) (err error) {
		out, err = c.ctl.RunSnapctl(ctx, snapd.SnapctlRequest{ContextID: c.cookie, Args: []string{"refresh", "--" + string(d)}})
		return err
	})
	if err != nil {
		if why != nil {
			err = fmt.Errorf("%w (holding because %v)", err, why)
		}
		return nil, c.opError(o, "", 1, err)
	}
	res.Decision, res.Why = d, why
	if d == GateHold {
		res.HeldFor = parseHeldFor(out.Stdout)
		k.log.Info("auto-refresh held: the restart budget has no room", "why", why, "held_for", res.HeldFor)
	}
	return res, nil
}

// parseHeldFor reads snapctl's answer to --hold, "hold: 2159h59m59s"
// (ctlcmd refreshCommand.hold prints the remaining hold as YAML).
func parseHeldFor(stdout string) time.Duration {
	for _, line := range strings.Split(stdout, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "hold:"); ok {
			d, err := time.ParseDuration(strings.Trim(strings.TrimSpace(v), `"'`))
			if err == nil {
				return d
			}
		}
	}
	return 0
}

// clockTimeout returns ctx ended with cause after d on clock; stop must
// be called once the caller is done with it.
func clockTimeout(ctx context.Context, clock retry.Clock, d time.Duration, cause error) (context.Context, func()) {
	cctx, cancel := context.WithCancelCause(ctx)
	t := clock.NewTimer(d)
	done := make(chan struct{})
	ended := make(chan struct{})
	// scoped: ends when stop is called (done), and is joined by it.
	go func() {
		defer close(ended)
		select {
		case <-t.C():
			cancel(cause)
		case <-done:
		}
	}()
	return cctx, func() {
		close(done)
		<-ended
		t.Stop()
		cancel(nil)
	}
}
