package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// TestVerdicts is the exit-code table: every class of error the CLI meets
// (retry.Classify's four classes, each of snapsvc's error values and
// types, budget errors, context errors), bare and inside an *OpError, to
// its exit code and --json's retryable. It checks that the two agree
// (retryable exactly for exit 3; 130 tells either way), that they agree
// with the library's own verdict (OpError.Retryable of the same cause),
// and that a request that acted, or may have, is never retryable.
func TestVerdicts(t *testing.T) {
	conflict := &retry.ConflictError{Snap: "k8s", ChangeKind: "configure-snap", Message: `snap "k8s" has "configure-snap" change in progress`}
	unreachableGET := &snapsvc.ConnectionError{Socket: "/run/snapd.socket", Method: "GET", Path: "/v2/apps", Err: errors.New("socket /run/snapd.socket does not exist")}
	unreachablePOST := &snapsvc.ConnectionError{Socket: "/run/snapd.socket", Method: "POST", Path: "/v2/apps", Err: errors.New("socket /run/snapd.socket does not exist")}
	lostPOST := &snapsvc.ConnectionError{Method: "POST", Path: "/v2/apps", Connected: true, Written: true, Err: errors.New("EOF")}
	garbledGET := &snapsvc.ResponseError{Method: "GET", Path: "/v2/apps", StatusCode: 200, Err: errors.New("not JSON")}
	garbledPOST := &snapsvc.ResponseError{Method: "POST", Path: "/v2/apps", StatusCode: 202, Err: errors.New("not JSON")}
	notInstalled := &snapsvc.NotInstalledError{Socket: "/run/snapd.socket", Reason: "neither snapd's daemon nor its socket unit exists", Err: errors.New("dial unix /run/snapd.socket: connect: no such file or directory")}
	notInstalledGET := &snapsvc.ConnectionError{Socket: "/run/snapd.socket", Method: "GET", Path: "/v2/apps", Err: notInstalled}
	notInstalledPOST := &snapsvc.ConnectionError{Socket: "/run/snapd.socket", Method: "POST", Path: "/v2/apps", Err: notInstalled}
	timedOut := fmt.Errorf("timed out after 1s (--timeout): %w", context.DeadlineExceeded)
	budget := func(cause error) error { return &snapsvc.BudgetError{Key: "k8s.kubelet", Err: cause} }
	notReady := &probe.NotReadyError{Probe: "http://localhost:10248/healthz", Threshold: 1, Cause: errors.New("max wait")}
	op := func(change string, err error) error {
		return &snapsvc.OpError{Op: "restart", Snap: "k8s", Names: []string{"k8s.kubelet"}, ChangeID: change, Attempts: 1, Err: err}
	}
	for _, tc := range []struct {
		name      string
		err       error
		code      int
		retryable bool
	}{
		{"success", nil, exitOK, false},

		// The command line and the names: nothing is sent.
		{"usage", usagef("bad"), exitUsage, false},
		{"invalid name", op("", fmt.Errorf("%w %q", snapsvc.ErrInvalidName, "K8S")), exitUsage, false},
		{"no names", op("", snapsvc.ErrNoNames), exitUsage, false},
		{"wrong snap (snapctl mode)", op("", fmt.Errorf("%w: other", snapsvc.ErrWrongSnap)), exitUsage, false},

		// snapsvc.ErrNotFound: snapd's 404s.
		{"unknown service", op("", &snapsvc.APIError{StatusCode: 404, Kind: "app-not-found", Message: `snap "k8s" has no service "x"`}), exitNotFound, false},
		{"unknown snap (read)", fmt.Errorf("reading services: %w", &snapsvc.APIError{StatusCode: 404, Kind: "snap-not-found", Message: `snap "x" not found`}), exitNotFound, false},
		{"unknown change", fmt.Errorf("reading change 9: %w", &snapsvc.APIError{StatusCode: 404, Message: `cannot find change with id "9"`}), exitNotFound, false},

		// *snapsvc.ChangeError: the change ran and did not succeed.
		{"change failed", op("2", &snapsvc.ChangeError{ID: "2", Kind: "service-control", Status: "Error", Err: "boom"}), exitFailed, false},
		{"change undone", op("2", &snapsvc.ChangeError{ID: "2", Kind: "service-control", Status: "Undone"}), exitFailed, false},
		{"wait on a failed change", fmt.Errorf("waiting for change 2: %w", &snapsvc.ChangeError{ID: "2", Status: "Error"}), exitFailed, false},

		// retry.Permanent.
		{"snapd refused", op("", &snapsvc.APIError{StatusCode: 400, Message: "cannot perform operation on services"}), exitFailed, false},
		{"snapd forbids", &snapsvc.APIError{StatusCode: 403, Kind: "login-required", Message: "access denied"}, exitFailed, false},
		{"snapctl failed", op("", &snapsvc.SnapctlError{ExitCode: 1}), exitFailed, false},
		{"plain failure", errors.New("boom"), exitFailed, false},

		// snapsvc.ErrSnapdNotInstalled: retry.Permanent, though it is a
		// failed connection.
		{"snapd not installed (read)", fmt.Errorf("reading services: %w", notInstalledGET), exitFailed, false},
		{"snapd not installed (act)", op("", notInstalledPOST), exitFailed, false},
		{"snapd not installed (bare)", notInstalled, exitFailed, false},

		// retry.Conflict.
		{"conflict (bare)", conflict, exitTimeout, true},
		{"gave up on a conflict", op("", fmt.Errorf("gave up after 5m: %w", errors.Join(snapsvc.ErrGaveUp, conflict))), exitTimeout, true},
		{"timed out in a conflict", op("", errors.Join(timedOut, conflict)), exitTimeout, true},

		// retry.Transient.
		{"read: snapd unreachable", fmt.Errorf("reading services: %w", unreachableGET), exitTimeout, true},
		{"read: snapd restarting", &snapsvc.APIError{StatusCode: 503, Kind: "daemon-restart", Message: "daemon is restarting"}, exitTimeout, true},
		{"read: garbled answer", garbledGET, exitTimeout, true},
		{"gave up on an absent snapd", op("", fmt.Errorf("gave up: %w", errors.Join(snapsvc.ErrGaveUp, unreachablePOST))), exitTimeout, true},

		// retry.Indeterminate, snapsvc.ErrOutcomeUnknown: snapd may have acted.
		{"answer lost", lostPOST, exitUnknown, false},
		{"garbled answer to act", op("", garbledPOST), exitUnknown, false},
		{"snapctl taking too long", op("", &snapsvc.APIError{StatusCode: 400, Message: "restart command is taking too long"}), exitUnknown, false},
		{"outcome unknown", op("", errors.Join(snapsvc.ErrOutcomeUnknown, lostPOST)), exitUnknown, false},
		{"timed out waiting for its own change", op("2", fmt.Errorf("waiting for change 2: %w", timedOut)), exitUnknown, false},
		{"snapd gone while waiting for its own change", op("2", errors.Join(snapsvc.ErrGaveUp, unreachableGET)), exitUnknown, false},

		// Context errors.
		{"timed out before any request", op("", timedOut), exitTimeout, true},
		{"wait timed out", fmt.Errorf("waiting for change 1: %w", timedOut), exitTimeout, true},
		{"read timed out", &snapsvc.ConnectionError{Socket: "/run/snapd.socket", Method: "GET", Path: "/v2/changes/1", Connected: true, Written: true, Err: timedOut}, exitTimeout, true},
		{"--timeout (bare)", timeoutError{time.Second}, exitTimeout, true},
		{"interrupted in a conflict", op("", errors.Join(context.Canceled, conflict)), exitInterrupted, true},
		{"interrupted after its change was made", op("2", fmt.Errorf("waiting for change 2: %w", context.Canceled)), exitInterrupted, false},
		{"interrupted read", &snapsvc.ConnectionError{Method: "GET", Path: "/v2/changes", Err: context.Canceled}, exitInterrupted, true},
		{"interrupted wait", &interruptedError{change: "2", err: context.Canceled}, exitInterrupted, true},

		// Restart budgets (*snapsvc.BudgetError): its Retryable decides.
		{"budget unavailable", op("", budget(snapsvc.ErrBudgetUnavailable)), exitTimeout, true},
		{"no budget slot in time", op("", budget(snapsvc.ErrBudgetWait)), exitTimeout, true},
		{"budget paused", op("", budget(snapsvc.ErrBudgetPaused)), exitTimeout, true},
		{"budget unavailable (bare)", budget(snapsvc.ErrBudgetUnavailable), exitTimeout, true},
		{"budget refused", op("", budget(snapsvc.ErrBudgetRefused)), exitFailed, false},
		{"slot lost before acting", op("", budget(snapsvc.ErrSlotLost)), exitFailed, false},
		{"slot lost after acting", op("2", budget(snapsvc.ErrSlotLost)), exitUnknown, false},
		{"not ready after acting", op("2", budget(notReady)), exitFailed, false},
		{"budget wait interrupted", op("", budget(context.Canceled)), exitInterrupted, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(tc.err)
			if v.code != tc.code || v.retryable != tc.retryable {
				t.Fatalf("judge(%v) = exit %d retryable %t, want exit %d retryable %t", tc.err, v.code, v.retryable, tc.code, tc.retryable)
			}
			if v.code != exitInterrupted && v.retryable != (v.code == exitTimeout) {
				t.Errorf("exit %d with retryable %t: they disagree", v.code, v.retryable)
			}
			if tc.code == exitOK {
				return
			}
			// The library's verdict on the same cause: OpError.Retryable.
			// Where the CLI says snapd acted or may have (exit 5) it is
			// never retryable, whatever the cause.
			var oe *snapsvc.OpError
			if !errors.As(tc.err, &oe) {
				oe = &snapsvc.OpError{Op: "restart", Names: []string{"k8s.kubelet"}, Err: tc.err}
			}
			if lib := oe.Retryable(); v.code != exitUnknown && v.retryable != lib {
				t.Errorf("the CLI says retryable %t (exit %d), the library %t", v.retryable, v.code, lib)
			}
			// --json: the error once, on stdout; nothing on stderr.
			var stdout, stderr lockedBuffer
			a := &app{env: env{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}, json: true}
			a.name = "restart"
			if got := a.report(tc.err); got != tc.code {
				t.Errorf("report returned %d, want %d", got, tc.code)
			}
			doc := decodeError(t, tc.code, stdout.String())
			if *doc.Error.Retryable != tc.retryable {
				t.Errorf("JSON retryable %t, want %t", *doc.Error.Retryable, tc.retryable)
			}
			if stderr.String() != "" {
				t.Errorf("--json: stderr %q, want nothing (the error is stdout's document)", stderr.String())
			}
			// Without: stderr has one "error: ", and, exactly when
			// trying again may help (exit 3), a line saying so in words
			// (no "[retryable]" marker); no "not retryable" (the exit
			// code says it), no library or snapd prefix; stdout nothing.
			stdout, stderr = lockedBuffer{}, lockedBuffer{}
			a = &app{env: env{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}}
			a.name = "restart"
			if got := a.report(tc.err); got != tc.code || stdout.String() != "" {
				t.Errorf("report returned %d, stdout %q; want %d and nothing", got, stdout.String(), tc.code)
			}
			errOut := stderr.String()
			if n := strings.Count(errOut, "error: "); n != 1 || !strings.HasPrefix(errOut, "error: ") {
				t.Errorf("%d \"error: \" on stderr, want one, first:\n%s", n, errOut)
			}
			if said := regexp.MustCompile(`(?m)^Trying again (later|once change \d+ is done) may help`).MatchString(errOut); said != (tc.code == exitTimeout) {
				t.Errorf("stderr says trying again may help %t, want %t:\n%s", said, tc.code == exitTimeout, errOut)
			}
			for _, bad := range []string{"retryable", "snapsvc: ", "error: snapd: ", ": snapd: "} {
				if strings.Contains(errOut, bad) {
					t.Errorf("stderr says %q:\n%s", bad, errOut)
				}
			}
		})
	}
}

