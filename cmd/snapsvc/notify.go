package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// observe is the library's observer (snapsvc.WithObserver): it says on
// stderr, as it happens, that snapd cannot be reached (which socket, why,
// until when the operation keeps trying) and when it answers again,
// whatever stderr is: a command that printed nothing until it gave up
// would look hung.
func (a *app) observe(ev snapsvc.Event) {
	who := ev.Op
	if ev.Op == "read" {
		// A read the command makes (services, changes, watch, follow).
		who = "snapsvc " + a.name
	}
	if len(ev.Names) > 0 {
		who += " " + strings.Join(ev.Names, " ")
	}
	switch ev.Kind {
	case snapsvc.EventUnreachable:
		if a.waitSnapd == 0 {
			return // no retrying: the error says it all, once
		}
		a.note("%s: cannot reach snapd at %s: %s; %s", who, a.eventSocket(ev), connectionCause(ev.Err), retryingUntil(ev.GiveUpAt))
	case snapsvc.EventConflict:
		if len(ev.Blockers) > 0 {
			a.prog.blocked(ev.Blockers[0])
		}
	case snapsvc.EventAccepted:
		if ev.ChangeID != "" {
			a.prog.waitFor(ev.ChangeID, "service-control")
		}
	case snapsvc.EventReachable:
		a.note("%s: snapd answers again at %s", who, a.eventSocket(ev))
	}
}

// note prints one line on stderr, above the progress line if one is
// drawn; with -v's JSON log, a record of the log instead, so that stderr
// stays JSON Lines.
func (a *app) note(format string, args ...any) {
	if a.verbose && a.logFormat == "json" {
		a.logger().Info(fmt.Sprintf(format, args...))
		return
	}
	if a.prog == nil {
		fmt.Fprintf(a.stderr, format+"\n", args...)
		return
	}
	a.prog.println(fmt.Sprintf(format, args...))
}

// eventSocket is the socket an event names, else the one the command uses.
func (a *app) eventSocket(ev snapsvc.Event) string {
	if ev.Socket != "" {
		return ev.Socket
	}
	return a.socketPath()
}

// connectionCause is what made a connection fail, without the request's
// description the ConnectionError wraps around it.
func connectionCause(err error) string {
	var ce *snapsvc.ConnectionError
	if errors.As(err, &ce) && ce.Err != nil && retry.IsUnreachable(err) {
		return dialReason(ce)
	}
	return err.Error()
}

// retryingUntil says until when an operation keeps trying.
func retryingUntil(at time.Time) string {
	if at.IsZero() {
		return "retrying until interrupted"
	}
	left := time.Until(at).Round(100 * time.Millisecond)
	return fmt.Sprintf("retrying until %s (in %v; see --wait-snapd)", at.Local().Format("15:04:05"), left)
}
