// Package benchkit holds what snapsvc's benchmarks compare: four ways a
// caller asks snapd to start, stop or restart services (one attempt,
// k8sd's fixed retry loop, backoff/v4's defaults and snapsvc itself) and
// the statistics the benchmarks print. The bench command (./cmd/bench) runs
// them against the fake; integration/bench_test.go against a real snapd.
package benchkit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Strategy names, in the order the benchmarks print them.
const (
	Naive   = "naive"
	Fixed   = "fixed"
	Backoff = "backoff"
	Snapsvc = "snapsvc"
	// SnapsvcSnapctl is snapsvc in snapctl mode, as a snap's own process
	// runs it (a hook, a strictly confined daemon): snapctl on the snap
	// socket with the snap's cookie. Where the snap cannot read changes
	// there (no snap-refresh-observe; snapd 2.57) it waits blind.
	SnapsvcSnapctl = "snapsvc-snapctl"
	// SnapsvcConfined is snapsvc in REST mode as a strictly confined snap
	// with snapd-control runs it: the main socket, but no state file to
	// watch (a confined snap cannot see /var/lib/snapd); without notices
	// (snapd < 2.62) it waits blind.
	SnapsvcConfined = "snapsvc-confined"
)

// Names lists every strategy.
var Names = []string{Naive, Fixed, Backoff, Snapsvc, SnapsvcSnapctl, SnapsvcConfined}

// IsSnapsvc reports whether name is one of snapsvc's modes.
func IsSnapsvc(name string) bool {
	return name == Snapsvc || name == SnapsvcSnapctl || name == SnapsvcConfined
}

// k8sd's retry loop around service commands: control.RetryFor(ctx, 5,
// 5*time.Second, ...) in canonical/k8s-snap (src/k8s/pkg/utils/control/
// retry.go; used by src/k8s/pkg/k8sd/app/hooks_bootstrap.go around the
// whole loop that starts the services, and by
// src/k8s/pkg/k8sd/controllers/node_configuration.go around a kubelet
// restart). Any error is retried.
const (
	FixedAttempts = 5
	FixedPause    = 5 * time.Second
)

// The snap command's wait for a change (snapd cmd/snap/wait.go): read
// the change at once, then sleep pollTime after each answer (a sleep, not
// a ticker); a read that gets no answer is retried at the same pace for
// up to maxGoneTime.
const (
	CLIPoll     = 100 * time.Millisecond
	CLIGoneTime = 5 * time.Second
)

// Target is the snapd a strategy talks to.
type Target struct {
	// Socket is snapd's main socket (/v2/apps, changes, notices).
	Socket string
	// SnapSocket is the socket snapctl requests go to.
	SnapSocket string
	// Cookie is the snap's context id, for snapctl (naive).
	Cookie string
	// LockDir is snapsvc's cross-process lock directory ("" for the
	// library's default).
	LockDir string
	// StateFile is snapd's state file, which snapsvc watches to wake
	// early when snapd has no notices ("" for the library's default:
	// /var/lib/snapd/state.json with snapd's default socket, else none).
	// snapsvc-confined never watches it.
	StateFile string
	// Snap is the snap whose cookie Cookie is (snapsvc-snapctl refuses
	// other snaps' services before any request); "" for no check.
	Snap string
}

// Config tunes the strategies.
type Config struct {
	// Scale divides the fixed loop's pause (5 s) for quick runs; values
	// below 1 mean 1 (the real pause).
	Scale float64
}

// FixedPauseAt returns the fixed loop's pause at scale.
func FixedPauseAt(scale float64) time.Duration {
	if scale < 1 {
		scale = 1
	}
	return time.Duration(float64(FixedPause) / scale)
}

// Call is one service command a caller asks for.
type Call struct {
	// Action is "start", "stop" or "restart".
	Action string
	// Names are snap.app services (or snaps).
	Names []string
	// Enable also enables started services (start --enable).
	Enable bool
}

func (c Call) String() string { return fmt.Sprintf("%s %v", c.Action, c.Names) }

// ErrSkipped is the error of a call never attempted because an earlier
// call of its sequence failed.
var ErrSkipped = errors.New("not attempted: an earlier call of the sequence failed")

// Outcome is what became of one Call.
type Outcome struct {
	Call Call
	// Start is when the call was first attempted, End when its last
	// attempt ended (both zero for a skipped call).
	Start, End time.Time
	// Err is nil when the call got done.
	Err error
	// Attempts counts the requests sent to act.
	Attempts int
	// Conflicts counts the attempts snapd refused with a change conflict.
	Conflicts int
	// ChangeID is the change that did the work ("" when it failed).
	ChangeID string
	// Shared reports that snapsvc merged the call into an identical
	// restart, whose change it reports.
	Shared bool
}

// Failed reports whether the call did not get done.
func (o Outcome) Failed() bool { return o.Err != nil }

