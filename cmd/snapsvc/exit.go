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
	exitInterrupted = 130
)

// exitCode maps an error to the documented exit code.
func exitCode(err error) int {
	var ue *usageError
	var ce *snapsvc.ChangeError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &ue),
		errors.Is(err, snapsvc.ErrInvalidName),
		errors.Is(err, snapsvc.ErrNoNames),
		errors.Is(err, snapsvc.ErrWrongSnap):
		return exitUsage
	case errors.As(err, &ce):
		// The change ran and failed: waiting longer would not help.
		return exitFailed
	case errors.Is(err, snapsvc.ErrGaveUp), errors.Is(err, context.DeadlineExceeded):
		return exitTimeout
	case errors.Is(err, context.Canceled):
		return exitInterrupted
	case unreachable(err):
		// Nothing was done; the same command may work once snapd is back.
		return exitTimeout
	case errors.Is(err, snapsvc.ErrNotFound):
		return exitNotFound
	}
	return exitFailed
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
		Retryable *bool  `json:"retryable,omitempty"`
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
	code := exitCode(err)
	if code == exitOK {
		return code
	}
	var ue *usageError
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
		if code == exitTimeout && unreachable(err) {
			err = fmt.Errorf("snapd is unreachable at %s (is it running? retrying later may help): %w", a.socketPath(), err)
		}
		fmt.Fprintf(a.stderr, "error: %v\n", err)
	}
	if !a.json {
		return code
	}
	var je jsonError
	je.Error.Message = err.Error()
	je.Error.ExitCode = code
	var oe *snapsvc.OpError
	if errors.As(err, &oe) {
		je.Error.Change = oe.ChangeID
		r := oe.Retryable()
		je.Error.Retryable = &r
	}
	var ce *snapsvc.ChangeError
	if errors.As(err, &ce) {
		if ce.ID != "" {
			je.Error.Change = ce.ID
		}
		je.Error.Status = ce.Status
	}
	if je.Error.Retryable == nil && unreachable(err) {
		r := true
		je.Error.Retryable = &r
	}
	var de *detailError
	if errors.As(err, &de) {
		je.Error.Detail = de.detail
	}
	if cmd == "watch" {
		// watch prints JSON lines: the error is the last line.
		b, _ := json.Marshal(je)
		fmt.Fprintf(a.stdout, "%s\n", b)
		return code
	}
	a.printJSON(je)
	return code
}
