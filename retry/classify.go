// Package retry classifies the errors snapd answers and holds the retry
// policy snapsvc applies to them.
//
// To ask whether retrying an operation that failed with err can help,
// call IsRetryable(err): the error's own verdict (snapsvc's *OpError
// knows whether a change was made), else its class. The rest answer other
// questions: ShouldRetry is the rule of a retry loop kept around the
// calls (Do, Loop), IsConflict and Classify say what kind of failure it
// is, for errors as snapd answered them.
//
// Classify sorts any error from snapsvc's wire client (or a plain error
// carrying snapctl's text) into one of four classes: a Conflict (another
// change holds the snap: retry once it is done), Transient (snapd is
// unreachable or restarting: back off and retry), Indeterminate (the
// request may have been acted on, for instance a POST whose answer was
// lost: find out before sending it again) and Permanent (retrying cannot
// help).
package retry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Class says what retrying an operation that failed with an error can do.
type Class int

const (
	// Permanent errors cannot be fixed by retrying: unknown snap or
	// service, a malformed request, a refused permission, a failed change.
	Permanent Class = iota
	// Conflict means another change holds the snap; the same request
	// succeeds once that change is ready.
	Conflict
	// Transient means snapd could not be reached or is restarting; retry
	// after a pause.
	Transient
	// Indeterminate means the request may have been carried out although
	// no answer said so (a lost response, a snapctl call that took too
	// long): look at snapd's changes before sending it again.
	Indeterminate
)

