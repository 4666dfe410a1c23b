package snapd

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Envelope types (daemon/response.go: ResponseTypeSync/Async/Error).
const (
	TypeSync  = "sync"
	TypeAsync = "async"
	TypeError = "error"
)

// Error kinds the client acts on (client/errors.go in snapd).
const (
	KindLoginRequired      = "login-required"
	KindSnapNotFound       = "snap-not-found"
	KindAppNotFound        = "app-not-found"
	KindSnapChangeConflict = "snap-change-conflict"
	KindQuotaConflict      = "quota-change-conflict"
	KindUnsuccessful       = "unsuccessful"
	KindDaemonRestart      = "daemon-restart"
	KindSystemRestart      = "system-restart"
)

// Response is snapd's envelope (daemon/response.go respJSON).
type Response struct {
	Type        string          `json:"type"`
	StatusCode  int             `json:"status-code"`
	Status      string          `json:"status"`
	Result      json.RawMessage `json:"result"`
	Change      string          `json:"change,omitempty"`
	Maintenance *Maintenance    `json:"maintenance,omitempty"`
	// WarningCount is only present on non-error responses.
	WarningCount int `json:"warning-count,omitempty"`

	// HTTPStatus is the HTTP status line's code (not part of the body).
	HTTPStatus int `json:"-"`
}

// Maintenance is set on every response while snapd is about to restart
// (daemon/daemon.go: maintenanceForRestartType). Kind is daemon-restart or
// system-restart.
type Maintenance struct {
	Kind    string          `json:"kind"`
	Message string          `json:"message"`
	Value   json.RawMessage `json:"value,omitempty"`
}

// errorResult is the result of a "type":"error" envelope
// (daemon/errors.go: errorResult; kind and value are omitted when empty).
type errorResult struct {
	Message string          `json:"message"`
	Kind    string          `json:"kind,omitempty"`
	Value   json.RawMessage `json:"value,omitempty"`
}

// Error is an error answered by snapd: the HTTP status and snapd's kind,
// value and message. Kind is empty for many errors, including the change
// conflict that POST /v2/apps answers (HTTP 400 with no kind; see
// daemon/api_apps.go postApps).
type Error struct {
	Method, Path string
	StatusCode   int
	Kind         string
	Value        json.RawMessage
	Message      string
	Maintenance  *Maintenance
}

func (e *Error) Error() string {
	msg := e.Message
	if msg == "" {
		msg = fmt.Sprintf("server error: %q", http.StatusText(e.StatusCode))
	}
	if e.Kind != "" {
		return fmt.Sprintf("snapd: %s (%s %s: HTTP %d, kind %s)", msg, e.Method, e.Path, e.StatusCode, e.Kind)
	}
	return fmt.Sprintf("snapd: %s (%s %s: HTTP %d)", msg, e.Method, e.Path, e.StatusCode)
}

// ValueMap decodes Value as a JSON object, or returns nil.
func (e *Error) ValueMap() map[string]any {
	var m map[string]any
	if len(e.Value) == 0 || json.Unmarshal(e.Value, &m) != nil {
		return nil
	}
	return m
}

func (r *Response) asError(method, path string) error {
	var res errorResult
	if len(r.Result) > 0 && string(r.Result) != "null" {
		if err := json.Unmarshal(r.Result, &res); err != nil {
			return &ResponseError{Method: method, Path: path, StatusCode: r.HTTPStatus, Err: fmt.Errorf("error result: %w", err)}
		}
	}
	code := r.StatusCode
	if code == 0 {
		code = r.HTTPStatus
	}
	return &Error{
		Method:      method,
		Path:        path,
		StatusCode:  code,
		Kind:        res.Kind,
		Value:       res.Value,
		Message:     res.Message,
		Maintenance: r.Maintenance,
	}
}

// AsPublic, when set, lets errors.As turn an *Error into the public type
// that mirrors it (snapsvc.APIError); package snapsvc sets it. It reports
// whether target was such a type and filled in.
var AsPublic func(e *Error, target any) bool

// As implements errors.As for the public mirror of Error.
func (e *Error) As(target any) bool { return AsPublic != nil && AsPublic(e, target) }

// ErrNotFound matches (with errors.Is) snapd's answers that a snap, an app
// or a change does not exist.
var ErrNotFound = errors.New("not found")

// Is lets errors.Is(err, ErrNotFound) match snapd's 404 answers for a
// missing snap, app or change (but not an unknown route).
func (e *Error) Is(target error) bool {
	if target != ErrNotFound {
		return false
	}
	return e.Kind == KindSnapNotFound || e.Kind == KindAppNotFound ||
		(e.StatusCode == http.StatusNotFound && e.Message != "not found")
}
