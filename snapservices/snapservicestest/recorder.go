// Package snapservicestest is test support for callers of package
// snapservices: a Recorder that implements snapservices.Control in memory,
// recording each call and answering with errors the test sets. It sends
// nothing to snapd; for that, use package fake.
package snapservicestest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Call is one recorded call.
type Call struct {
	// Action is "start", "stop" or "restart", or "services" for a read
	// (Services, or a "services" line handed to Output).
	Action string
	// Services are the names as the caller gave them.
	Services []string
	// Args are the extra arguments as given.
	Args []string
	// Names are the services as snapd would be asked for them
	// ("k8s.kubelet"); nil when the call was refused.
	Names []string
	// Command is the command line a snapservices.Snap built alike would
	// stand for, in the Recorder's mode, implied flag included (["snap"
	// "start" "k8s.kubelet" "--enable"], or with Snapctl ["snapctl"
	// "start" "microceph.rgw" "--enable"]); nil when the call was refused.
	Command []string
	// Err is what the call returned.
	Err error
}

// Recorder implements snapservices.Control in memory. It checks every call
// as snapservices.Snap does (names bare,
// instance-prefixed or the instance alone, flags valid for the action, the
// implied "--enable"/"--disable" unless PlainFlags; snapservices.ParseRequest
// and ImplyFlags), so a caller's test fails on "--force" or "etcd.etcd" as
// the real one would, then records it and answers with the error set for
// it, if any. It is safe for concurrent use.
//
// It stands in for a whole snapservices.Snap (a Control); a test that
// asserts command lines, as k8sd's do with mock.Runner, can pass
// Recorder.Run to snapservices.WithCommandRunner instead, or compare
// Commands with the lines it expects.
type Recorder struct {
	instance string
	plain    bool
	mode     snapsvc.Mode

	mu      sync.Mutex
	calls   []Call
	byCall  map[int]error    // FailCall: 1-based call number → error
	bySvc   map[string]error // FailService: action+"|"+service → error
	handler func(context.Context, Call) error
	state   map[string]svcState // "snap.app" → state, moved by the calls that succeed
}

type svcState struct{ enabled, active bool }

var _ snapservices.Control = (*Recorder)(nil)

// RecorderOption configures NewRecorder.
type RecorderOption func(*Recorder)

// PlainFlags makes the Recorder check calls as a Snap built with
// snapservices.WithPlainFlags: no flag is implied.
func PlainFlags() RecorderOption { return func(r *Recorder) { r.plain = true } }

// Snapctl makes the Recorder render and expect command lines in snapctl
// mode, as a Snap in snapctl mode hands them to its runner ("snapctl
// restart --reload microceph.rgw", "snapctl start microceph.rgw
// --enable"; snapservices.Request.CommandFor): Run and Output refuse a
// "snap ..." line, and Commands returns snapctl lines.
func Snapctl() RecorderOption { return func(r *Recorder) { r.mode = snapsvc.ModeSnapctl } }

// NewRecorder returns a Recorder for the snap instance (for example "k8s").
// Its services start disabled and inactive (SetService changes that); the
// calls that succeed move them as snapd would (start: active, and enabled
// with --enable; stop: inactive, and disabled with --disable; restart:
// active), so Services and Output answer what the calls did.
func NewRecorder(instance string, opts ...RecorderOption) *Recorder {
	r := &Recorder{instance: instance, mode: snapsvc.ModeREST, byCall: map[int]error{}, bySvc: map[string]error{}, state: map[string]svcState{}}
	for _, o := range opts {
		o(r)
	}
	return r
}

// FailCall makes the n-th call (1-based, counting every call, reads and
// refused calls included) return err.
func (r *Recorder) FailCall(n int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byCall[n] = err
}

// FailService makes every call of action ("start", "stop", "restart",
// "services", or "" for any) that names service (a bare name, as callers pass it) return
// err, until ClearFailures.
func (r *Recorder) FailService(action, service string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bySvc[action+"|"+service] = err
}

// ClearFailures removes the errors set with FailCall and FailService.
func (r *Recorder) ClearFailures() {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.byCall)
	clear(r.bySvc)
}

// HandleFunc sets a function called for each accepted call that no
// FailCall or FailService error answered; its result is the call's. A test
// uses it to block a call, or to answer from its own state. The Recorder's
// lock is not held while it runs.
func (r *Recorder) HandleFunc(f func(ctx context.Context, c Call) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.handler = f
}

