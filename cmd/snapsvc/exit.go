package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Exit codes; see the package documentation.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitTimeout     = 3
	exitNotFound    = 4
	exitUnknown     = 5
	exitInterrupted = 130
)

// verdict is what the command line tells of an outcome: the exit code,
// and whether running the same command again later may succeed (the
// "retryable" of --json). Both come from judge, so they always agree:
// retryable is true for exit 3, false for 1, 2, 4 and 5, and either for
// 130 (an interrupted command tells which it would have been).
type verdict struct {
	code      int
	retryable bool
}

// judge is the one rule from an error to its verdict.
//
// A request to act that snapd carried out, or may have, is never
// retryable: its change may still be running, and the same command again
// would act again (restart twice). That is exit 5 unless the change is
// known to have failed (1). Otherwise a failure is retryable when nothing
// was done and the cause can pass: the time ran out (--timeout, or the
// library gave up) while waiting for another change or for snapd, snapd
// is unreachable or restarting, or a read or a wait ended early (reading
// or waiting again is harmless).
func judge(err error) verdict {
	var ue *usageError
	var ce *snapsvc.ChangeError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return verdict{code: exitOK}
	case errors.As(err, &ue),
		errors.Is(err, snapsvc.ErrInvalidName),
		errors.Is(err, snapsvc.ErrNoNames),
		errors.Is(err, snapsvc.ErrWrongSnap):
		return verdict{code: exitUsage}
	case errors.As(err, &ce):
		// The change ran and failed: waiting longer would not help.
		return verdict{code: exitFailed}
	case errors.Is(err, snapsvc.ErrNotFound):
		return verdict{code: exitNotFound}
	}
	acted := actedOn(err)
	retryable := !acted && mayPass(err)
	switch {
	case errors.Is(err, context.Canceled):
		return verdict{code: exitInterrupted, retryable: retryable}
	case acted:
		return verdict{code: exitUnknown}
	case retryable:
		return verdict{code: exitTimeout, retryable: true}
	}
	return verdict{code: exitFailed}
}

// actedOn reports whether err ends a request to act that snapd carried
// out, or may have: one that made a change (named by the OpError), or
// whose outcome is unknown.
func actedOn(err error) bool {
	var oe *snapsvc.OpError
	return errors.Is(err, snapsvc.ErrOutcomeUnknown) ||
		(errors.As(err, &oe) && oe.ChangeID != "") ||
		retry.Classify(err) == retry.Indeterminate
}

// mayPass reports whether the cause of err can go away by itself: time
// that ran out, a conflict, an unreachable or restarting snapd.
func mayPass(err error) bool {
	return errors.Is(err, snapsvc.ErrGaveUp) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) ||
		retry.IsRetryable(err) ||
		unreachable(err)
}

// unreachable reports whether err means snapd could not be reached (or
// is restarting): retrying later may help.
func unreachable(err error) bool {
	var ce *snapsvc.ConnectionError
	return retry.Classify(err) == retry.Transient || errors.As(err, &ce)
}

// socketPath is where the command looks for snapd, for messages.
func (a *app) socketPath() string {
	switch {
	case a.socket != "":
		return a.socket
	case a.getenv("SNAP_COOKIE") != "" || a.getenv("SNAP_CONTEXT") != "":
		return "/run/snapd-snap.socket"
	}
	return "/run/snapd.socket"
}

// jsonError is the shape of an error under --json.
type jsonError struct {
	Error struct {
		Message   string `json:"message"`
		ExitCode  int    `json:"exit-code"`
		Change    string `json:"change,omitempty"`
		Status    string `json:"status,omitempty"`
		Retryable bool   `json:"retryable"`
		// Detail is what the command found before failing: the change
		// for wait, the report for demo.
		Detail any `json:"detail,omitempty"`
	} `json:"error"`
}

// detailError is a command's failure together with what it had found
// (under --json it goes into the error object, as the only document).
type detailError struct {
	err    error
	detail any
}

func (e *detailError) Error() string { return e.err.Error() }
func (e *detailError) Unwrap() error { return e.err }

// report prints err (if any) and returns the exit code. Under --json
// stdout gets exactly one document for a failure, usage errors included:
// the error object (commands print nothing on stdout when they fail).
func (a *app) report(cmd string, err error) int {
	v := judge(err)
	if v.code == exitOK {
		return v.code
	}
	var ue *usageError
	var oe *snapsvc.OpError
	var ce *snapsvc.ChangeError
	change := ""
	if errors.As(err, &oe) {
		change = oe.ChangeID
	}
	if errors.As(err, &ce) && ce.ID != "" {
		change = ce.ID
	}
	if errors.As(err, &ue) {
		if !ue.printed {
			fmt.Fprintf(a.stderr, "error: %s\n", ue.msg)
			if cmd != "" {
				fmt.Fprintf(a.stderr, "Run 'snapsvc %s -h' for usage.\n", cmd)
			} else {
				fmt.Fprintf(a.stderr, "Run 'snapsvc -h' for usage.\n")
			}
		}
	} else {
		if v.code == exitTimeout && unreachable(err) {
			err = fmt.Errorf("snapd is unreachable at %s (is it running? retrying later may help): %w", a.socketPath(), err)
		}
		fmt.Fprintf(a.stderr, "error: %v\n", err)
		switch {
		case v.code == exitUnknown && change != "":
			fmt.Fprintf(a.stderr, "Change %s was made and may still be running: 'snapsvc wait %s' waits for it; running %s again would act again.\n", change, change, cmd)
		case v.code == exitUnknown:
			fmt.Fprintf(a.stderr, "snapd may have acted on the request: check with 'snapsvc status' and 'snapsvc changes' before running %s again.\n", cmd)
		}
	}
	if !a.json {
		return v.code
	}
	var je jsonError
	je.Error.Message = err.Error()
	je.Error.ExitCode = v.code
	je.Error.Change = change
	if ce != nil {
		je.Error.Status = ce.Status
	}
	je.Error.Retryable = v.retryable
	var de *detailError
	if errors.As(err, &de) {
		je.Error.Detail = de.detail
	}
	if cmd == "watch" {
		// watch prints JSON Lines: the error is the last line.
		b, _ := json.Marshal(je)
		fmt.Fprintf(a.stdout, "%s\n", b)
		return v.code
	}
	a.printJSON(je)
	return v.code
}
