package snapsvc_test

import (
	"math"
	"testing"

	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Issue 18, defect 8: New accepted a NaN in the policy, which made the
// backoff a busy loop (775 requests in 500 ms); it now fails.
func TestNewRejectsInvalidPolicy(t *testing.T) {
	p := retry.DefaultPolicy()
	p.Multiplier = math.NaN()
	if c, err := snapsvc.New(snapsvc.WithPolicy(p)); err == nil {
		c.Close()
		t.Fatal("New accepted a NaN Multiplier")
	}
}
