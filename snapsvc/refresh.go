package snapsvc

import (
	"context"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// RefreshOptions say what Refresh refreshes a snap to. With none set the
// snap is refreshed to the latest revision of the channel it tracks, as
// `snap refresh NAME` does.
type RefreshOptions struct {
	// Channel refreshes from this channel ("latest/stable", "1.31/beta",
	// "edge"), which the snap tracks from then on, as `snap refresh
	// --channel` does.
	Channel string
	// Revision refreshes to this revision ("42"; "x2" for a local
	// revision still installed), as `snap refresh --revision` does. It may
	// go with Channel.
	Revision string
	// File installs this local snap file as the snap's new revision, as
	// `snap install --dangerous FILE` does: no assertions are checked (a
	// file of another snap is refused by snapd). It takes no Channel,
	// Revision or Amend.
	File string
	// Amend lets a snap installed from a file be refreshed from the
	// store (`snap refresh --amend`): without it snapd refuses a store
	// refresh of a local snap (kind snap-local).
	Amend bool
	// Classic refreshes (or installs the File of) a classically confined
	// snap, as `snap refresh --classic` and `snap install --classic
	// --dangerous FILE` do: snapd asks for it again for a classic file.
	Classic bool
}

// RefreshResult is the outcome of a Refresh that succeeded.
type RefreshResult struct {
	// Result is the change's: its id, its final status ("Done"), the
	// requests sent and the conflicts absorbed; NoUpdate is set when
	// snapd had nothing newer for the snap ("snap has no updates
	// available"): it made no change (ChangeID is empty), an outcome, not
	// an error.
	Result
	// Snap is the snap refreshed.
	Snap string
	// Before is the snap as it was before the refresh, After as it is
	// once the change is done (nil when NoUpdate, or when it could not
	// be read: the refresh itself succeeded).
	Before, After *SnapInfo
}

// Refresh refreshes a snap, by channel, revision or local file (opts), and
// waits until snapd's change is done and, under WithRestartBudget, the
// snap's services are ready again. It is an operation like Restart: a
// conflict with another change of the snap is waited out, refreshes and
// service commands of one snap made through this process (and, with a
// lock directory, the machine) never conflict with each other, a request
// whose answer was lost is looked up and never sent twice, and the
// change's real outcome is the result (a failed refresh, which snapd rolls
// back, is a *ChangeError).
//
// "No updates available" is a result with NoUpdate set, not an error.
// snapd refreshes a snap named this way even when its refreshes are held
// (HoldRefresh): a hold stops only auto-refreshes (and, at level general,
// refreshes of all snaps), so an operator can hold a fleet's auto-refresh
// and walk the refresh through a budget.
//
// Under WithRestartBudget a refresh takes the slots a restart of the whole
// snap takes (the key of each of its services, BudgetOptions.Key), from
// its fence until its change is done and its services pass their
// readiness checks (BudgetOptions.Ready, called with the snap's name);
// a refresh that fails, or leaves its services not ready, records a
// failed act, which halts the key (budget.Recorder). A refresh with no
// update gives its slots back at once and records nothing.
//
// Refresh needs snapd's REST API: in ModeSnapctl it fails with
// ErrRefreshInSnapctl (snapctl has no refresh; inside a snap see
// GateAutoRefresh). A refresh takes as long as its download and the
// snap's hooks and services take; bound it with the context or the
// policy's ChangeWait rather than the default MaxElapsedTime when it
// may take minutes.
func (c *Client) Refresh(ctx context.Context, snap string, opts RefreshOptions) (*RefreshResult, error) {
	names := []string{snap}
	started := c.events.opStarted("refresh", names)
	out, err := c.refresh(ctx, snap, opts)
	var res *Result
	if out != nil {
		res = &out.Result
	}
	c.events.opEnded("refresh", names, started, res, err)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RefreshAsync asks snapd to refresh a snap, as Refresh does, and returns
// once snapd has accepted the request (after waiting out any conflict),
// with an Operation to wait on: its ChangeID is the refresh's change, as
// `snap refresh --no-wait` prints it. A refresh with no update is an
// Operation already done whose Result has NoUpdate set. Under
// WithRestartBudget the slots are held in the background until the
// change is done and the services are ready; Operation.Wait waits for
// that too.
func (c *Client) RefreshAsync(ctx context.Context, snap string, opts RefreshOptions) (*Operation, error) {
	names := []string{snap}
	started := c.events.opStarted("refresh", names)
	handle, err := func() (*Operation, error) {
		o, err := c.prepareRefresh(snap, opts)
		if err != nil {
			return nil, err
		}
		op := c.operationOn(c.newCall(ctx, callOp, o.action, o.t.names), o)
		defer op.k.end()
		if _, err := op.k.readSnap(snap); err != nil {
			return nil, c.opError(o, "", 0, err)
		}
		return op.accept()
	}()
	if err != nil {
		c.events.opEnded("refresh", names, started, nil, err)
		return nil, err
	}
	handle.mu.Lock()
	handle.obs.started = started
	handle.mu.Unlock()
	return handle, nil
}

// refresh is Refresh without its events.
func (c *Client) refresh(ctx context.Context, snap string, opts RefreshOptions) (*RefreshResult, error) {
	o, err := c.prepareRefresh(snap, opts)
	if err != nil {
		return nil, err
	}
	op := c.operationOn(c.newCall(ctx, callOp, o.action, o.t.names), o)
	defer op.k.end()
	// The snap as it is: a snap that is not installed fails here, before
	// any slot is taken.
	before, err := op.k.readSnap(snap)
	if err != nil {
		return nil, c.opError(o, "", 0, err)
	}
	res, err := op.run()
	if err != nil {
		return nil, err
	}
	out := &RefreshResult{Result: *res, Snap: snap, Before: before}
	if !out.NoUpdate {
		// What it is now: for the caller's report only. The refresh is
		// done whatever this read meets, on a call of its own.
		if err := c.callOf(ctx, callRead, "read", o.t.names, func(k *call) (err error) {
			out.After, err = k.readSnap(snap)
			return err
		}); err != nil {
			op.k.log.Info("the refresh is done, but the snap could not be read after it", "error", err)
		}
	}
	return out, nil
}

// noUpdate ends a refresh snapd answered had no update available: it made
// no change, so there is nothing to wait for.
func (op *operation) noUpdate() (*Result, bool, error) {
	k := op.k
	k.flog.end(k.log)
	k.log.Info("snap has no updates available; snapd made no change", "attempt", op.res.Attempts)
	op.res.NoUpdate = true
	return op.res, true, nil
}

// readSnap is c.main.Snap on call k, as a SnapInfo.
func (k *call) readSnap(name string) (*SnapInfo, error) {
	var s *snapd.Snap
	err := k.read("reading snap "+name, func(ctx context.Context) (err error) {
		s, err = k.c.main.Snap(ctx, name)
		return err
	})
	if err != nil {
		return nil, err
	}
	return snapInfoOf(s), nil
}
