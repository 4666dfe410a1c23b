package snapd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Notice is one element of GET /v2/notices (daemon/api_notices.go).
type Notice struct {
	ID            string            `json:"id"`
	UserID        *uint32           `json:"user-id"`
	Type          string            `json:"type"`
	Key           string            `json:"key"`
	FirstOccurred time.Time         `json:"first-occurred"`
	LastOccurred  time.Time         `json:"last-occurred"`
	LastRepeated  time.Time         `json:"last-repeated"`
	Occurrences   int               `json:"occurrences"`
	LastData      map[string]string `json:"last-data,omitempty"`
	RepeatAfter   string            `json:"repeat-after,omitempty"`
	ExpireAfter   string            `json:"expire-after,omitempty"`
}

// NoticeChangeUpdate is the notice type snapd records whenever a change is
// spawned or changes status (snapd >= 2.62); its key is the change id.
const NoticeChangeUpdate = "change-update"

// NoticesOptions filters GET /v2/notices.
type NoticesOptions struct {
	Types []string
	Keys  []string
	// After keeps notices whose last-repeated time is strictly after it.
	After time.Time
	// Timeout, when positive, makes snapd hold the request until a notice
	// matches or the timeout passes (then the result is empty).
	Timeout time.Duration
}

// Notices reads notices. On snapd older than 2.62 the endpoint does not
// exist and the error is a 404 *Error with message "not found"
// (daemon/daemon.go NotFoundHandler).
func (c *Client) Notices(ctx context.Context, opts NoticesOptions) ([]Notice, error) {
	q := url.Values{}
	if len(opts.Types) > 0 {
		q.Set("types", strings.Join(opts.Types, ","))
	}
	if len(opts.Keys) > 0 {
		q.Set("keys", strings.Join(opts.Keys, ","))
	}
	if !opts.After.IsZero() {
		// UTC with Z: a "+hh:mm" offset would need escaping and snapd's
		// parser is RFC3339 (fractions accepted).
		q.Set("after", opts.After.UTC().Format(time.RFC3339Nano))
	}
	if opts.Timeout > 0 {
		q.Set("timeout", opts.Timeout.String())
		// snapd answers a long-poll by its timeout at the latest; one it
		// holds longer (a snapd stopping behind a socket systemd keeps
		// open, say) is given up here rather than held forever.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, opts.Timeout+c.longPollGrace, errLongPollOverdue)
		defer cancel()
	}
	const path = "/v2/notices"
	rsp, err := c.do(ctx, request{method: http.MethodGet, path: path, query: q})
	if err != nil {
		var ce *ConnectionError
		if errors.As(err, &ce) && context.Cause(ctx) == errLongPollOverdue {
			ce.Err = fmt.Errorf("%w (timeout %s)", errLongPollOverdue, opts.Timeout)
		}
		return nil, err
	}
	var notices []Notice
	if err := decodeResult(http.MethodGet, path, rsp, &notices); err != nil {
		return nil, err
	}
	return notices, nil
}

// LongPollGrace is how much longer than its timeout a notices long-poll
// may take before the client gives up on it.
const LongPollGrace = 5 * time.Second

var errLongPollOverdue = errors.New("snapd held the notices long-poll past its timeout")

// IsNotFound reports whether err is snapd's 404 for an unknown route,
// which is how snapd older than 2.62 answers GET /v2/notices.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.StatusCode == http.StatusNotFound && e.Kind == ""
}

// SystemInfo is the part of GET /v2/system-info snapsvc reads.
type SystemInfo struct {
	Version    string          `json:"version"`
	Series     string          `json:"series"`
	OnClassic  bool            `json:"on-classic"`
	SystemMode string          `json:"system-mode,omitempty"`
	Raw        json.RawMessage `json:"-"`
}

// SystemInfo returns snapd's version and system facts.
func (c *Client) SystemInfo(ctx context.Context) (*SystemInfo, error) {
	const path = "/v2/system-info"
	rsp, err := c.do(ctx, request{method: http.MethodGet, path: path})
	if err != nil {
		return nil, err
	}
	var info SystemInfo
	if err := decodeResult(http.MethodGet, path, rsp, &info); err != nil {
		return nil, err
	}
	info.Raw = rsp.Result
	return &info, nil
}
