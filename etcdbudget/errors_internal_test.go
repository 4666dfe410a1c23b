package etcdbudget

import (
	"context"
	"crypto/x509"
	"fmt"
	"testing"

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
