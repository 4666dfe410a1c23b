package snapsvc

import (
	"encoding/json"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Change is a snapd change as GET /v2/changes/{id} reports it
// (daemon/api_general.go changeInfo); its JSON form is snapd's.
type Change struct {
	// ID is snapd's change id, a decimal counter.
	ID string `json:"id"`
	// Kind is the change kind: "service-control", "configure-snap",
	// "install-snap", "auto-refresh", ...
	Kind string `json:"kind"`
	// Summary is snapd's one-line description.
	Summary string `json:"summary"`
	// Status is Do, Doing, Wait, Done, Error, Undone, Hold, Abort, Undo or
	// Undoing (the status constants of overlord/state).
	Status string `json:"status"`
	// Tasks are the change's tasks.
	Tasks []Task `json:"tasks,omitempty"`
	// Ready is true once the change will not move any more.
	Ready bool `json:"ready"`
	// Err is snapd's error text for a change that failed
	// ("cannot perform the following tasks: ...").
	Err string `json:"err,omitempty"`
	// SpawnTime is when snapd made the change.
	SpawnTime time.Time `json:"spawn-time"`
	// ReadyTime is when it became ready (nil until then).
	ReadyTime *time.Time `json:"ready-time,omitempty"`
	// Data is the change's data as snapd exposes it (e.g. "snap-names"
	// for changes made through the REST API on named snaps).
	Data map[string]any `json:"data,omitempty"`
}

// Task is one task of a Change (daemon/api_general.go taskInfo).
type Task struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Summary string `json:"summary"`
	Status  string `json:"status"`
	// Log holds at most snapd's last 10 entries, "<time> INFO|ERROR <text>".
	Log       []string     `json:"log,omitempty"`
	Progress  TaskProgress `json:"progress"`
	SpawnTime time.Time    `json:"spawn-time"`
	// ReadyTime is nil until the task is ready.
	ReadyTime *time.Time `json:"ready-time,omitempty"`
	Data      TaskData   `json:"data,omitempty"`
}

// TaskProgress is a task's progress: Done of Total, described by Label.
type TaskProgress struct {
	Label string `json:"label"`
	Done  int    `json:"done"`
	Total int    `json:"total"`
}

// TaskData is the part of a task's data snapd exposes.
type TaskData struct {
	// AffectedSnaps are the snaps the task affects (snapd >= 2.62; absent
	// on 2.57 and on snapctl's exec-command tasks).
	AffectedSnaps []string `json:"affected-snaps,omitempty"`
}

func changeOf(c *snapd.Change) *Change {
	if c == nil {
		return nil
	}
	out := &Change{ID: c.ID, Kind: c.Kind, Summary: c.Summary, Status: c.Status, Ready: c.Ready, Err: c.Err,
		SpawnTime: c.SpawnTime, ReadyTime: c.ReadyTime, Data: c.Data}
	for _, t := range c.Tasks {
		out.Tasks = append(out.Tasks, Task{ID: t.ID, Kind: t.Kind, Summary: t.Summary, Status: t.Status, Log: t.Log,
			Progress:  TaskProgress{Label: t.Progress.Label, Done: t.Progress.Done, Total: t.Progress.Total},
			SpawnTime: t.SpawnTime, ReadyTime: t.ReadyTime, Data: TaskData{AffectedSnaps: t.Data.AffectedSnaps}})
	}
	return out
}

// APIError is an error answered by snapd (daemon/errors.go). Get it from
// any error snapsvc returns with errors.As.
type APIError struct {
	// Method and Path are the request's.
	Method, Path string
	// StatusCode is the HTTP status (or the envelope's status-code).
	StatusCode int
	// Kind is snapd's error kind, often empty: a /v2/apps conflict has
	// none ("snap-not-found", "app-not-found", "snap-change-conflict",
	// "login-required", ...).
	Kind string
	// Value is the error's value as raw JSON (ValueMap decodes it).
	Value json.RawMessage
	// Message is snapd's text.
	Message string
	// Maintenance is set while snapd is about to restart.
	Maintenance *Maintenance
}

// Maintenance is the "maintenance" snapd puts on every answer while it is
// about to restart (daemon/daemon.go).
type Maintenance struct {
	// Kind is "daemon-restart" or "system-restart".
	Kind    string
	Message string
	// Value is raw JSON, e.g. {"op":"reboot"}.
	Value json.RawMessage
}

func (e *APIError) Error() string { return e.wire().Error() }

// ValueMap decodes Value as a JSON object, or returns nil.
func (e *APIError) ValueMap() map[string]any { return e.wire().ValueMap() }

// Is lets errors.Is(err, ErrNotFound) match snapd's answers that a snap,
// an app or a change does not exist.
func (e *APIError) Is(target error) bool { return e.wire().Is(target) }

// As lets the classifier (package retry) read an APIError made by hand,
// in a test say, as the wire error it mirrors.
func (e *APIError) As(target any) bool {
	if p, ok := target.(**snapd.Error); ok {
		*p = e.wire()
		return true
	}
	return false
}

func (e *APIError) wire() *snapd.Error {
	w := &snapd.Error{Method: e.Method, Path: e.Path, StatusCode: e.StatusCode, Kind: e.Kind, Value: e.Value, Message: e.Message}
	if e.Maintenance != nil {
		w.Maintenance = &snapd.Maintenance{Kind: e.Maintenance.Kind, Message: e.Maintenance.Message, Value: e.Maintenance.Value}
	}
	return w
}

// The wire client's errors answer errors.As for *APIError, so callers get
// the public type from any error snapsvc returns.
func init() {
	snapd.AsPublic = func(e *snapd.Error, target any) bool {
		p, ok := target.(**APIError)
		if !ok {
			return false
		}
		pub := &APIError{Method: e.Method, Path: e.Path, StatusCode: e.StatusCode, Kind: e.Kind, Value: e.Value, Message: e.Message}
		if e.Maintenance != nil {
			pub.Maintenance = &Maintenance{Kind: e.Maintenance.Kind, Message: e.Maintenance.Message, Value: e.Maintenance.Value}
		}
		*p = pub
		return true
	}
}
