package snapsvc

import (
	"fmt"
	"slices"
	"strings"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// request is one validated request: a service command ("start", "stop",
// "restart") or a refresh of a snap ("refresh", with refresh set:
// refresh_request.go).
type request struct {
	action  string
	enable  bool
	disable bool
	reload  bool
	refresh *refreshSpec
	t       target
}

func (o request) instruction() snapd.AppInstruction {
	return snapd.AppInstruction{Action: o.action, Names: o.t.names, Enable: o.enable, Disable: o.disable, Reload: o.reload}
}

func (o request) snapctlArgs() []string {
	args := []string{o.action}
	switch {
	case o.enable:
		args = append(args, "--enable")
	case o.disable:
		args = append(args, "--disable")
	case o.reload:
		args = append(args, "--reload")
	}
	return append(args, o.t.names...)
}

// key identifies identical requests (for coalescing).
func (o request) key() string {
	names := slices.Clone(o.t.names)
	slices.Sort(names)
	if o.refresh != nil {
		return fmt.Sprintf("%s|%s|%s", o.action, o.refresh, strings.Join(names, ","))
	}
	return fmt.Sprintf("%s|%t|%t|%t|%s", o.action, o.enable, o.disable, o.reload, strings.Join(names, ","))
}

func (c *Client) prepare(action string, names []string, set func(*request)) (request, error) {
	o := request{action: action}
	set(&o)
	t, err := parseTarget(names)
	if err != nil {
		o.t.names = names // the error names the input
		return o, c.opError(o, "", 0, err)
	}
	o.t = t
	if c.mode == ModeSnapctl && c.ownSnap != "" {
		for _, s := range t.snaps {
			if s != c.ownSnap {
				return o, c.opError(o, "", 0, fmt.Errorf("%w: %q is not a service of snap %q, the only snap snapctl controls from here", ErrWrongSnap, s, c.ownSnap))
			}
		}
	}
	return o, nil
}

func (c *Client) opError(o request, changeID string, attempts int, err error) error {
	return &OpError{Op: o.action, Snap: strings.Join(o.t.snaps, ","), Names: o.t.names, ChangeID: changeID, Attempts: attempts, Err: err}
}

func appendNew(list []string, ids ...string) []string {
	for _, id := range ids {
		if !slices.Contains(list, id) {
			list = append(list, id)
		}
	}
	return list
}

// flagsApplied reports whether svcs are enabled or disabled as o asks.
func (o request) flagsApplied(svcs []Service) bool {
	if len(svcs) == 0 {
		return false
	}
	for _, s := range svcs {
		if (o.enable && !s.Enabled) || (o.disable && s.Enabled) {
			return false
		}
	}
	return true
}

// reached reports whether svcs are in the state o asks for.
func (o request) reached(svcs []Service) bool {
	if len(svcs) == 0 {
		return false
	}
	for _, s := range svcs {
		switch {
		case o.action == "start" && (!s.Active || (o.enable && !s.Enabled)):
			return false
		case o.action == "stop" && (s.Active || (o.disable && s.Enabled)):
			return false
		}
	}
	return true
}

// queuesInHook reports whether snapd only queues service commands in the
// current hook (ctlcmd queueCommand / queueDefaultConfigureHookCommand).
func (c *Client) queuesInHook() bool {
	return c.mode == ModeSnapctl && (c.hook == "configure" || c.hook == "default-configure")
}
