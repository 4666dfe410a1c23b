package main

import (
	"context"
	"errors"
	"fmt"

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
	case errors.Is(err, snapsvc.ErrNotFound):
		return exitNotFound
	}
	return exitFailed
}

// jsonError is the shape of an error under --json.
type jsonError struct {
	Error struct {
		Message   string `json:"message"`
		ExitCode  int    `json:"exit-code"`
		Change    string `json:"change,omitempty"`
		Status    string `json:"status,omitempty"`
		Retryable *bool  `json:"retryable,omitempty"`
	} `json:"error"`
}

// report prints err (if any) and returns the exit code.
func (a *app) report(cmd string, err error) int {
	code := exitCode(err)
	if code == exitOK {
		return code
	}
	var ue *usageError
	if errors.As(err, &ue) {
		if ue.msg != "" {
			fmt.Fprintf(a.stderr, "error: %s\nRun 'snapsvc %s -h' for usage.\n", ue.msg, cmd)
		}
		return code
	}
	fmt.Fprintf(a.stderr, "error: %v\n", err)
	if a.json {
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
		a.printJSON(je)
	}
	return code
}
