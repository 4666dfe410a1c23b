package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"github.com/snapsvc/snapsvc/internal/flock"
	"github.com/snapsvc/snapsvc/internal/snapd"
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
	exitInterrupted = 130 // SIGINT (Ctrl-C): 128+2, as a shell reports a command SIGINT killed
	exitTerminated  = 143 // SIGTERM: 128+15, what a shell reports of snap killed by SIGTERM
)

// verdict is what the command line tells of an outcome: the exit code,
// and whether running the same command again later may succeed (the
// "retryable" of --json). Both come from judge, so they always agree:
// retryable is true for exit 3, false for 1, 2, 4 and 5, and either for
// 130 and 143 (an interrupted command tells which it would have been).
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

// socketPath is where the command looks for snapd: --socket, else where
// the library looks (snapsvc.SocketsFromEnv: $SNAPSVC_SOCKET,
// $SNAPSVC_SNAP_SOCKET, $SNAPPY_GLOBAL_ROOT), the snap socket inside a
// snap.
func (a *app) socketPath() string {
	if a.socket != "" {
		return a.socket
	}
	socket, snapSocket := snapsvc.SocketsFromEnv(a.getenv)
	if a.getenv("SNAP_COOKIE") != "" || a.getenv("SNAP_CONTEXT") != "" {
		return snapSocket
	}
	return socket
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
		Kind string `json:"kind,omitempty"`
		// Cause is the library's whole error, every layer's words
		// (Message says each fact once).
		Cause     string `json:"cause"`
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

// report prints err (if any) once, on the stream its reader reads, and
// returns the exit code.
//
// Without --json, stderr gets one "error: " and the message (message):
// for a change that failed, snapd's own text as snap prints it, a short
// line and the failed tasks on lines of their own; otherwise one line,
// each fact once. A line of its own may follow for a person: how to wait
// for a change that may still run, or that trying again later may help
// (exit 3). -v adds the library's whole error on a "detail:" line.
//
// Under --json the error is the one document on stdout, usage errors
// included, and nothing is said on stderr: the error object, whose
// retryable says what the second line would, and whose cause is the
// library's whole error (commands print nothing on stdout when they
// fail). stderr keeps only what is said while a command runs (snapd
// unreachable, -v's log).
func (a *app) report(err error) int {
	cmd := a.name
	if cmd == "" {
		cmd = strings.TrimPrefix(a.cmd, "snapsvc ")
	}
	v := judge(err)
	if v.code == exitOK {
		return v.code
	}
	if v.code == exitInterrupted && a.signal == syscall.SIGTERM {
		v.code = exitTerminated
	}
	var ie *interruptedError
	if errors.As(err, &ie) && ie.quiet {
		// logs -f: following ends so, with nothing to say (snap logs
		// -f, killed by the signal, says nothing either).
		return v.code
	}
	msg := a.message(err, v)
	if a.json {
		a.reportJSON(err, v, msg, cmd)
		return v.code
	}
	var ue *clistyle.UsageError
	if errors.As(err, &ue) {
		if ue.Cmd == "" {
			ue.Cmd = "snapsvc"
		}
		ue.Fprint(a.stderr)
		return v.code
	}
	fmt.Fprintf(a.stderr, "error: %s\n", msg)
	change := changeOf(err)
	switch {
	case v.code == exitUnknown && change != "":
		fmt.Fprintf(a.stderr, "The change may still be running: 'snapsvc watch %s' waits for it; running %s again would act again.\n", change, cmd)
	case (v.code == exitInterrupted || v.code == exitTerminated) && change != "":
		// Ctrl-C stops the waiting, not the change: a service
		// command's change is short and half of one aborted leaves
		// services in a mix of states (snap aborts it; we leave that
		// to an explicit abort).
		fmt.Fprintf(a.stderr, "Change %s goes on in snapd: 'snapsvc watch %s' waits for it again, 'snapsvc abort %s' stops what has not started.\n", change, change, change)
	case v.code == exitUnknown:
		fmt.Fprintf(a.stderr, "snapd may have acted on the request: check with 'snapsvc status' and 'snapsvc changes' before running %s again.\n", cmd)
	case v.code == exitTimeout && v.retryable:
		fmt.Fprintln(a.stderr, retryHint(err))
	}
	if a.verbose {
		fmt.Fprintf(a.stderr, "detail: %s\n", causeText(err))
	}
	return v.code
}

// retryHint is the line that says, in words, that trying again later may
// help (exit 3; --json's retryable): once the change that holds the snap
// is done, when one does.
func retryHint(err error) string {
	if c, ok := retry.AsConflict(err); ok && c.ChangeID != "" && !c.AllSnaps {
		return fmt.Sprintf("Trying again once change %s is done may help: 'snapsvc watch %s' waits for it.", c.ChangeID, c.ChangeID)
	}
	return "Trying again later may help."
}

// reportJSON prints err as --json's error object on stdout: one document,
// or, for follow's JSON Lines, the last line.
func (a *app) reportJSON(err error, v verdict, msg, cmd string) {
	var je jsonError
	// The "retryable" field says it: no "[retryable]" in the text.
	je.Error.Message = oneLine(dropMarkers(msg))
	je.Error.Cause = causeText(err)
	je.Error.ExitCode = v.code
	je.Error.Change = changeOf(err)
	var ce *snapsvc.ChangeError
	if errors.As(err, &ce) {
		je.Error.Status = ce.Status
	}
	je.Error.Retryable = v.retryable
	var ae *snapsvc.APIError
	if errors.As(err, &ae) {
		je.Error.Kind = ae.Kind
	}
	var de *detailError
	if errors.As(err, &de) {
		je.Error.Detail = de.detail
	}
	if cmd == "follow" || (cmd == "watch" && a.followMode) {
		// watch prints JSON Lines: the error is the last line.
		b, _ := json.Marshal(je)
		fmt.Fprintf(a.stdout, "%s\n", b)
		return
	}
	a.printJSON(je)
}

// changeOf is the change err names: the operation's, the failed one, or
// the one an interrupted wait was waiting for.
func changeOf(err error) string {
	change := ""
	var oe *snapsvc.OpError
	var ce *snapsvc.ChangeError
	var ie *interruptedError
	if errors.As(err, &oe) {
		change = oe.ChangeID
	}
	if errors.As(err, &ce) && ce.ID != "" {
		change = ce.ID
	}
	if errors.As(err, &ie) && ie.change != "" {
		change = ie.change
	}
	return change
}

// message is what stderr says of err after "error: ", each fact once and
// without the library's prefixes ("snapsvc: ", "snapd: ") or snapd's
// request details (method, path, HTTP status, kind: --json and -v have
// them). Whether trying again may help is report's second line (exit 3)
// and --json's retryable; the exit code says the rest.
//
//   - A change that failed: snapd's text as snap prints it (the failed
//     tasks on lines of their own, "cannot perform the following
//     tasks:\n- ..."), nothing added: the change is in --json.
//   - Not found: snapd's message, as snap prints it.
//   - Otherwise the operation ("restart k8s.kubelet") and why.
func (a *app) message(err error, v verdict) string {
	var ue *clistyle.UsageError
	if errors.As(err, &ue) {
		return ue.Msg
	}
	var ce *snapsvc.ChangeError
	if errors.As(err, &ce) && strings.TrimSpace(ce.Err) != "" {
		return strings.TrimRight(ce.Err, "\n")
	}
	if line, ok := a.unreachableLine(err, v); ok {
		return line
	}
	if line, ok := a.refusedLine(err); ok {
		return line
	}
	var ae *snapsvc.APIError
	if errors.Is(err, snapsvc.ErrNotFound) && errors.As(err, &ae) && ae.Message != "" && !wrapsMore(err, ae) {
		return ae.Message
	}
	head := ""
	cause := err
	var oe *snapsvc.OpError
	if errors.As(err, &oe) {
		head = oe.Op + " " + strings.Join(oe.Names, " ")
		cause = oe.Err
	}
	var why string
	var ni *snapsvc.NotInstalledError
	switch {
	case errors.As(err, &ni):
		why = fmt.Sprintf("%v: no socket at %s and %s", snapsvc.ErrSnapdNotInstalled, ni.Socket, ni.Reason)
	case v.code == exitTimeout:
		why = a.waitedOut(cause)
		if why == "" {
			why = a.timedOutRequest(cause)
		}
	case v.code == exitUnknown:
		why = a.unknownOutcome(cause, changeOf(err))
	}
	if why == "" {
		why = plain(cause)
	}
	msg := why
	if head != "" {
		msg = head + ": " + why
	}
	if v.code == exitTimeout && v.retryable && oe != nil && oe.ChangeID == "" && !strings.Contains(msg, "nothing was done") {
		msg += "; nothing was done"
	}
	return msg
}

// wrapsMore reports whether err says more than inner, the error it wraps
// (a command's own words around snapd's answer).
func wrapsMore(err, inner error) bool {
	var oe *snapsvc.OpError
	outer := err
	if errors.As(err, &oe) {
		outer = oe.Err
	}
	return outer.Error() != inner.Error() && !strings.HasPrefix(outer.Error(), "snapsvc: reading ")
}

// waitedOut words a conflict that outlasted --timeout or the library's
// policy: "timed out after 2s (--timeout) waiting for change 5
// (configure-snap), which holds snap "k8s"". It returns "" for anything
// else.
func (a *app) waitedOut(err error) string {
	c, ok := retry.AsConflict(err)
	if !ok {
		return ""
	}
	why := "gave up"
	switch {
	case errors.Is(err, snapsvc.ErrGaveUp):
		why = gaveUpReason(err)
	case errors.Is(err, context.DeadlineExceeded):
		why = a.timedOut(err)
	}
	var holder string
	switch {
	case c.AllSnaps:
		return why + ": " + c.Message
	case c.ChangeID != "" && strings.Contains(why, "change "+c.ChangeID):
		return why // "blocking change 5 (auto-refresh) is waiting, for a reboot..."
	case c.ChangeID != "" && c.ChangeKind != "":
		holder = fmt.Sprintf("change %s (%s), which holds snap %q", c.ChangeID, c.ChangeKind, c.Snap)
	case c.ChangeID != "":
		holder = fmt.Sprintf("change %s, which holds snap %q", c.ChangeID, c.Snap)
	case c.ChangeKind != "":
		holder = fmt.Sprintf("a %q change that holds snap %q", c.ChangeKind, c.Snap)
	default:
		holder = fmt.Sprintf("the changes that hold snap %q", c.Snap)
	}
	return why + " waiting for " + holder
}

// unknownOutcome words a request to act whose outcome is not known: why
// the command stopped ("timed out after 1s (--timeout)", the library's
// reason for giving up, snapd's answer lost) and at which point: before
// change (its change, or the one found doing what it asked) was done, or
// while snapd's answer was pending. It returns "" for anything else (a
// budget slot lost after acting: its own text says it).
func (a *app) unknownOutcome(err error, change string) string {
	var be *snapsvc.BudgetError
	if errors.As(err, &be) {
		return ""
	}
	lost := errors.Is(err, snapsvc.ErrOutcomeUnknown) || retry.Classify(err) == retry.Indeterminate
	why := ""
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		why = a.timedOut(err)
	case errors.Is(err, snapsvc.ErrGaveUp):
		why = gaveUpReason(err)
	case lost && change == "":
		return "snapd's answer was lost"
	default:
		return ""
	}
	switch {
	case lost && change != "":
		return why + " while snapd's answer was pending; change " + change + ", made meanwhile, does what it asked"
	case lost:
		return why + " while snapd's answer was pending"
	}
	return why + " before change " + change + " was done"
}

