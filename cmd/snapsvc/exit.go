package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"github.com/snapsvc/snapsvc/cmd/internal/clistyle"
	"github.com/snapsvc/snapsvc/probe"
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
	var ue *clistyle.UsageError
	var ce *snapsvc.ChangeError
	switch {
	case err == nil:
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
	case errors.Is(err, snapsvc.ErrSnapdNotInstalled):
		// Nothing on the system would create snapd's socket: the library
		// says it is not retryable, and waiting cannot help.
		return verdict{code: exitFailed}
	case notReadyAfterActing(err):
		// The change was done, the service failed its readiness check:
		// the operation failed, and its outcome is known.
		return verdict{code: exitFailed}
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

// notReadyAfterActing reports whether err is a budgeted operation whose
// change was done but whose service did not pass its readiness check.
func notReadyAfterActing(err error) bool {
	var be *snapsvc.BudgetError
	var nr *probe.NotReadyError
	return errors.As(err, &be) && errors.As(be.Err, &nr)
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

// mayPass reports whether the cause of err can go away by itself, as the
// library judges it: the library's own verdict when err carries one
// (*snapsvc.OpError, *snapsvc.BudgetError: their Retryable), else time
// that ran out, a conflict, an unreachable or restarting snapd. A request
// that acted is answered before (actedOn), so the Indeterminate class
// never makes a command retryable.
func mayPass(err error) bool {
	var r interface{ Retryable() bool }
	if errors.As(err, &r) {
		return r.Retryable()
	}
	return errors.Is(err, snapsvc.ErrGaveUp) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) ||
		retry.IsRetryable(err) ||
		unreachable(err)
}

// unreachable reports whether err means snapd could not be reached (or
// is restarting): retrying later may help. A snapd that is not installed
// is not unreachable (snapsvc.ErrSnapdNotInstalled: nothing would create
// its socket).
func unreachable(err error) bool {
	return retry.Classify(err) == retry.Transient || retry.IsUnreachable(err)
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
		Message  string `json:"message"`
		ExitCode int    `json:"exit-code"`
		Change   string `json:"change,omitempty"`
		Status   string `json:"status,omitempty"`
		// Kind is snapd's error kind ("app-not-found",
		// "snap-not-found", "daemon-restart", ...), when snapd said one.
		Kind      string `json:"kind,omitempty"`
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
func (a *app) report(err error) int {
	cmd := a.name
	if cmd == "" {
		cmd = strings.TrimPrefix(a.cmd, "snapsvc ")
	}
	v := judge(err)
	if v.code == exitOK {
		return v.code
	}
	var ue *clistyle.UsageError
	var oe *snapsvc.OpError
	var ce *snapsvc.ChangeError
	change := ""
	if errors.As(err, &oe) {
		change = oe.ChangeID
	}
	if errors.As(err, &ce) && ce.ID != "" {
		change = ce.ID
	}
	var ie *interruptedError
	if errors.As(err, &ie) && ie.change != "" {
		change = ie.change
	}
	if errors.As(err, &ue) {
		path := ue.Cmd
		if path == "" {
			path = "snapsvc"
		}
		fmt.Fprintf(a.stderr, "error: %s\nRun '%s --help' for usage.\n", ue.Msg, path)
	} else {
		msg := oneLine(err.Error())
		if line, ok := a.unreachableLine(err, v); ok {
			msg = line
		}
		fmt.Fprintf(a.stderr, "error: %s\n", msg)
		switch {
		case v.code == exitUnknown && change != "":
			fmt.Fprintf(a.stderr, "Change %s was made and may still be running: 'snapsvc wait %s' waits for it; running %s again would act again.\n", change, change, cmd)
		case v.code == exitInterrupted && change != "":
			// Ctrl-C stops the waiting, not the change: a service
			// command's change is short and half of one aborted leaves
			// services in a mix of states (snap aborts it; we leave that
			// to an explicit abort).
			fmt.Fprintf(a.stderr, "Change %s goes on in snapd: 'snapsvc watch %s' waits for it again, 'snapsvc abort %s' stops what has not started.\n", change, change, change)
		case v.code == exitUnknown:
			fmt.Fprintf(a.stderr, "snapd may have acted on the request: check with 'snapsvc status' and 'snapsvc changes' before running %s again.\n", cmd)
		}
	}
	if !a.json {
		return v.code
	}
	var je jsonError
	je.Error.Message = oneLine(err.Error())
	je.Error.ExitCode = v.code
	je.Error.Change = change
	if ce != nil {
		je.Error.Status = ce.Status
	}
	je.Error.Retryable = v.retryable
	var ae *snapsvc.APIError
	if errors.As(err, &ae) {
		je.Error.Kind = ae.Kind
	}
	if line, ok := a.unreachableLine(err, v); ok {
		je.Error.Message = line
	}
	var de *detailError
	if errors.As(err, &de) {
		je.Error.Detail = de.detail
	}
	if cmd == "follow" || (cmd == "watch" && a.followMode) {
		// watch prints JSON Lines: the error is the last line.
		b, _ := json.Marshal(je)
		fmt.Fprintf(a.stdout, "%s\n", b)
		return v.code
	}
	a.printJSON(je)
	return v.code
}

// jsonRequested reports whether args ask for --json before any "--" (a
// usage error may stop cobra before it sets the flag).
func jsonRequested(args []string) bool {
	want := false
	for _, arg := range args {
		if arg == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "--") || name != "json" {
			continue
		}
		want = true
		if hasVal {
			want, _ = strconv.ParseBool(val)
		}
	}
	return want
}

// interruptedError is a wait that Ctrl-C (or SIGTERM) ended: the change,
// if any, goes on in snapd. Exit 130.
type interruptedError struct {
	change string
	err    error
}

func (e *interruptedError) Error() string {
	if e.change == "" {
		return "interrupted"
	}
	return "interrupted while waiting for change " + e.change
}
func (e *interruptedError) Unwrap() error { return e.err }

// unreachableLine is the one line for a command that gave up on an
// unreachable snapd: what, where, why, for how long, retryable; each once
// (the error chain names the socket three times and the request twice).
func (a *app) unreachableLine(err error, v verdict) (string, bool) {
	var ce *snapsvc.ConnectionError
	if v.code != exitTimeout || !errors.As(err, &ce) || ce.Written {
		return "", false
	}
	what := "snapsvc " + a.name
	var oe *snapsvc.OpError
	if errors.As(err, &oe) {
		what = oe.Op + " " + strings.Join(oe.Names, " ")
	}
	socket := ce.Socket
	if socket == "" {
		socket = a.socketPath()
	}
	line := fmt.Sprintf("%s: cannot reach snapd at %s: %s", what, socket, dialReason(ce))
	switch {
	case errors.Is(err, snapsvc.ErrGaveUp):
		line += fmt.Sprintf("; gave up after %v (--wait-snapd)", a.waitSnapd)
	case errors.Is(err, context.DeadlineExceeded) && a.timeout > 0:
		line += fmt.Sprintf("; timed out after %v (--timeout)", a.timeout)
	case errors.Is(err, context.DeadlineExceeded):
		line += "; timed out"
	}
	if oe != nil {
		line += "; nothing was done"
	}
	return line + " [retryable]", true
}

// dialReason says why snapd's socket could not be dialled, without the
// socket's path and the request the error chain repeats.
func dialReason(ce *snapsvc.ConnectionError) string {
	msg := ce.Err.Error()
	for _, m := range []string{`: Get "`, `: Post "`} {
		if i := strings.Index(msg, m); i >= 0 {
			msg = msg[:i]
		}
	}
	switch {
	case strings.Contains(msg, "does not exist"):
		return "no socket there (is snapd running?)"
	case strings.HasPrefix(msg, ce.Socket+" "):
		return "it " + strings.TrimPrefix(msg, ce.Socket+" ") // "it is a directory, not a socket"
	case errors.Is(ce, syscall.ECONNREFUSED):
		return "connection refused (nothing listens on the socket)"
	}
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+2:]
	}
	return msg
}

// oneLine puts a message on one line: snapd's change errors list their
// failed tasks on lines of their own ("cannot perform the following
// tasks:\n- Run configure hook ... (boom)").
func oneLine(s string) string {
	s = strings.ReplaceAll(s, ":\n- ", ": ")
	s = strings.ReplaceAll(s, "\n- ", "; ")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