func (c Class) String() string {
	switch c {
	case Permanent:
		return "permanent"
	case Conflict:
		return "conflict"
	case Transient:
		return "transient"
	case Indeterminate:
		return "indeterminate"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Retryable reports whether retrying may help an error of the class
// (every class but Permanent). It is the class's answer alone, for errors
// as snapd answered them; IsRetryable asks the error first (an error of
// class Conflict whose operation made a change must not be retried).
func (c Class) Retryable() bool { return c != Permanent }

// Classify returns the class of err. Conflicts are recognised in every
// form snapd uses: POST /v2/apps answers them as HTTP 400 with no kind
// (daemon/api_apps.go), POST /v2/snapctl as 400 with the prefix
// "error running snapctl: " (snapd < 2.70) or "snapctl: " (>= 2.70), other
// endpoints as 409 with kind snap-change-conflict or quota-change-conflict.
// A nil error is Permanent (there is nothing to retry); a cancelled or
// expired context is Permanent too, as the caller has given up.
func Classify(err error) Class {
	if err == nil {
		return Permanent
	}
	if _, ok := AsConflict(err); ok {
		return Conflict
	}
	var ind interface{ Indeterminate() bool }
	if errors.As(err, &ind) && ind.Indeterminate() {
		return Indeterminate
	}
	if errors.Is(err, snapd.ErrNotInstalled) || badSocket(err) {
		// No socket and nothing that would create it, a path that is not
		// a socket, or no permission to connect: waiting cannot help.
		return Permanent
	}
	var connErr *snapd.ConnectionError
	if errors.As(err, &connErr) {
		if connErr.Written && connErr.Method != http.MethodGet {
			return Indeterminate
		}
		return Transient
	}
	var apiErr *snapd.Error
	if errors.As(err, &apiErr) {
		return classifyAPIError(apiErr)
	}
	var garbled *snapd.ResponseError
	if errors.As(err, &garbled) {
		// An answer that is not an envelope (a proxy's page, a body larger
		// than snapd sends, an "async" answer without its change): a read
		// can simply be asked again, but a request to act may have been
		// accepted — a 202 certainly was — so its change must be looked for.
		if garbled.Method == http.MethodGet {
			return Transient
		}
		return Indeterminate
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Permanent
	}
	msg := stripPrefixes(err.Error())
	if isTakingTooLong(msg) || strings.Contains(msg, "timeout exceeded while waiting for response") {
		return Indeterminate
	}
	if strings.Contains(msg, "cannot communicate with server") {
		return Transient
	}
	return Permanent
}

func classifyAPIError(e *snapd.Error) Class {
	// A request to act that snapd dropped because it is shutting down may
	// have been carried out already (snapctl's service commands make their
	// change, then wait for it, and the wait is what is cancelled): its
	// change must be looked up, maintenance or not.
	if e.StatusCode == http.StatusInternalServerError && e.Message == "request canceled" && e.Method != "" && e.Method != http.MethodGet {
		return Indeterminate
	}
	// snapd puts "maintenance" on every answer while a restart is pending
	// (daemon/daemon.go), for minutes before a reboot: it makes server
	// errors worth retrying, but an unknown service stays unknown.
	if e.Maintenance != nil && e.StatusCode >= 500 {
		return Transient
	}
	switch e.Kind {
	case snapd.KindDaemonRestart, snapd.KindSystemRestart:
		return Transient
	}
	msg := stripPrefixes(e.Message)
	if isTakingTooLong(msg) {
		// snapctl gave up waiting (daemon/api_snapctl.go via
		// ctlcmd runServiceCommand) while the change carries on.
		return Indeterminate
	}
	switch e.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return Transient
	case http.StatusInternalServerError:
		// A request snapd dropped because it is shutting down (seen on a
		// long-poll during "systemctl restart snapd"): a read is asked
		// again (a request to act is judged above).
		if e.Message == "request canceled" {
			return Transient
		}
	}
	return Permanent
}

// isTakingTooLong matches snapctl's "<action> command is taking too long".
func isTakingTooLong(msg string) bool {
	return strings.HasSuffix(msg, " command is taking too long")
}

// Prefixes in front of snapd's own error text: the snapctl binary prints
// "error: ", the daemon prefixes snapctl errors with "error running
// snapctl: " before 2.70 and "snapctl: " from 2.70 (daemon/api_snapctl.go).
var messagePrefixes = []string{"error: ", "error running snapctl: ", "snapctl: "}

// stripPrefixes removes those prefixes, in any order and however many
// layers of them there are ("error: error running snapctl: ...").
func stripPrefixes(msg string) string {
	msg = strings.TrimSpace(msg)
	for {
		trimmed := msg
		for _, p := range messagePrefixes {
			trimmed = strings.TrimSpace(strings.TrimPrefix(trimmed, p))
		}
		if trimmed == msg {
			return msg
		}
		msg = trimmed
	}
}

// IsUnreachable reports whether err is a failure to connect to snapd at
// all (no socket, nobody listening): the request never reached snapd,
// and snapd may come back. A snapd that is not installed
// (snapd.ErrNotInstalled), a path that is not a socket and a socket this
// process may not connect to (badSocket) are not unreachable: waiting
// changes none of them.
func IsUnreachable(err error) bool {
	var connErr *snapd.ConnectionError
	return errors.As(err, &connErr) && !connErr.Connected && !connErr.Written && !errors.Is(err, snapd.ErrNotInstalled) && !badSocket(err)
}

// badSocket reports whether err is a dial that failed on the socket's
// path itself (*snapd.SocketError): it is not a socket (a directory, a
// regular file: a mistyped path), or connect(2) was refused permission
// (a user without write access to it, an AppArmor denial). No restart of
// snapd changes either, so they are Permanent and never waited for.
func badSocket(err error) bool {
	var se *snapd.SocketError
	return errors.As(err, &se)
}

// IsRetryable reports whether retrying the operation that failed with err
// can help: it is the one question to ask of any error snapsvc returns.
// The first error in err's chain with a Retryable() bool method decides
// (snapsvc's *OpError: not when a change was made or the outcome is
// unknown; *StoppedError; the budgets' errors); an error without one is
// judged by its class (Classify: conflicts, an unreachable or restarting
// snapd, an outcome to look up first). A nil error is not retryable.
//
// ShouldRetry, the rule of a retry loop, answers another question: it
// also retries a failed change, and errors that say nothing of
// themselves.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	var r interface{ Retryable() bool }
	if errors.As(err, &r) {
		return r.Retryable()
	}
	return Classify(err).Retryable()
}

// IsConflict reports whether err is a change conflict.
func IsConflict(err error) bool { return Classify(err) == Conflict }

var (
	reKindConflict = regexp.MustCompile(`^snap "([^"]+)" has "([^"]+)" change in progress$`)
	reAnyConflict  = regexp.MustCompile(`^snap "([^"]+)" has changes in progress$`)
	reExclusive    = regexp.MustCompile(`^(.+) in progress, no other changes allowed until this is done$`)
)

// exclusiveKinds maps the start of snapd's messages for changes that block
// every snap to the change kind behind them
// (overlord/snapstate/conflict.go checkChangeConflictExclusiveKinds).
var exclusiveKinds = map[string]string{
	"ubuntu-core to core transition": "transition-ubuntu-core",
	"transition to snapd snap":       "transition-to-snapd-snap",
	"remodeling":                     "remodel",
	"creating recovery system":       "create-recovery-system",
	"removing recovery system":       "remove-recovery-system",
	"snapd downgrade":                "",
}