// Calls returns every call so far, in the order they were made.
func (r *Recorder) Calls() []Call {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Call, len(r.calls))
	for i, c := range r.calls {
		out[i] = c.clone()
	}
	return out
}

// Commands returns the command line of every accepted call so far, each
// joined with spaces ("snap start k8s.kubelet --enable", or in snapctl
// mode "snapctl start microceph.rgw --enable"; reads included: "snapctl
// services microceph.rgw"): the strings k8sd's mock.Runner records in
// CalledWithCommand.
func (r *Recorder) Commands() []string {
	var out []string
	for _, c := range r.Calls() {
		if c.Command != nil {
			out = append(out, strings.Join(c.Command, " "))
		}
	}
	return out
}

// Run records a command line a snapservices.Snap built with
// WithCommandRunner(r.Run) hands over, in the Recorder's mode: ["snap",
// action, names..., flags...] or ["snapctl", action, flags and names...].
// The line is checked again (so Names and Command are filled in as for a
// direct call) and answered like one; a line in the other mode's program,
// or that is not a service command, is recorded and refused.
func (r *Recorder) Run(ctx context.Context, command []string) error {
	_, err := r.Output(ctx, command)
	return err
}

// Output is Run for snapservices.WithCommandOutput: a "services" line
// ("snapctl services microceph.rgw") is recorded as a read and answered
// with the table snapctl prints, from the state the calls so far left
// (SetService sets it); any other line is Run's.
func (r *Recorder) Output(ctx context.Context, command []string) (string, error) {
	prog := "snap"
	if r.mode == snapsvc.ModeSnapctl {
		prog = "snapctl"
	}
	if len(command) < 2 || command[0] != prog {
		err := fmt.Errorf("snapservicestest: %q is not a %s command line (the Recorder expects %s mode's: use Snapctl() for snapctl)", strings.Join(command, " "), prog, r.mode)
		r.mu.Lock()
		r.calls = append(r.calls, Call{Args: slices.Clone(command), Err: err})
		r.mu.Unlock()
		return "", err
	}
	var names, args []string
	for _, a := range command[2:] {
		if strings.HasPrefix(a, "-") {
			args = append(args, a)
		} else {
			names = append(names, a)
		}
	}
	if command[1] == "services" {
		return r.read(ctx, names, args)
	}
	return "", r.record(ctx, command[1], names, args, true)
}

// SetService sets the state of a service ("kubelet" or "k8s.kubelet").
func (r *Recorder) SetService(name string, enabled, active bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.state[r.full(name)] = svcState{enabled: enabled, active: active}
}

// Services implements snapservices.Snap's status call in memory: the
// state of the named services (bare, prefixed, or the instance alone for
// every service the Recorder knows), recorded as a "services" call.
func (r *Recorder) Services(ctx context.Context, services []string) ([]snapsvc.Service, error) {
	if _, err := r.read(ctx, services, nil); err != nil {
		return nil, err
	}
	return r.services(services), nil
}

// full maps a name to "instance.app".
func (r *Recorder) full(name string) string {
	if strings.Contains(name, ".") || name == r.instance {
		return name
	}
	return r.instance + "." + name
}

// services returns the state of names (r.mu not held).
func (r *Recorder) services(names []string) []snapsvc.Service {
	r.mu.Lock()
	defer r.mu.Unlock()
	var want []string
	for _, n := range names {
		if n == r.instance {
			for k := range r.state {
				want = append(want, k)
			}
			slices.Sort(want)
			continue
		}
		want = append(want, r.full(n))
	}
	out := make([]snapsvc.Service, 0, len(want))
	for _, n := range want {
		snap, app, _ := strings.Cut(n, ".")
		st := r.state[n]
		out = append(out, snapsvc.Service{Snap: snap, Name: app, Daemon: "simple", Enabled: st.enabled, Active: st.active})
	}
	return out
}

