package snapservices

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// Errors for extra arguments, returned before any request. They come
// wrapped in a *snapsvc.OpError that names the action and services.
var (
	// ErrUnknownFlag: an extra argument the snap command does not accept
	// for the action ("--force", "--enable" on stop, a positional
	// argument).
	ErrUnknownFlag = errors.New("unknown flag")
	// ErrUnsupportedFlag: a flag the snap command accepts but this package
	// cannot honour: the scope flags (--system, --user, --users; snapsvc
	// acts on system services), or --no-wait in snapctl mode.
	ErrUnsupportedFlag = errors.New("unsupported flag")
)

// Control is the service part of k8sd's snap.Snap interface. *Snap
// implements it against snapd, snapservicestest.Recorder in memory.
type Control interface {
	// StartServices starts services (bare names), like "snap start".
	StartServices(ctx context.Context, services []string, extraSnapArgs ...string) error
	// StopServices stops services, like "snap stop".
	StopServices(ctx context.Context, services []string, extraSnapArgs ...string) error
	// RestartServices restarts services, like "snap restart".
	RestartServices(ctx context.Context, services []string, extraSnapArgs ...string) error
}

// Request is one call of StartServices, StopServices or RestartServices,
// checked and translated.
type Request struct {
	// Action is "start", "stop" or "restart".
	Action string
	// Names are the services as snapd names them ("k8s.kubelet"), in the
	// order given.
	Names []string
	// Enable (start), Disable (stop) and Reload (restart) are the flags
	// of the same names.
	Enable, Disable, Reload bool
	// NoWait is --no-wait: return once snapd has accepted the change.
	NoWait bool
	// Args are the flags in the order given, duplicates kept: with Names,
	// the command line Command returns.
	Args []string
}

// Command returns the snap command line the request stands for, as k8sd
// builds it: "snap", the action, the names, then the flags
// (["snap" "start" "k8s.kubelet" "--enable"]). It is CommandFor(ModeREST).
func (r Request) Command() []string { return r.CommandFor(snapsvc.ModeREST) }

// CommandFor returns the command line the request stands for in a mode,
// in the form callers of that command write it:
//
//   - snapsvc.ModeREST (and ModeAuto): the snap command as k8sd builds
//     it, names then flags: "snap start k8s.kubelet --enable";
//   - snapsvc.ModeSnapctl: snapctl as microceph, microovn and
//     microk8s-cluster-agent write it, "--reload" before the names and
//     "--enable"/"--disable" after them: "snapctl restart --reload
//     microceph.rgw", "snapctl start microceph.rgw --enable" ("--no-wait"
//     is not a snapctl flag, and a handle refuses it in snapctl mode).
//
// snap and snapctl accept their flags on either side of the names; the
// order only matters to tests that compare command lines.
func (r Request) CommandFor(mode snapsvc.Mode) []string {
	if mode != snapsvc.ModeSnapctl {
		cmd := make([]string, 0, 2+len(r.Names)+len(r.Args))
		cmd = append(cmd, "snap", r.Action)
		cmd = append(cmd, r.Names...)
		return append(cmd, r.Args...)
	}
	cmd := make([]string, 0, 2+len(r.Names)+len(r.Args))
	cmd = append(cmd, "snapctl", r.Action)
	for _, a := range r.Args {
		if a == "--reload" {
			cmd = append(cmd, a)
		}
	}
	cmd = append(cmd, r.Names...)
	for _, a := range r.Args {
		if a != "--reload" {
			cmd = append(cmd, a)
		}
	}
	return cmd
}

// ServicesCommand returns the command line that reads the state of names
// (as snapd names them) in a mode: "snap services k8s.kubelet" or
// "snapctl services microceph.rgw".
func ServicesCommand(mode snapsvc.Mode, names []string) []string {
	prog := "snap"
	if mode == snapsvc.ModeSnapctl {
		prog = "snapctl"
	}
	return append([]string{prog, "services"}, names...)
}

// ImplyFlags returns extraSnapArgs with the flag k8sd's implementation
// always adds in front: "--enable" for "start", "--disable" for "stop";
// restart gets none. A Snap does this unless built WithPlainFlags.
func ImplyFlags(action string, extraSnapArgs []string) []string {
	var implied string
	switch action {
	case "start":
		implied = "--enable"
	case "stop":
		implied = "--disable"
	default:
		return slices.Clone(extraSnapArgs)
	}
	return append([]string{implied}, extraSnapArgs...)
}

