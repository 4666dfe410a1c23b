package snapd

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// AppInfo is one element of GET /v2/apps (client/apps.go AppInfo). Enabled
// and Active are omitted by snapd when false.
type AppInfo struct {
	Snap        string `json:"snap,omitempty"`
	Name        string `json:"name"`
	Daemon      string `json:"daemon,omitempty"`
	DaemonScope string `json:"daemon-scope,omitempty"`
	Enabled     bool   `json:"enabled,omitempty"`
	Active      bool   `json:"active,omitempty"`
}

// IsService reports whether the app is a daemon.
func (a AppInfo) IsService() bool { return a.Daemon != "" }

// Apps lists apps (or only services) of the named snaps or snap.app names;
// no names means every snap.
func (c *Client) Apps(ctx context.Context, names []string, servicesOnly bool) ([]AppInfo, error) {
	q := url.Values{}
	if len(names) > 0 {
		q.Set("names", strings.Join(names, ","))
	}
	if servicesOnly {
		q.Set("select", "service")
	}
	const path = "/v2/apps"
	rsp, err := c.do(ctx, request{method: http.MethodGet, path: path, query: q})
	if err != nil {
		return nil, err
	}
	var apps []AppInfo
	if err := decodeResult(http.MethodGet, path, rsp, &apps); err != nil {
		return nil, err
	}
	return apps, nil
}

// Actions accepted by POST /v2/apps.
const (
	ActionStart   = "start"
	ActionStop    = "stop"
	ActionRestart = "restart"
)

// AppInstruction is the body of POST /v2/apps (client/apps.go
// appInstruction; the daemon decodes it into servicestate.Instruction).
type AppInstruction struct {
	Action  string   `json:"action"`
	Names   []string `json:"names"`
	Enable  bool     `json:"enable,omitempty"`
	Disable bool     `json:"disable,omitempty"`
	Reload  bool     `json:"reload,omitempty"`
}

// ErrNoChange is returned when snapd accepted a request that should have
// created a change but named none.
var ErrNoChange = errors.New("snapd answered without a change id")

// PostApps asks snapd to start, stop or restart services and returns the
// id of the change it created.
func (c *Client) PostApps(ctx context.Context, inst AppInstruction) (string, error) {
	const path = "/v2/apps"
	rsp, err := c.do(ctx, request{method: http.MethodPost, path: path, body: inst})
	if err != nil {
		return "", err
	}
	if rsp.Type != TypeAsync || rsp.Change == "" {
		return "", &ResponseError{Method: http.MethodPost, Path: path, StatusCode: rsp.HTTPStatus, Err: ErrNoChange}
	}
	return rsp.Change, nil
}
