package etcdbudget

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"

	"github.com/snapsvc/snapsvc/budget"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The taxonomy: what etcd or gRPC answers for good is a refusal; load,
// timeouts and missing leaders are unreachability (retried).
func TestIsRefusal(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{rpctypes.ErrRequestTooLarge, true},
		{rpctypes.ErrPermissionDenied, true},
		{rpctypes.ErrAuthFailed, true},
		{rpctypes.ErrInvalidAuthToken, true},
		{rpctypes.ErrUserEmpty, true},
		{rpctypes.ErrNoSpace, true},
		{rpctypes.ErrGRPCRequestTooLarge, true},
		{rpctypes.ErrGRPCCorrupt, true},
		{status.Error(codes.ResourceExhausted, "trying to send message larger than max (3000000 vs. 2097152)"), true},
		{status.Error(codes.Unavailable, `connection error: desc = "transport: authentication handshake failed: tls: first record does not look like a TLS handshake"`), true},
		{fmt.Errorf("dial: %w", x509.UnknownAuthorityError{}), true},
		{rpctypes.ErrTooManyRequests, false},
		{rpctypes.ErrNoLeader, false},
		{rpctypes.ErrTimeout, false},
		{rpctypes.ErrLeaderChanged, false},
		{status.Error(codes.Unavailable, "connection refused"), false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("x: %w", context.Canceled), false},
	} {
		if got := isRefusal(c.err); got != c.want {
			t.Errorf("isRefusal(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if !isLeaseGone(rpctypes.ErrLeaseNotFound) || isLeaseGone(rpctypes.ErrNoLeader) {
		t.Error("isLeaseGone")
	}
}

// Whatever request notices that this waiter's own lease expired (the
// enqueue, a re-read, the lock-delay guard's put, the check of a vanished
// entry), Acquire reports it as retryable unavailability, never as a bare
// "lease not found" and never as a fail-open grant. TestRolloutFaults
// once ended a machine's rollout on "checking lease of ...: lease not
// found [not retryable]", from the guard's put.
func TestOwnLeaseGoneIsRetryable(t *testing.T) {
	b := &Budget{cfg: Config{FailOpen: true}}
	raw := fmt.Errorf("checking lease of /snapsvc/restart-budget/k/1-3: %w: %w", errLeaseGone, rpctypes.ErrLeaseNotFound)
	slot, err := b.failed(context.Background(), "k", raw)
	if slot != nil {
		t.Fatalf("granted %v on an expired lease", slot)
	}
	if !errors.Is(err, budget.ErrUnavailable) || errors.Is(err, budget.ErrRefused) || !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("want ErrBudgetUnavailable keeping the cause, got %v", err)
	}
	if n := b.failOpen.Load(); n != 0 {
		t.Errorf("%d fail-open grants", n)
	}
	// Already classified: returned as it is, not wrapped twice.
	w := &waiter{key: "k", k: &keeper{}}
	classified := w.leaseErr()
	if _, err := b.failed(context.Background(), "k", classified); err != classified {
		t.Errorf("a classified error was changed: %v", err)
	}
}

// A guard written by an earlier version (no act records) or unreadable is
// judged as a holder that may have acted: a rolling upgrade never skips a
// lock-delay it needed.
func TestGuardOfEarlierVersion(t *testing.T) {
	for raw, settled := range map[string]bool{
		`{"holder":"node-a","since":"2026-12-04T10:00:00Z"}`: false, // before act records
		`not json`: false,
		`{"v":2,"holder":"node-a","since":"2026-12-04T10:00:00Z"}`:                    true, // never acted
		`{"v":2,"holder":"node-a","acts":2,"acted":"2026-12-04T10:00:01Z","ready":2}`: true,
		`{"v":2,"holder":"node-a","acts":2,"acted":"2026-12-04T10:00:01Z","ready":1}`: false,
		`{"v":2,"holder":"node-a","acts":1,"acted":"2026-12-04T10:00:01Z"}`:           false,
	} {
		if got := guardOf([]byte(raw)).settled(); got != settled {
			t.Errorf("guard %s: settled %v, want %v", raw, got, settled)
		}
	}
}