// read records a "services" call and renders the table.
func (r *Recorder) read(ctx context.Context, services, args []string) (string, error) {
	c := Call{Action: "services", Services: slices.Clone(services), Args: slices.Clone(args)}
	var err error
	switch {
	case len(services) == 0:
		err = fmt.Errorf("snapservicestest: services: %w", snapsvc.ErrNoNames)
	case len(args) > 0:
		err = fmt.Errorf("snapservicestest: services: %w %s", snapservices.ErrUnknownFlag, args[0])
	}
	if err == nil {
		for _, s := range services {
			c.Names = append(c.Names, r.full(s))
		}
		c.Command = snapservices.ServicesCommand(r.mode, c.Names)
	}
	if err = r.finish(ctx, c, err, nil); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("Service  Startup  Current  Notes\n")
	for _, sv := range r.services(services) {
		fmt.Fprintf(&b, "%s  %s  %s  -\n", sv.FullName(), map[bool]string{true: "enabled", false: "disabled"}[sv.Enabled], map[bool]string{true: "active", false: "inactive"}[sv.Active])
	}
	return b.String(), nil
}

// failure returns the FailService error for a call (r.mu held).
func (r *Recorder) failure(action string, services []string) error {
	for _, s := range services {
		if e := r.bySvc[action+"|"+s]; e != nil {
			return e
		}
		if e := r.bySvc["|"+s]; e != nil {
			return e
		}
	}
	return nil
}

// CallsOf returns the calls of one action.
func (r *Recorder) CallsOf(action string) []Call {
	var out []Call
	for _, c := range r.Calls() {
		if c.Action == action {
			out = append(out, c)
		}
	}
	return out
}

// Reset forgets the calls recorded so far (errors set stay).
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = nil
}

// StartServices records a start.
func (r *Recorder) StartServices(ctx context.Context, services []string, extraSnapArgs ...string) error {
	return r.record(ctx, "start", services, extraSnapArgs, r.plain)
}

// StopServices records a stop.
func (r *Recorder) StopServices(ctx context.Context, services []string, extraSnapArgs ...string) error {
	return r.record(ctx, "stop", services, extraSnapArgs, r.plain)
}

// RestartServices records a restart.
func (r *Recorder) RestartServices(ctx context.Context, services []string, extraSnapArgs ...string) error {
	return r.record(ctx, "restart", services, extraSnapArgs, r.plain)
}

// record checks and records a call; plain says the args are taken as
// given, without the implied flag.
func (r *Recorder) record(ctx context.Context, action string, services, args []string, plain bool) error {
	c := Call{Action: action, Services: slices.Clone(services), Args: slices.Clone(args)}
	full := args
	if !plain {
		full = snapservices.ImplyFlags(action, args)
	}
	req, perr := snapservices.ParseRequest(r.instance, action, services, full...)
	if perr == nil {
		c.Names = req.Names
		c.Command = req.CommandFor(r.mode)
	}

	return r.finish(ctx, c, perr, func() { r.apply(req) })
}

// finish records call c and its outcome: perr (the call refused before
// anything ran), else the failure set for its number or for its action
// and services, else the handler's answer. On success done, if any, runs
// with r.mu held.
func (r *Recorder) finish(ctx context.Context, c Call, perr error, done func()) error {
	r.mu.Lock()
	n := len(r.calls) + 1
	r.calls = append(r.calls, c) // Err filled in below
	err := perr
	if err == nil {
		err = r.byCall[n]
	}
	if err == nil {
		err = r.failure(c.Action, c.Services)
	}
	handler := r.handler
	r.mu.Unlock()

	if err == nil && perr == nil && handler != nil {
		err = handler(ctx, c.clone())
	}
	r.mu.Lock()
	r.calls[n-1].Err = err
	if err == nil && done != nil {
		done()
	}
	r.mu.Unlock()
	return err
}

// apply moves the state of the services a call acted on (r.mu held).
func (r *Recorder) apply(req snapservices.Request) {
	var names []string
	for _, n := range req.Names {
		if n != r.instance {
			names = append(names, n)
			continue
		}
		for k := range r.state {
			names = append(names, k)
		}
	}
	for _, n := range names {
		st := r.state[n]
		switch req.Action {
		case "start":
			st.active = true
			st.enabled = st.enabled || req.Enable
		case "stop":
			st.active = false
			st.enabled = st.enabled && !req.Disable
		case "restart":
			st.active = true
		}
		r.state[n] = st
	}
}

func (c Call) clone() Call {
	c.Services = slices.Clone(c.Services)
	c.Args = slices.Clone(c.Args)
	c.Names = slices.Clone(c.Names)
	c.Command = slices.Clone(c.Command)
	return c
}