// timedOutRequest words a request to snapd that time ended: "timed out
// after 1s (--timeout) waiting for snapd's answer to GET /v2/changes/1".
// It returns "" for anything else.
func (a *app) timedOutRequest(err error) string {
	var ce *snapsvc.ConnectionError
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ce) {
		return ""
	}
	if !ce.Connected {
		return fmt.Sprintf("%s connecting to snapd at %s", a.timedOut(err), ce.Socket)
	}
	return fmt.Sprintf("%s waiting for snapd's answer to %s %s", a.timedOut(err), ce.Method, ce.Path)
}

// timedOut says which time ran out: "timed out after 1s (--timeout)" when
// --timeout did (the library's errors carry the context's plain
// DeadlineExceeded, not --timeout's cause), else "timed out".
func (a *app) timedOut(err error) string {
	var te timeoutError
	switch {
	case errors.As(err, &te):
		return te.Error()
	case a.timeout > 0:
		return timeoutError{a.timeout}.Error()
	}
	return "timed out"
}

// gaveUpReason is why the library gave up ("gave up after 5m0s"): the
// text of the error that joins snapsvc.ErrGaveUp to the last failure,
// without that failure.
func gaveUpReason(err error) string {
	for todo := []error{err}; len(todo) > 0; {
		e := todo[0]
		todo = todo[1:]
		switch w := e.(type) {
		case interface{ Unwrap() []error }:
			errs := w.Unwrap()
			if len(errs) == 2 && (errs[0] == snapsvc.ErrGaveUp || errs[1] == snapsvc.ErrGaveUp) {
				last := errs[0]
				if last == snapsvc.ErrGaveUp {
					last = errs[1]
				}
				if r, ok := strings.CutSuffix(e.Error(), ": "+last.Error()); ok {
					return r
				}
			}
			todo = append(todo, errs...)
		case interface{ Unwrap() error }:
			if inner := w.Unwrap(); inner != nil {
				todo = append(todo, inner)
			}
		}
	}
	return "gave up"
}

