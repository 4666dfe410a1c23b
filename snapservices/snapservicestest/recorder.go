// Package snapservicestest is test support for callers of package
// snapservices: a Recorder that implements snapservices.Control in memory,
// recording each call and answering with errors the test sets. It sends
// nothing to snapd; for that, use package fake.
package snapservicestest

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/snapsvc/snapsvc/snapservices"
)

// Call is one recorded call.
type Call struct {
	// Action is "start", "stop" or "restart".
	Action string
	// Services are the names as the caller gave them.
	Services []string
	// Args are the extra arguments as given.
	Args []string
	// Names are the services as snapd would be asked for them
	// ("k8s.kubelet"); nil when the call was refused.
	Names []string
	// Command is the snap command line a snapservices.Snap built alike
	// would stand for, implied flag included (["snap" "start"
	// "k8s.kubelet" "--enable"]); nil when the call was refused.
	Command []string
	// Err is what the call returned.
	Err error
}

// Recorder implements snapservices.Control in memory. It checks every call
// as snapservices.Snap does in its default REST mode (names bare,
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

	mu      sync.Mutex
	calls   []Call
	byCall  map[int]error    // FailCall: 1-based call number → error
	bySvc   map[string]error // FailService: action+"|"+service → error
	handler func(context.Context, Call) error
}

var _ snapservices.Control = (*Recorder)(nil)

// RecorderOption configures NewRecorder.
type RecorderOption func(*Recorder)

// PlainFlags makes the Recorder check calls as a Snap built with
// snapservices.WithPlainFlags: no flag is implied.
func PlainFlags() RecorderOption { return func(r *Recorder) { r.plain = true } }

// NewRecorder returns a Recorder for the snap instance (for example "k8s").
func NewRecorder(instance string, opts ...RecorderOption) *Recorder {
	r := &Recorder{instance: instance, byCall: map[int]error{}, bySvc: map[string]error{}}
	for _, o := range opts {
		o(r)
	}
	return r
}

// FailCall makes the n-th call (1-based, counting every action, refused
// calls included) return err.
func (r *Recorder) FailCall(n int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byCall[n] = err
}

// FailService makes every call of action ("start", "stop", "restart", or
// "" for any) that names service (a bare name, as callers pass it) return
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
// joined with spaces ("snap start k8s.kubelet --enable"): the strings
// k8sd's mock.Runner records in CalledWithCommand.
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
// WithCommandRunner(r.Run) hands over: ["snap", action, names...,
// flags...]. The line is checked again (so Names and Command are filled
// in as for a direct call) and answered like one; a line that is not a
// snap service command is recorded and refused.
func (r *Recorder) Run(ctx context.Context, command []string) error {
	if len(command) < 2 || command[0] != "snap" {
		return r.record(ctx, "", nil, slices.Clone(command), true)
	}
	var names, args []string
	for _, a := range command[2:] {
		if strings.HasPrefix(a, "-") {
			args = append(args, a)
		} else {
			names = append(names, a)
		}
	}
	return r.record(ctx, command[1], names, args, true)
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
		c.Command = req.Command()
	}

	r.mu.Lock()
	n := len(r.calls) + 1
	r.calls = append(r.calls, c) // Err filled in below
	err := perr
	if err == nil {
		err = r.byCall[n]
	}
	if err == nil {
		for _, s := range services {
			if e := r.bySvc[action+"|"+s]; e != nil {
				err = e
				break
			}
			if e := r.bySvc["|"+s]; e != nil {
				err = e
				break
			}
		}
	}
	handler := r.handler
	r.mu.Unlock()

	if err == nil && perr == nil && handler != nil {
		err = handler(ctx, c.clone())
	}
	r.mu.Lock()
	r.calls[n-1].Err = err
	r.mu.Unlock()
	return err
}

func (c Call) clone() Call {
	c.Services = slices.Clone(c.Services)
	c.Args = slices.Clone(c.Args)
	c.Names = slices.Clone(c.Names)
	c.Command = slices.Clone(c.Command)
	return c
}
