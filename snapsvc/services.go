package snapsvc

import (
	"context"
	"fmt"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// Service is the state of one snap service as snapd reports it.
type Service struct {
	Snap        string `json:"snap"`
	Name        string `json:"name"`
	Daemon      string `json:"daemon"`
	DaemonScope string `json:"daemon-scope,omitempty"`
	Enabled     bool   `json:"enabled"`
	Active      bool   `json:"active"`
}

// FullName returns "snap.app".
func (s Service) FullName() string { return s.Snap + "." + s.Name }

// Services returns the state of the named services, or of every service of
// the named snaps, or of every service on the system when no name is
// given. Unknown snaps and services fail with an error matching
// ErrNotFound.
func (c *Client) Services(ctx context.Context, names ...string) ([]Service, error) {
	for _, n := range names {
		if _, _, err := ValidateName(n); err != nil {
			return nil, err
		}
	}
	apps, err := c.main.Apps(ctx, names, true)
	if err != nil {
		return nil, fmt.Errorf("snapsvc: reading services %v: %w", names, err)
	}
	out := make([]Service, 0, len(apps))
	for _, a := range apps {
		if !a.IsService() {
			continue
		}
		out = append(out, Service{Snap: a.Snap, Name: a.Name, Daemon: a.Daemon, DaemonScope: a.DaemonScope, Enabled: a.Enabled, Active: a.Active})
	}
	return out, nil
}

// ChangesOptions select changes for Changes.
type ChangesOptions struct {
	// Select is "in-progress" (default), "ready" or "all".
	Select string
	// Snap keeps only changes that touch the snap, found by their tasks
	// (snapd's own for= filter misses changes made through snapctl).
	Snap string
}

// Changes lists snapd's changes.
func (c *Client) Changes(ctx context.Context, opts ChangesOptions) ([]Change, error) {
	sel := opts.Select
	if sel == "" {
		sel = snapd.SelectInProgress
	}
	chgs, err := c.main.Changes(ctx, sel, "")
	if err != nil {
		return nil, fmt.Errorf("snapsvc: listing changes: %w", err)
	}
	if opts.Snap == "" {
		return chgs, nil
	}
	out := chgs[:0]
	re := summaryPattern(opts.Snap)
	for i := range chgs {
		if touches(&chgs[i], opts.Snap, re) {
			out = append(out, chgs[i])
		}
	}
	return out, nil
}