// plain is err's text without what the library and snapd's envelope put
// around it: "snapsvc: " prefixes, snapd's request details, the
// OpError's retryable marker, and Go's "context deadline exceeded" after
// our own --timeout line.
func plain(err error) string {
	s := err.Error()
	var ae *snapsvc.APIError
	if errors.As(err, &ae) && ae.Message != "" {
		s = strings.Replace(s, ae.Error(), ae.Message, 1)
	}
	s = strings.ReplaceAll(s, "snapsvc: ", "")
	s = strings.ReplaceAll(s, "(--timeout): context deadline exceeded", "(--timeout)")
	return oneLine(dropMarkers(s))
}

// dropMarkers removes the retryable markers the library's OpError ends
// with ("[retryable]", "[not retryable]"): the command's verdict says it
// (--json's retryable, the exit code, the human error's second line).
func dropMarkers(s string) string {
	for _, m := range []string{" [retryable]", " [not retryable]"} {
		s = strings.ReplaceAll(s, m, "")
	}
	return s
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
// if any, goes on in snapd. Exit 130 (143 for SIGTERM).
type interruptedError struct {
	change string
	err    error
	// quiet: nothing is printed (logs -f, which only a signal or
	// --timeout ends), only the exit code says it.
	quiet bool
	// sig is the signal, when one ended the wait (terminatedBy).
	sig os.Signal
}

func (e *interruptedError) Error() string {
	what := "interrupted"
	if e.sig == syscall.SIGTERM {
		what = "terminated (SIGTERM)"
	}
	if e.change == "" {
		return what
	}
	return what + " while waiting for change " + e.change
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
	what := ""
	var oe *snapsvc.OpError
	if errors.As(err, &oe) {
		what = oe.Op + " " + strings.Join(oe.Names, " ") + ": "
	}
	socket := ce.Socket
	if socket == "" {
		socket = a.socketPath()
	}
	line := fmt.Sprintf("%scannot reach snapd at %s: %s", what, socket, dialReason(ce))
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
	return line, true
}

// refusedLine is the one line for what retrying cannot change and only
// the user can: a socket path that is not a socket, no permission to
// connect to it or to take snapsvc's lock, snapd's "access denied". Like
// snap, it suggests sudo to a user who is not root.
func (a *app) refusedLine(err error) (string, bool) {
	what := ""
	var oe *snapsvc.OpError
	if errors.As(err, &oe) {
		what = oe.Op + " " + strings.Join(oe.Names, " ") + ": "
	}
	var se *snapd.SocketError
	var pe *flock.PermissionError
	var ae *snapsvc.APIError
	switch {
	case errors.As(err, &se) && se.Denied:
		return fmt.Sprintf("%scannot connect to snapd at %s: permission denied%s", what, se.Socket, a.sudoHint()), true
	case errors.As(err, &se):
		return fmt.Sprintf("%scannot reach snapd at %s: it %s", what, se.Socket, se.Problem), true
	case errors.As(err, &pe) && pe.Owner < 0:
		return fmt.Sprintf("%spermission denied: cannot create snapsvc's lock %s%s", what, pe.Path, a.sudoHint()), true
	case errors.As(err, &pe):
		owner := fmt.Sprintf("uid %d", pe.Owner)
		if pe.Owner == 0 {
			owner = "root"
		}
		return fmt.Sprintf("%spermission denied: snapsvc's lock %s belongs to %s%s", what, pe.Path, owner, a.sudoHint()), true
	case errors.As(err, &ae) && ae.Kind == "login-required" && (ae.StatusCode == 401 || ae.StatusCode == 403):
		// cmd/snap/error.go: "%s (try with sudo)" for a user who is
		// not root.
		return what + ae.Message + a.sudoHint(), true
	}
	return "", false
}

// sudoHint is " (try with sudo)" for a user who is not root, as snap
// says it, else "".
func (a *app) sudoHint() string {
	euid := os.Geteuid
	if a.geteuid != nil {
		euid = a.geteuid
	}
	if euid() == 0 {
		return ""
	}
	return " (try with sudo)"
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
