package snapd

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Change statuses (overlord/state/change.go).
const (
	StatusDefault = "Default"
	StatusDo      = "Do"
	StatusDoing   = "Doing"
	StatusDone    = "Done"
	StatusAbort   = "Abort"
	StatusUndo    = "Undo"
	StatusUndoing = "Undoing"
	StatusHold    = "Hold"
	StatusError   = "Error"
	StatusUndone  = "Undone"
	StatusWait    = "Wait"
)

// Change is snapd's changeInfo (daemon/api_general.go).
type Change struct {
	ID        string         `json:"id"`
	Kind      string         `json:"kind"`
	Summary   string         `json:"summary"`
	Status    string         `json:"status"`
	Tasks     []Task         `json:"tasks,omitempty"`
	Ready     bool           `json:"ready"`
	Err       string         `json:"err,omitempty"`
	SpawnTime time.Time      `json:"spawn-time"`
	ReadyTime *time.Time     `json:"ready-time,omitempty"`
	Data      map[string]any `json:"data,omitempty"`
}

// Task is snapd's taskInfo.
type Task struct {
	ID        string       `json:"id"`
	Kind      string       `json:"kind"`
	Summary   string       `json:"summary"`
	Status    string       `json:"status"`
	Log       []string     `json:"log,omitempty"`
	Progress  TaskProgress `json:"progress"`
	SpawnTime time.Time    `json:"spawn-time"`
	ReadyTime *time.Time   `json:"ready-time,omitempty"`
	Data      TaskData     `json:"data,omitempty"`
}

// TaskProgress is a task's progress.
type TaskProgress struct {
	Label string `json:"label"`
	Done  int    `json:"done"`
	Total int    `json:"total"`
}

// TaskData is the part of a task's data snapd exposes: the snaps it
// affects (present from about snapd 2.62; absent on 2.57).
type TaskData struct {
	AffectedSnaps []string `json:"affected-snaps,omitempty"`
}

// Change returns one change.
func (c *Client) Change(ctx context.Context, id string) (*Change, error) {
	path := "/v2/changes/" + url.PathEscape(id)
	rsp, err := c.do(ctx, request{method: http.MethodGet, path: path})
	if err != nil {
		return nil, err
	}
	var chg Change
	if err := decodeResult(http.MethodGet, path, rsp, &chg); err != nil {
		return nil, err
	}
	return &chg, nil
}

// Change selectors for GET /v2/changes.
const (
	SelectInProgress = "in-progress"
	SelectReady      = "ready"
	SelectAll        = "all"
)

// Changes lists changes. selector is one of the Select constants (empty:
// in-progress, snapd's default). forSnap, when set, is passed as for=,
// which matches only changes that carry snap-names: snapd's service-control
// changes made through snapctl carry none, so a caller that must see every
// change touching a snap filters the unfiltered list by task instead.
func (c *Client) Changes(ctx context.Context, selector, forSnap string) ([]Change, error) {
	q := url.Values{}
	if selector != "" {
		q.Set("select", selector)
	}
	if forSnap != "" {
		q.Set("for", forSnap)
	}
	const path = "/v2/changes"
	rsp, err := c.do(ctx, request{method: http.MethodGet, path: path, query: q, maxBody: MaxListBody})
	if err != nil {
		return nil, err
	}
	var chgs []Change
	if err := decodeResult(http.MethodGet, path, rsp, &chgs); err != nil {
		return nil, err
	}
	return chgs, nil
}

// Abort asks snapd to abort a change and returns the change as snapd
// answered it (it may still be Doing).
func (c *Client) Abort(ctx context.Context, id string) (*Change, error) {
	path := "/v2/changes/" + url.PathEscape(id)
	rsp, err := c.do(ctx, request{method: http.MethodPost, path: path, body: map[string]string{"action": "abort"}})
	if err != nil {
		return nil, err
	}
	var chg Change
	if err := decodeResult(http.MethodPost, path, rsp, &chg); err != nil {
		return nil, err
	}
	return &chg, nil
}
