package etcdbudget

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/snapsvc/snapsvc/budget"
)

// UnreachableError is a failure to reach etcd (or a quorum of it) within
// Config.Unreachable: every attempt timed out or found no member able to
// answer. It wraps budget.ErrUnavailable (retryable) and the last
// attempt's error. It is the only failure on which a FailOpen budget
// grants an unbudgeted slot.
type UnreachableError struct {
	// What the budget was doing ("reading the queue of k8s.kube-apiserver").
	What string
	// For is how long etcd had been failing.
	For time.Duration
	// Err is the last attempt's error.
	Err error
	// Endpoints is what each endpoint of the client gave when asked
	// directly (a connection of its own, failing fast) once the bound was
	// reached: refused, no answer, or answered (then the cluster has no
	// quorum, or that member is cut off from it).
	Endpoints []EndpointError
}

func (e *UnreachableError) Error() string {
	msg := fmt.Sprintf("%v: %s: etcd unreachable or without quorum for %s: %v", budget.ErrUnavailable, e.What, e.For.Round(time.Millisecond), e.Err)
	if len(e.Endpoints) > 0 {
		msg += " (endpoints: " + endpointsString(e.Endpoints) + ")"
	}
	return msg
}

// Unwrap returns budget.ErrUnavailable and the cause.
func (e *UnreachableError) Unwrap() []error { return []error{budget.ErrUnavailable, e.Err} }

// refused wraps a permanent answer of etcd.
func refused(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", budget.ErrRefused, what, err)
}

// errLeaseGone: etcd answered that a lease does not exist (it expired
// or was revoked).
var errLeaseGone = errors.New("lease not found")

// isRefusal reports whether err is etcd (or the connection to it)
// refusing the request for good: retrying cannot help until an operator
// acts. Anything else (timeouts, no leader, connection refused, too many
// requests) is unreachability, and retried. (A client closed by the
// application is permanent too: call checks the client itself.)
func isRefusal(err error) bool {
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var ua x509.UnknownAuthorityError
	var he x509.HostnameError
	var ci x509.CertificateInvalidError
	if errors.As(err, &ua) || errors.As(err, &he) || errors.As(err, &ci) {
		return true
	}
	code, msg := codeOf(err)
	switch code {
	case codes.InvalidArgument, // request too large, auth failed, user empty, ...
		codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition,
		codes.Unimplemented, codes.AlreadyExists, codes.OutOfRange,
		codes.DataLoss: // "etcdserver: corrupt cluster": an operator must restore it
		return true
	case codes.ResourceExhausted:
		// "too many requests" is load and passes; a message over the
		// size limit or "database space exceeded" (an alarm) does not.
		return !strings.Contains(msg, "too many requests")
	case codes.Unavailable, codes.Unknown:
		// gRPC reports a failed TLS handshake as Unavailable.
		return strings.Contains(msg, "authentication handshake failed") ||
			strings.Contains(msg, "x509:") || strings.Contains(msg, "tls:")
	}
	return false
}

// isLeaseGone reports whether err says the lease does not exist.
func isLeaseGone(err error) bool {
	if errors.Is(err, errLeaseGone) || errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return true
	}
	code, _ := codeOf(err)
	return code == codes.NotFound
}

func codeOf(err error) (codes.Code, string) {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code(), ee.Error()
	}
	if s, ok := status.FromError(err); ok {
		return s.Code(), s.Message()
	}
	return codes.Unknown, err.Error()
}

// outage tracks how long etcd has been failing, for the Unreachable
// bound. It counts from the start of the first failed attempt, so the
// bound holds across retries and across the requests of one Acquire.
type outage struct {
	bound time.Duration
	since time.Time
	// early: diagnose the endpoints on the first failed attempt, not only
	// when no connection is ready (operator commands).
	early bool
	diag  []EndpointError // the endpoints' diagnosis during this outage
}

func (o *outage) failed(sent time.Time) bool {
	if o.since.IsZero() {
		o.since = sent
	}
	return time.Since(o.since) >= o.bound
}

func (o *outage) ok() { o.since, o.diag = time.Time{}, nil }

func (o *outage) failing() bool { return !o.since.IsZero() }

func (o *outage) lasted() time.Duration {
	if o.since.IsZero() {
		return 0
	}
	return time.Since(o.since)
}

