package snapsvcprom_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/snapsvcprom"
)

// TestOutcome checks the outcome label of each kind of end.
func TestOutcome(t *testing.T) {
	op := func(err error) error {
		return &snapsvc.OpError{Op: "restart", Names: []string{"k8s.kubelet"}, Err: err}
	}
	for want, ev := range map[string]snapsvc.Event{
		"done":            {Kind: snapsvc.EventDone},
		"change-failed":   {Kind: snapsvc.EventFailed, Err: op(&snapsvc.ChangeError{ID: "2", Status: "Error"})},
		"not-found":       {Kind: snapsvc.EventFailed, Err: op(fmt.Errorf("x: %w", snapsvc.ErrNotFound))},
		"invalid":         {Kind: snapsvc.EventFailed, Err: op(fmt.Errorf("%w %q", snapsvc.ErrInvalidName, "K8S"))},
		"gave-up":         {Kind: snapsvc.EventFailed, Err: op(errors.Join(snapsvc.ErrGaveUp, errors.New("conflict")))},
		"outcome-unknown": {Kind: snapsvc.EventFailed, Err: op(snapsvc.ErrOutcomeUnknown)},
		"canceled":        {Kind: snapsvc.EventFailed, Err: op(context.Canceled)},
		"error":           {Kind: snapsvc.EventFailed, Err: op(errors.New("boom"))},
	} {
		if got := snapsvcprom.Outcome(ev); got != want {
			t.Errorf("Outcome(%v) = %s, want %s", ev.Err, got, want)
		}
	}
}
