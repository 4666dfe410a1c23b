package snapsvc

import (
	"context"
	"fmt"
	"strings"
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
	if err := validateNames(names); err != nil {
		return nil, err
	}
	var svcs []Service
	err := c.callOf(ctx, callRead, "read", names, func(k *call) (err error) {
		svcs, err = k.services(names)
		return err
	})
	return svcs, err
}

// services is Services on call k.
func (k *call) services(names []string) ([]Service, error) {
	c := k.c
	if c.mode == ModeSnapctl && c.main == c.ctl {
		// GET /v2/apps is served on the main socket only
		// (daemon/api_apps.go openAccess); a snap asks snapctl.
		return k.snapctlServices(names)
	}
	apps, err := k.readApps(names, true)
	if err != nil {
		return nil, fmt.Errorf("snapsvc: reading %s: %w", strings.Join(append([]string{"services"}, names...), " "), err)
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

// snapctlServices reads service state with "snapctl services", whose
// table (overlord/hookstate/ctlcmd/services.go) has the columns Service,
// Startup, Current and Notes. It does not say the daemon type, so Daemon
// is "" in what it returns.
func (k *call) snapctlServices(names []string) ([]Service, error) {
	args := append([]string{"services"}, names...)
	out, err := k.readSnapctl(args)
	if err != nil {
		return nil, fmt.Errorf("snapsvc: reading %s with snapctl: %w", strings.Join(append([]string{"services"}, names...), " "), err)
	}
	return parseServicesTable(out.Stdout)
}

func parseServicesTable(table string) ([]Service, error) {
	var svcs []Service
	for i, line := range strings.Split(strings.TrimRight(table, "\n"), "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) == 0 {
			continue // header
		}
		if len(f) < 3 {
			return nil, fmt.Errorf("snapsvc: cannot parse snapctl services line %q", line)
		}
		snap, app, ok := strings.Cut(f[0], ".")
		if !ok {
			return nil, fmt.Errorf("snapsvc: cannot parse snapctl services line %q", line)
		}
		svcs = append(svcs, Service{Snap: snap, Name: app, Enabled: f[1] == "enabled", Active: f[2] == "active"})
	}
	return svcs, nil
}
