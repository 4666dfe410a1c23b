package snapservices

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// RefreshOpts is k8sd's types.RefreshOpts: what Refresh refreshes the snap
// to. The first field set is used, in this order, as k8sd does.
type RefreshOpts struct {
	// Channel refreshes from this channel (snap refresh --amend
	// --channel).
	Channel string
	// Revision refreshes to this revision (snap refresh --amend
	// --revision).
	Revision string
	// LocalPath installs this local snap file (snap install --classic
	// --dangerous --name INSTANCE).
	LocalPath string
}

// RefreshStatus is k8sd's types.RefreshStatus: a refresh change's status
// as snapd reports it.
type RefreshStatus struct {
	// Status is the change's status ("Doing", "Done", "Error", ...).
	Status string `json:"status"`
	// Ready is set once the change will not move any more.
	Ready bool `json:"ready"`
	// Err is snapd's error text for a change that failed.
	Err string `json:"err,omitempty"`
}

// ErrEmptyRefresh: Refresh was given no channel, revision or path.
var ErrEmptyRefresh = errors.New("empty refresh options")

// Refresh refreshes the snap as k8sd's snap.Refresh does, through
// snapsvc's Client.RefreshAsync: `snap refresh INSTANCE --amend --channel
// C --no-wait` (or --revision R), or `snap install PATH --classic
// --dangerous --name INSTANCE --no-wait`. It returns the change's id once
// snapd has accepted it; a change of the snap in progress is waited out
// first (the snap command failed on it), and a request whose answer was
// lost is looked up, never sent twice (a second local install would be a
// second revision). When snapd has no update it returns "" and no error,
// as the snap command prints no id then. Under a command runner it runs
// that command (RefreshCommand) and returns what it printed, trimmed
// (WithCommandOutput), or "" (WithCommandRunner). In snapctl mode it fails
// with snapsvc.ErrRefreshInSnapctl, as k8sd refuses a refresh on a
// strictly confined deployment.
func (s *Snap) Refresh(ctx context.Context, to RefreshOpts) (string, error) {
	if s.err != nil {
		return "", &snapsvc.OpError{Op: "refresh", Snap: s.instance, Names: []string{s.instance}, Err: s.err}
	}
	if s.instance == "" {
		return "", &snapsvc.OpError{Op: "refresh", Err: fmt.Errorf("%w: no snap instance to refresh", ErrSetup)}
	}
	opts, err := refreshOptions(to)
	if err != nil {
		return "", &snapsvc.OpError{Op: "refresh", Snap: s.instance, Names: []string{s.instance}, Err: err}
	}
	if s.mode == snapsvc.ModeSnapctl {
		return "", &snapsvc.OpError{Op: "refresh", Snap: s.instance, Names: []string{s.instance}, Err: snapsvc.ErrRefreshInSnapctl}
	}
	began := time.Now()
	if s.seam() {
		cmd := RefreshCommand(s.instance, to)
		var id string
		if s.output != nil {
			out, err := s.output(ctx, cmd)
			id = strings.TrimSpace(out)
			s.logs.refresh(ctx, s.instance, outcome{command: cmd, change: id}, err, time.Since(began))
			return id, err
		}
		err := s.run(ctx, cmd)
		s.logs.refresh(ctx, s.instance, outcome{command: cmd}, err, time.Since(began))
		return "", err
	}
	op, err := s.client.RefreshAsync(ctx, s.instance, opts)
	if err != nil {
		s.logs.refresh(ctx, s.instance, outcome{}, err, time.Since(began))
		return "", err
	}
	res := op.Result()
	s.logs.refresh(ctx, s.instance, resultOutcome(&res), nil, time.Since(began))
	return res.ChangeID, nil
}

// refreshOptions is k8sd's choice among to's fields, as the library's
// options.
func refreshOptions(to RefreshOpts) (snapsvc.RefreshOptions, error) {
	switch {
	case to.Channel != "":
		return snapsvc.RefreshOptions{Channel: to.Channel, Amend: true}, nil
	case to.Revision != "":
		return snapsvc.RefreshOptions{Revision: to.Revision, Amend: true}, nil
	case to.LocalPath != "":
		return snapsvc.RefreshOptions{File: to.LocalPath, Classic: true}, nil
	}
	return snapsvc.RefreshOptions{}, ErrEmptyRefresh
}

// RefreshCommand is the snap command k8sd runs for a refresh of instance
// to to (the first of its fields set).
func RefreshCommand(instance string, to RefreshOpts) []string {
	switch {
	case to.Channel != "":
		return []string{"snap", "refresh", instance, "--amend", "--channel", to.Channel, "--no-wait"}
	case to.Revision != "":
		return []string{"snap", "refresh", instance, "--amend", "--revision", to.Revision, "--no-wait"}
	}
	return []string{"snap", "install", to.LocalPath, "--classic", "--dangerous", "--name", instance, "--no-wait"}
}

// RefreshStatus returns the status of refresh change id, as k8sd's
// RefreshStatus reads it (GET /v2/changes/ID). An unknown change matches
// snapsvc.ErrNotFound.
func (s *Snap) RefreshStatus(ctx context.Context, id string) (*RefreshStatus, error) {
	switch {
	case s.err != nil:
		return nil, &snapsvc.OpError{Op: "refresh status", Snap: s.instance, ChangeID: id, Err: s.err}
	case s.mode == snapsvc.ModeSnapctl:
		return nil, &snapsvc.OpError{Op: "refresh status", Snap: s.instance, ChangeID: id, Err: snapsvc.ErrRefreshInSnapctl}
	case s.client == nil:
		return nil, &snapsvc.OpError{Op: "refresh status", Snap: s.instance, ChangeID: id, Err: fmt.Errorf("%w: a command runner cannot read a change", ErrSetup)}
	}
	chg, err := s.client.Change(ctx, id)
	if err != nil {
		return nil, err
	}
	return &RefreshStatus{Status: chg.Status, Ready: chg.Ready, Err: chg.Err}, nil
}

// refresh logs a refresh, as action logs a service command.
func (l logs) refresh(ctx context.Context, instance string, out outcome, err error, elapsed time.Duration) {
	lg := l.of(ctx)
	if lg == nil {
		return
	}
	attrs := []slog.Attr{slog.String("snap", instance)}
	if out.change != "" {
		attrs = append(attrs, slog.String("change", out.change))
	}
	if out.conflicts > 0 {
		attrs = append(attrs, slog.Int("conflicts", out.conflicts), slog.String("waited-for", strings.Join(out.waited, ",")))
	}
	if out.command != nil {
		attrs = append(attrs, slog.String("command", strings.Join(out.command, " ")))
	}
	attrs = append(attrs, slog.Duration("elapsed", elapsed.Round(time.Millisecond)))
	switch {
	case err != nil:
		attrs = append(attrs, slog.Any("error", err))
		lg.LogAttrs(ctx, slog.LevelWarn, "cannot refresh snap", attrs...)
	case out.change == "" && out.command == nil:
		lg.LogAttrs(ctx, slog.LevelInfo, "snap has no updates available", attrs...)
	default:
		lg.LogAttrs(ctx, slog.LevelInfo, "refresh of snap accepted", attrs...)
	}
}