// call runs one etcd request f, each attempt bounded by Config.Attempt
// so that a member that hangs (a frozen machine, a black-holed network:
// no error ever comes back) costs one attempt, after which the attempts
// go around it (detour.go: the client's round-robin balancer alone may
// send them to it again and again). f sends its requests through b.kv
// and b.leases of the context it is given. It retries unreachability
// with jittered backoff until out has lasted Config.Unreachable, then
// returns an *UnreachableError; a
// refusal returns at once, wrapping budget.ErrRefused; a lease
// etcd does not know returns errLeaseGone. When ctx ends it returns its
// cause.
func (b *Budget) call(ctx context.Context, out *outage, what string, f func(context.Context) error) error {
	backoff := 20 * time.Millisecond
	ended := func() error {
		if out.diag != nil {
			return fmt.Errorf("%s: %w (etcd: %s)", what, context.Cause(ctx), endpointsString(out.diag))
		}
		return context.Cause(ctx)
	}
	for {
		if ctx.Err() != nil {
			return ended()
		}
		if b.cfg.Client.Ctx().Err() != nil {
			// The application closed the client: no retry can reach etcd
			// through it (and a fail-open budget must not grant on it).
			return refused(what, errors.New("the etcd client was closed"))
		}
		sent := time.Now()
		via, err := b.attempt(ctx, out, f)
		b.requests.Add(1)
		if err == nil {
			out.ok()
			return nil
		}
		if r := (refusedEndpoints)(nil); errors.As(err, &r) {
			return refused(what, r)
		}
		switch {
		case ctx.Err() != nil:
			return ended()
		case b.cfg.Client.Ctx().Err() != nil:
			// The application closed the client: no retry can reach etcd
			// through it (and a fail-open budget must not grant on it).
			return refused(what, fmt.Errorf("the etcd client was closed: %w", err))
		case isLeaseGone(err):
			return fmt.Errorf("%s: %w: %w", what, errLeaseGone, err)
		case isRefusal(err):
			return refused(what, fmt.Errorf("etcd at %s: %w", strings.Join(b.cfg.Client.Endpoints(), ","), err))
		case out.failed(sent):
			if out.diag == nil {
				out.diag = b.diagnose(ctx)
			}
			// A TLS failure is a refusal, never unreachability: a fail-open
			// budget must not grant a slot on it.
			if r := tlsRefusal(out.diag, false); r != nil {
				return refused(what, r)
			}
			return &UnreachableError{What: what, For: out.lasted(), Err: err, Endpoints: out.diag}
		}
		b.cfg.Logger.Debug("etcd request failed, retrying", "what", what, "error", err)
		b.afterAttempt(ctx, out, via, err)
		if err := sleep(ctx, backoff/2+rand.N(backoff/2+1)); err != nil {
			return err
		}
		backoff = min(2*backoff, time.Second)
	}
}

// diagnoseAfter is how long an attempt runs, with no connection ready
// (or for an operator command), before the endpoints are asked why.
const diagnoseAfter = 250 * time.Millisecond

// attempt runs one attempt of f, bounded by Config.Attempt, through the
// client's detour around a hung member if it has one (returned: nil for
// the client's balancer; see detour.go). When it has not returned after
// diagnoseAfter and no connection is ready (or out is an operator
// command's), it asks every endpoint why, once per outage (out.diag): a
// TLS failure on every endpoint ends the attempt at once with a
// refusedEndpoints error.
func (b *Budget) attempt(ctx context.Context, out *outage, f func(context.Context) error) (*endpointConn, error) {
	actx, cancel := context.WithTimeout(ctx, b.cfg.Attempt)
	defer cancel()
	actx, via := b.routed(actx)
	if out.diag != nil || !(out.early || b.connecting()) {
		return via, f(actx)
	}
	done := make(chan error, 1)
	go func() { done <- f(actx) }()
	t := time.NewTimer(diagnoseAfter)
	defer t.Stop()
	var diag chan []EndpointError
	for {
		select {
		case err := <-done:
			if diag != nil && ctx.Err() != nil {
				// Ended by the caller: its error names the endpoints if
				// they answer at once.
				select {
				case out.diag = <-diag:
				case <-time.After(diagnoseAfter):
				}
			}
			return via, err
		case <-t.C:
			diag = make(chan []EndpointError, 1)
			go func() {
				dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.Attempt)
				defer dcancel()
				diag <- b.diagnose(dctx)
			}()
		case d := <-diag:
			out.diag, diag = d, nil
			if r := tlsRefusal(d, true); r != nil {
				cancel()
				<-done
				return via, r
			}
		}
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