// Strategy is one way of making service calls. It is safe for concurrent
// use.
type Strategy interface {
	// Name is one of Names.
	Name() string
	// Sequence makes calls one after another, as one caller does (a
	// hook's loop, a controller's reconcile), and returns one Outcome per
	// call. It stops at the first call that fails for good: the calls
	// after it are not attempted (their Err is ErrSkipped).
	Sequence(ctx context.Context, calls ...Call) []Outcome
	// Close releases idle connections.
	Close()
}

// New returns the named strategy for t.
func New(name string, t Target, cfg Config) (Strategy, error) {
	switch name {
	case Naive:
		if t.SnapSocket == "" || t.Cookie == "" {
			return nil, errors.New("benchkit: naive runs snapctl: it needs the snap socket and the snap's cookie")
		}
		return &naive{ctl: snapd.New(t.SnapSocket), cookie: t.Cookie}, nil
	case Fixed:
		return &fixed{wire: snapd.New(t.Socket), pause: FixedPauseAt(cfg.Scale)}, nil
	case Backoff:
		return &withBackoff{wire: snapd.New(t.Socket)}, nil
	case Snapsvc, SnapsvcSnapctl, SnapsvcConfined:
		return newLibrary(name, t)
	}
	return nil, fmt.Errorf("benchkit: unknown strategy %q (want one of %v)", name, Names)
}

func newOutcomes(calls []Call) []Outcome {
	outs := make([]Outcome, len(calls))
	for i, c := range calls {
		outs[i] = Outcome{Call: c, Err: ErrSkipped}
	}
	return outs
}

// noteFailure records a failed attempt.
func (o *Outcome) noteFailure(err error) {
	o.Err = err
	if retry.Classify(err) == retry.Conflict {
		o.Conflicts++
	}
}

// naive is a hook that runs `snapctl ACTION NAMES` once per call and
// gives up at the first error: one POST /v2/snapctl, which snapd answers
// once the change is ready (overlord/hookstate/ctlcmd: runServiceCommand
// waits for it).
type naive struct {
	ctl    *snapd.Client
	cookie string
}

func (n *naive) Name() string { return Naive }
func (n *naive) Close()       { n.ctl.CloseIdleConnections() }

func (n *naive) Sequence(ctx context.Context, calls ...Call) []Outcome {
	outs := newOutcomes(calls)
	for i, c := range calls {
		o := &outs[i]
		o.Start = time.Now()
		o.Attempts = 1
		args := []string{c.Action}
		if c.Enable {
			args = append(args, "--enable")
		}
		_, err := n.ctl.RunSnapctl(ctx, snapd.SnapctlRequest{ContextID: n.cookie, Args: append(args, c.Names...)})
		o.End = time.Now()
		if err != nil {
			o.noteFailure(err)
			return outs
		}
		o.Err = nil
	}
	return outs
}

// cliAttempt does what `snap ACTION NAMES` does (cmd/snap/cmd_services.go,
// cmd/snap/wait.go): one POST /v2/apps, then it reads the change at once
// and CLIPoll after each answer until it is ready; a read that gets no
// answer is retried at that pace for up to CLIGoneTime. It fails unless
// the change ends Done.
func cliAttempt(ctx context.Context, wire *snapd.Client, c Call) (string, error) {
	id, err := wire.PostApps(ctx, snapd.AppInstruction{Action: c.Action, Names: c.Names, Enable: c.Enable})
	if err != nil {
		return "", err
	}
	var goneSince time.Time
	for {
		chg, err := wire.Change(ctx, id)
		var apiErr *snapd.Error
		switch {
		case err == nil:
			goneSince = time.Time{}
			if chg.Ready {
				if chg.Status != snapd.StatusDone {
					return id, fmt.Errorf("change %s ended %s: %s", id, chg.Status, chg.Err)
				}
				return id, nil
			}
		case errors.As(err, &apiErr) || ctx.Err() != nil:
			return id, err
		default:
			if goneSince.IsZero() {
				goneSince = time.Now()
			} else if time.Since(goneSince) > CLIGoneTime {
				return id, err
			}
		}
		if err := retry.Sleep(ctx, nil, CLIPoll); err != nil {
			return id, err
		}
	}
}

// fixed is k8sd's loop: the whole sequence is one RetryFor(FixedAttempts,
// pause) (as hooks_bootstrap.go wraps its loop of `snap start --enable`
// calls), each call the snap command, any error retried, no lock.
type fixed struct {
	wire  *snapd.Client
	pause time.Duration
}

func (f *fixed) Name() string { return Fixed }
func (f *fixed) Close()       { f.wire.CloseIdleConnections() }

