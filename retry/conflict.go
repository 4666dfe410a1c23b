package retry

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// ConflictError says that snapd refused an operation because another
// change is in progress on the snap (or, for the exclusive kinds such as a
// remodel, on the whole system). It is retryable.
type ConflictError struct {
	// Snap is the snap the blocking change touches; empty when AllSnaps.
	Snap string
	// ChangeKind is the blocking change's kind (e.g. "service-control",
	// "configure-snap", "auto-refresh"), when snapd named it.
	ChangeKind string
	// ChangeID is the blocking change's id. snapd never reports it; snapsvc
	// fills it in when it can find the change.
	ChangeID string
	// AllSnaps is true for changes that block every snap.
	AllSnaps bool
	// Message is snapd's text without prefixes.
	Message string
	// Err is the error snapd's answer was decoded into.
	Err error
}

func (e *ConflictError) Error() string {
	var what string
	switch {
	case e.AllSnaps:
		what = "every snap is blocked: " + e.Message
	case e.ChangeKind != "":
		what = fmt.Sprintf("snap %q has a %q change in progress", e.Snap, e.ChangeKind)
	default:
		what = fmt.Sprintf("snap %q has changes in progress", e.Snap)
	}
	if e.ChangeID != "" {
		what += fmt.Sprintf(" (change %s)", e.ChangeID)
	}
	return "change conflict: " + what
}

// Unwrap returns the underlying error.
func (e *ConflictError) Unwrap() error { return e.Err }

// ParseConflict recognises snapd's conflict messages, with or without the
// prefixes snapctl adds ("error: ", "error running snapctl: ",
// "snapctl: "). It returns nil for any other text.
func ParseConflict(message string) *ConflictError {
	msg := stripPrefixes(message)
	if m := reKindConflict.FindStringSubmatch(msg); m != nil {
		return &ConflictError{Snap: m[1], ChangeKind: m[2], Message: msg}
	}
	if m := reAnyConflict.FindStringSubmatch(msg); m != nil {
		return &ConflictError{Snap: m[1], Message: msg}
	}
	if m := reExclusive.FindStringSubmatch(msg); m != nil {
		if kind, ok := exclusiveKinds[m[1]]; ok {
			return &ConflictError{AllSnaps: true, ChangeKind: kind, Message: msg}
		}
	}
	return nil
}

// AsConflict returns err as a *ConflictError: either one already in err's
// chain, or one built from a snapd error that is a conflict (by kind and
// value, or by message), or from a plain error with snapctl's text.
func AsConflict(err error) (*ConflictError, bool) {
	if err == nil {
		return nil, false
	}
	var ce *ConflictError
	if errors.As(err, &ce) {
		return ce, true
	}
	var apiErr *snapd.Error
	if errors.As(err, &apiErr) {
		if apiErr.Kind == snapd.KindSnapChangeConflict || apiErr.Kind == snapd.KindQuotaConflict {
			// daemon/errors.go SnapChangeConflict: value carries
			// "snap-name" and "change-kind" when known.
			var v struct {
				Snap string `json:"snap-name"`
				Kind string `json:"change-kind"`
			}
			if len(apiErr.Value) > 0 {
				_ = json.Unmarshal(apiErr.Value, &v)
			}
			ce := ParseConflict(apiErr.Message)
			if ce == nil {
				ce = &ConflictError{Message: stripPrefixes(apiErr.Message)}
			}
			if v.Snap != "" {
				ce.Snap = v.Snap
			}
			if v.Kind != "" {
				ce.ChangeKind = v.Kind
			}
			ce.Err = err
			return ce, true
		}
		if apiErr.StatusCode != http.StatusBadRequest && apiErr.StatusCode != http.StatusConflict {
			return nil, false
		}
		if ce := ParseConflict(apiErr.Message); ce != nil {
			ce.Err = err
			return ce, true
		}
		return nil, false
	}
	var connErr *snapd.ConnectionError
	if errors.As(err, &connErr) {
		return nil, false
	}
	if ce := ParseConflict(err.Error()); ce != nil {
		ce.Err = err
		return ce, true
	}
	return nil, false
}