// flagsOf lists the flags the snap command accepts for each action besides
// the scope flags (cmd/snap/cmd_services.go: svcStart, svcStop, svcRestart
// with waitMixin's --no-wait).
var flagsOf = map[string][]string{
	"start":   {"--enable", "--no-wait"},
	"stop":    {"--disable", "--no-wait"},
	"restart": {"--reload", "--no-wait"},
}

// ParseRequest checks a call the way Snap does before sending anything:
// action is "start", "stop" or "restart"; services are app names of the
// snap instance, bare ("kubelet") or prefixed with the instance
// ("k8s.kubelet"), or the instance name alone for every service of the
// snap; extraSnapArgs are snap command flags valid for the action, taken
// as given (no flag is implied here: see ImplyFlags). Errors are *snapsvc.OpError wrapping snapsvc.ErrNoNames,
// snapsvc.ErrInvalidName, snapsvc.ErrWrongSnap, ErrUnknownFlag or
// ErrUnsupportedFlag.
func ParseRequest(instance, action string, services []string, extraSnapArgs ...string) (Request, error) {
	fail := func(names []string, err error) (Request, error) {
		return Request{}, &snapsvc.OpError{Op: action, Snap: instance, Names: names, Err: err}
	}
	allowed, ok := flagsOf[action]
	if !ok {
		return fail(services, fmt.Errorf("unknown action %q: want start, stop or restart", action))
	}
	if len(services) == 0 {
		return fail(nil, snapsvc.ErrNoNames)
	}
	req := Request{Action: action, Names: make([]string, 0, len(services))}
	for _, s := range services {
		full, err := serviceName(instance, s)
		if err != nil {
			return fail(services, err)
		}
		req.Names = append(req.Names, full)
	}
	for _, a := range extraSnapArgs {
		switch {
		case slices.Contains(allowed, a):
			req.Args = append(req.Args, a)
			switch a {
			case "--enable":
				req.Enable = true
			case "--disable":
				req.Disable = true
			case "--reload":
				req.Reload = true
			case "--no-wait":
				req.NoWait = true
			}
		case isScopeFlag(a):
			return fail(req.Names, fmt.Errorf("%w %s: snapsvc acts on system services only (scope and user flags are not passed on)", ErrUnsupportedFlag, a))
		case !strings.HasPrefix(a, "-"):
			return fail(req.Names, fmt.Errorf("%w: unexpected argument %q: services go in the services list, extra arguments are flags (snap %s accepts %s)", ErrUnknownFlag, a, action, strings.Join(allowed, ", ")))
		case isFlagOfAnotherAction(a):
			return fail(req.Names, fmt.Errorf("%w %s: not a flag of snap %s (it accepts %s)", ErrUnknownFlag, a, action, strings.Join(allowed, ", ")))
		default:
			return fail(req.Names, fmt.Errorf("%w %s: snap %s accepts %s", ErrUnknownFlag, a, action, strings.Join(allowed, ", ")))
		}
	}
	return req, nil
}

func isScopeFlag(a string) bool {
	name, _, _ := strings.Cut(a, "=")
	return name == "--system" || name == "--user" || name == "--users"
}

func isFlagOfAnotherAction(a string) bool {
	for _, flags := range flagsOf {
		if slices.Contains(flags, a) {
			return true
		}
	}
	return false
}

// serviceName maps a name as k8sd's contract allows it to the name snapd
// uses: a bare app name ("kubelet") or one prefixed with the instance
// ("k8s.kubelet") to "<instance>.<app>", and the instance name alone
// ("k8s") to itself, which means every service of the snap.
func serviceName(instance, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w \"\": empty service name (give \"<app>\", %q or %q for the whole snap)", snapsvc.ErrInvalidName, instance+".<app>", instance)
	}
	if name == instance {
		return instance, nil
	}
	if prefix, _, ok := strings.Cut(name, "."); ok {
		if prefix != instance {
			return "", fmt.Errorf("%w: %q names a service of snap %q; this handle controls snap %q only (give \"<app>\" or %q)", snapsvc.ErrWrongSnap, name, prefix, instance, instance+".<app>")
		}
		if _, _, err := snapsvc.ValidateName(name); err != nil {
			return "", err
		}
		return name, nil
	}
	snapName, _, hasKey := strings.Cut(instance, "_")
	if hasKey && name == snapName {
		return "", fmt.Errorf("%w: %q is snap %q, not instance %q (give %q for the whole instance)", snapsvc.ErrWrongSnap, name, snapName, instance, instance)
	}
	full := instance + "." + name
	if _, _, err := snapsvc.ValidateName(full); err != nil {
		return "", err
	}
	return full, nil
}
