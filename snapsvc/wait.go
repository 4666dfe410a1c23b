package snapsvc

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// Change is a snapd change as GET /v2/changes/{id} reports it. Fields: ID,
// Kind ("service-control", "configure-snap", ...), Summary, Status (Do,
// Doing, Wait, Done, Error, Undone, Hold, ...), Ready, Err (snapd's error
// text when it failed), SpawnTime, ReadyTime (nil until ready), Data and
// Tasks.
type Change = snapd.Change

// Task is one task of a Change. Fields: ID, Kind, Summary, Status, Log (at
// most snapd's last 10 entries, "<time> INFO|ERROR <text>"), Progress
// (Label, Done, Total), SpawnTime, ReadyTime and Data.AffectedSnaps (snapd
// >= 2.62).
type Task = snapd.Task

// noticeWait is how long one notices long-poll may be held by snapd.
const noticeWait = 30 * time.Second

// Change returns the change with the given id.
func (c *Client) Change(ctx context.Context, id string) (*Change, error) {
	return c.main.Change(ctx, id)
}

// WaitChange waits until the change is ready and returns it. A change that
// ends in Error, Undone or Hold is returned together with a *ChangeError
// carrying snapd's err text.
func (c *Client) WaitChange(ctx context.Context, id string) (*Change, error) {
	chgs, err := c.waitReady(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	chg := chgs[id]
	if chg == nil {
		return nil, &ChangeError{ID: id, Status: "gone", Err: "snapd no longer knows the change (pruned?)"}
	}
	return chg, changeOutcome(chg)
}

// changeOutcome returns nil for a change that is Done, else a *ChangeError.
func changeOutcome(chg *Change) error {
	if chg.Status == snapd.StatusDone {
		return nil
	}
	return &ChangeError{ID: chg.ID, Kind: chg.Kind, Summary: chg.Summary, Status: chg.Status, Err: chg.Err}
}

// waitReady waits until every change in ids is ready, and returns them
// (nil for a change snapd no longer knows). It long-polls snapd's notices
// where snapd has them (>= 2.62) and polls each change at the poll interval
// otherwise. Failures to reach snapd are retried within the policy.
func (c *Client) waitReady(ctx context.Context, ids []string) (map[string]*Change, error) {
	return c.waitChanges(ctx, ids, false)
}

// waitReadyOrStalled is waitReady that also gives up on a change in Wait
// (waiting for a reboot or a manual step: it will not become ready by
// itself), returning a *ChangeError for it.
func (c *Client) waitReadyOrStalled(ctx context.Context, ids []string) (map[string]*Change, error) {
	return c.waitChanges(ctx, ids, true)
}

func (c *Client) waitChanges(ctx context.Context, ids []string, stallOnWait bool) (map[string]*Change, error) {
	done := map[string]*Change{}
	remaining := slices.Clone(ids)
	var after time.Time
	rt := c.policy.NewRetrier()
	first := true
	for {
		if c.notices.Load() != noticesNo {
			// Read the notices before the changes: a status change after
			// this read repeats the notice later than "after", so the
			// long-poll below cannot miss it.
			timeout := noticeWait
			if first {
				timeout = 0
			}
			ns, err := c.main.Notices(ctx, snapd.NoticesOptions{Types: []string{snapd.NoticeChangeUpdate}, Keys: remaining, After: after, Timeout: timeout})
			switch {
			case err == nil:
				c.notices.Store(noticesYes)
				for _, n := range ns {
					if n.LastRepeated.After(after) {
						after = n.LastRepeated
					}
				}
			case snapd.IsNotFound(err) || isForbidden(err):
				// snapd < 2.62 has no notices; on the snap socket they need
				// snap-refresh-observe. Poll the changes instead.
				c.notices.Store(noticesNo)
			default:
				if perr := c.pauseOnWaitError(ctx, rt, err); perr != nil {
					return nil, perr
				}
				continue
			}
		} else if !first {
			if err := retry.Sleep(ctx, c.clock, c.poll); err != nil {
				return nil, ctxErr(ctx, "waiting for change "+remaining[0])
			}
		}
		first = false
		next := remaining[:0]
		var failed error
		for _, id := range remaining {
			chg, err := c.main.Change(ctx, id)
			if err != nil {
				if errors.Is(err, snapd.ErrNotFound) {
					done[id] = nil
					continue
				}
				failed = err
				next = append(next, id)
				continue
			}
			if chg.Ready {
				done[id] = chg
				continue
			}
			if stallOnWait && chg.Status == snapd.StatusWait {
				return nil, &ChangeError{ID: chg.ID, Kind: chg.Kind, Summary: chg.Summary, Status: chg.Status, Err: "waiting"}
			}
			next = append(next, id)
		}
		remaining = next
		if len(remaining) == 0 {
			return done, nil
		}
		if failed != nil {
			if perr := c.pauseOnWaitError(ctx, rt, failed); perr != nil {
				return nil, perr
			}
		}
	}
}

// pauseOnWaitError decides whether a failed read while waiting is worth
// another try (snapd restarting or unreachable) and pauses if so.
func (c *Client) pauseOnWaitError(ctx context.Context, rt *retry.Retrier, err error) error {
	if ctx.Err() != nil {
		return ctxErr(ctx, "waiting for changes")
	}
	var garbled *snapd.ResponseError
	if !retry.IsRetryable(err) && !errors.As(err, &garbled) {
		return err
	}
	rt.Attempt()
	if reason := rt.Exhausted(); reason != "" {
		return &gaveUpError{reason: "waiting for changes: " + reason, last: err}
	}
	c.logger.Debug("snapd unreachable while waiting; retrying", "error", err)
	if perr := rt.Pause(ctx); perr != nil {
		return ctxErr(ctx, "waiting for changes")
	}
	return nil
}

// WaitIdle returns once no change that touches snap is in progress,
// including changes made through snapctl, which carry no snap-names and so
// are found by their tasks.
func (c *Client) WaitIdle(ctx context.Context, snap string) error {
	if err := validateSnapName(snap); err != nil {
		return fmt.Errorf("snapsvc: waiting for snap to be idle: %w %q: %v", ErrInvalidName, snap, err)
	}
	skip := ""
	if c.hook != "" {
		// From inside a hook, the hook's own change cannot end first.
		skip = c.ownHookChange(ctx, []string{snap})
	}
	for {
		ids, err := c.findBlockers(ctx, []string{snap}, nil, skip)
		if err != nil {
			return fmt.Errorf("snapsvc: waiting for snap %q to be idle: %w", snap, err)
		}
		if len(ids) == 0 {
			return nil
		}
		c.logger.Debug("waiting for changes on snap", "snap", snap, "changes", ids)
		if _, err := c.waitReady(ctx, ids); err != nil {
			return fmt.Errorf("snapsvc: waiting for snap %q to be idle: %w", snap, err)
		}
	}
}

// findBlockers lists the in-progress changes that hold any of snaps (or,
// for a conflict with an exclusive change, every change of that kind).
// skip is a change to ignore (the caller's own).
func (c *Client) findBlockers(ctx context.Context, snaps []string, ce *retry.ConflictError, skip string) ([]string, error) {
	chgs, err := c.main.Changes(ctx, snapd.SelectInProgress, "")
	if err != nil {
		return nil, err
	}
	patterns := make([]*regexp.Regexp, len(snaps))
	for i, s := range snaps {
		patterns[i] = summaryPattern(s)
	}
	var ids []string
	for i := range chgs {
		chg := &chgs[i]
		if chg.Ready || chg.ID == skip {
			continue
		}
		match := ce != nil && ce.AllSnaps && (ce.ChangeKind == "" || ce.ChangeKind == chg.Kind)
		for i, s := range snaps {
			if match {
				break
			}
			match = touches(chg, s, patterns[i])
		}
		if match {
			ids = append(ids, chg.ID)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return lessID(ids[i], ids[j]) })
	return ids, nil
}

// touches reports whether a change holds snap the way snapd's conflict
// check sees it (any task of a non-ready change that affects the snap,
// even a finished one). snapd >= 2.62 lists affected-snaps on tasks; every
// version names the snap in task summaries, matched by re (summaryPattern),
// e.g. `Run service command "stop" for services ["gamma"] of snap
// "svcdemo"`, `Run configure hook of "svcdemo" snap`, `stop of
// [svcdemo.gamma]`.
func touches(chg *Change, snap string, re *regexp.Regexp) bool {
	if re.MatchString(chg.Summary) {
		return true
	}
	for _, t := range chg.Tasks {
		if slices.Contains(t.Data.AffectedSnaps, snap) || re.MatchString(t.Summary) {
			return true
		}
	}
	return false
}

func summaryPattern(snap string) *regexp.Regexp {
	q := regexp.QuoteMeta(snap)
	return regexp.MustCompile(`snap "` + q + `"|"` + q + `" snap|[\[ ]` + q + `[.\] ,]|\[` + q + `\]`)
}

// lessID orders change ids numerically (they are decimal counters).
func lessID(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// isForbidden reports whether snapd refused a read for lack of access.
func isForbidden(err error) bool {
	var apiErr *snapd.Error
	return errors.As(err, &apiErr) && (apiErr.StatusCode == 401 || apiErr.StatusCode == 403)
}

// ErrNoNotices is returned by WaitChangeUpdate when snapd has no notices
// API (before 2.62) or does not let this client read it.
var ErrNoNotices = errors.New("snapd offers no change notices here")

// WaitChangeUpdate blocks until snapd records a change-update notice (a
// change was spawned or changed status) later than after, or until
// timeout passes, and returns the last-repeated time of the newest such
// notice (after itself when none came). With a zero after it returns at
// once with the newest existing notice's time, a starting point for the
// next call. It uses snapd's notices long-poll (snapd >= 2.62) and
// returns ErrNoNotices where there is none; callers then poll Changes.
func (c *Client) WaitChangeUpdate(ctx context.Context, after time.Time, timeout time.Duration) (time.Time, error) {
	if c.notices.Load() == noticesNo {
		return after, ErrNoNotices
	}
	opts := snapd.NoticesOptions{Types: []string{snapd.NoticeChangeUpdate}, After: after}
	if !after.IsZero() {
		opts.Timeout = timeout
	}
	ns, err := c.main.Notices(ctx, opts)
	switch {
	case snapd.IsNotFound(err) || isForbidden(err):
		c.notices.Store(noticesNo)
		return after, ErrNoNotices
	case err != nil:
		return after, fmt.Errorf("snapsvc: waiting for change notices: %w", err)
	}
	c.notices.Store(noticesYes)
	for _, n := range ns {
		if n.LastRepeated.After(after) {
			after = n.LastRepeated
		}
	}
	return after, nil
}