func (f *fixed) Sequence(ctx context.Context, calls ...Call) []Outcome {
	outs := newOutcomes(calls)
	for pass := 1; pass <= FixedAttempts; pass++ {
		failed := false
		for i, c := range calls {
			o := &outs[i]
			if o.Start.IsZero() {
				o.Start = time.Now()
			}
			o.Attempts++
			id, err := cliAttempt(ctx, f.wire, c)
			o.End = time.Now()
			if err != nil {
				o.noteFailure(err)
				failed = true
				break
			}
			o.Err, o.ChangeID = nil, id
		}
		if !failed || pass == FixedAttempts || retry.Sleep(ctx, nil, f.pause) != nil {
			break
		}
	}
	return outs
}

// withBackoff wraps each call, the snap command, in backoff.Retry with
// backoff/v4's defaults (NewExponentialBackOff: 500 ms, x1.5, ±50 %, at
// most 60 s apart, for 15 min): any error retried, no lock, no wake-up.
type withBackoff struct {
	wire *snapd.Client
}

func (b *withBackoff) Name() string { return Backoff }
func (b *withBackoff) Close()       { b.wire.CloseIdleConnections() }

func (b *withBackoff) Sequence(ctx context.Context, calls ...Call) []Outcome {
	outs := newOutcomes(calls)
	for i, c := range calls {
		o := &outs[i]
		o.Start = time.Now()
		err := backoff.Retry(func() error {
			o.Attempts++
			id, err := cliAttempt(ctx, b.wire, c)
			if err != nil {
				o.noteFailure(err)
				return err
			}
			o.ChangeID = id
			return nil
		}, backoff.WithContext(backoff.NewExponentialBackOff(), ctx))
		o.End = time.Now()
		o.Err = err
		if err != nil {
			return outs
		}
	}
	return outs
}

// library is snapsvc with its defaults in one of its modes: one Client
// per caller, as a hook or a controller would hold.
type library struct {
	name string
	c    *snapsvc.Client
}

func newLibrary(name string, t Target) (*library, error) {
	var opts []snapsvc.Option
	switch name {
	case SnapsvcSnapctl:
		if t.SnapSocket == "" || t.Cookie == "" {
			return nil, errors.New("benchkit: snapsvc-snapctl needs the snap socket and the snap's cookie")
		}
		// Changes and notices are read on the snap socket too, as from
		// inside a snap; the snap is the one whose cookie it is.
		opts = []snapsvc.Option{snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithSnapSocket(t.SnapSocket),
			snapsvc.WithCookie(t.Cookie), snapsvc.WithHook("")}
		if t.Snap != "" {
			opts = append(opts, snapsvc.WithSnap(t.Snap))
		}
	default:
		opts = []snapsvc.Option{snapsvc.WithSocket(t.Socket), snapsvc.WithMode(snapsvc.ModeREST)}
		if t.SnapSocket != "" {
			opts = append(opts, snapsvc.WithSnapSocket(t.SnapSocket))
		}
		if t.StateFile != "" && name == Snapsvc {
			opts = append(opts, snapsvc.WithStateFile(t.StateFile))
		} else {
			opts = append(opts, snapsvc.WithStateFile(""))
		}
	}
	if t.LockDir != "" {
		opts = append(opts, snapsvc.WithLockDir(t.LockDir))
	}
	c, err := snapsvc.New(opts...)
	if err != nil {
		return nil, err
	}
	return &library{name: name, c: c}, nil
}

func (l *library) Name() string { return l.name }
func (l *library) Close()       { l.c.Close() }

func (l *library) Sequence(ctx context.Context, calls ...Call) []Outcome {
	outs := newOutcomes(calls)
	for i, c := range calls {
		o := &outs[i]
		o.Start = time.Now()
		var res *snapsvc.Result
		var err error
		switch c.Action {
		case "start":
			res, err = l.c.Start(ctx, c.Names, snapsvc.StartOptions{Enable: c.Enable})
		case "stop":
			res, err = l.c.Stop(ctx, c.Names, snapsvc.StopOptions{})
		case "restart":
			res, err = l.c.Restart(ctx, c.Names, snapsvc.RestartOptions{})
		default:
			err = fmt.Errorf("benchkit: unknown action %q", c.Action)
		}
		o.End = time.Now()
		if err != nil {
			o.Err = err
			var oe *snapsvc.OpError
			if errors.As(err, &oe) {
				o.Attempts, o.ChangeID = oe.Attempts, oe.ChangeID
			}
			return outs
		}
		o.Err = nil
		o.Attempts, o.Conflicts, o.ChangeID, o.Shared = res.Attempts, res.Refused, res.ChangeID, res.Shared
		if o.Shared {
			o.Attempts, o.Conflicts = 0, 0 // the requests were the other call's
		}
	}
	return outs
}

// OwnChanges returns the distinct changes outs made themselves (not the
// ones shared from another call), in order.
func OwnChanges(outs []Outcome) []string {
	var ids []string
	for _, o := range outs {
		if o.ChangeID != "" && !o.Shared && !slices.Contains(ids, o.ChangeID) {
			ids = append(ids, o.ChangeID)
		}
	}
	return ids
}