// TestSnapdNotInstalled runs a command where nothing would create snapd's
// socket: exit 1 at once, not retryable, on stderr and in --json (it
// exited 3, "[retryable]", while the library said the opposite).
func TestSnapdNotInstalled(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	root := t.TempDir() // no snapd, no systemd under it
	sock := filepath.Join(root, "run", "snapd.socket")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"services"}, {"restart", "k8s.kubelet"}, {"changes"}} {
		var stdout, stderr lockedBuffer
		code := run(safetyNet(t), append([]string{"--json"}, args...), env{stdout: &stdout, stderr: &stderr, getenv: socketEnv(sock), snapdRoot: root})
		if code != exitFailed {
			t.Errorf("%q without snapd: exit %d, want 1\n%s", args, code, stderr.String())
		}
		doc := decodeError(t, code, stdout.String())
		if *doc.Error.Retryable || !strings.Contains(doc.Error.Message, "snapd is not installed here") {
			t.Errorf("%q without snapd: retryable %t; %s", args, *doc.Error.Retryable, stdout.String())
		}
		stdout, stderr = lockedBuffer{}, lockedBuffer{}
		run(safetyNet(t), args, env{stdout: &stdout, stderr: &stderr, getenv: socketEnv(sock), snapdRoot: root})
		if errOut := stderr.String(); strings.Contains(errOut, "Trying again") || !strings.Contains(errOut, "snapd is not installed here") {
			t.Errorf("%q without snapd: stderr:\n%s", args, errOut)
		}
	}
}
