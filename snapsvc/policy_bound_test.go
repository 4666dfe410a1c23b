package snapsvc_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"

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

// Issue 27: inside a caller's own retry loop the nested policy's time
// (25 s) cut the wait for the operation's own change too, so a service
// that took longer than that to start failed, where the snap command the
// loop used to run waited for its change. Policy.ChangeWait bounds that
// wait on its own: 0 keeps it under MaxElapsedTime, negative leaves it to
// the context, positive bounds it from snapd's answer.
func TestChangeWaitBoundsTheOwnChange(t *testing.T) {
	for _, tc := range []struct {
		name       string
		changeWait time.Duration
		ok         bool
	}{
		{"with the call (0)", 0, false},
		{"the context's (-1)", -1, true},
		{"its own, longer (2s)", 2 * time.Second, true},
		{"its own, shorter (100ms)", 100 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
			srv.SetDurations("k8s", "kubelet", 250*time.Millisecond, 250*time.Millisecond)
			p := retry.DefaultPolicy()
			p.MaxElapsedTime = 200 * time.Millisecond
			p.ChangeWait = tc.changeWait
			c := newClient(t, srv, snapsvc.WithPolicy(p))
			res, err := c.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			if tc.ok {
				if err != nil || res.Status != "Done" {
					t.Fatalf("a 500 ms restart with ChangeWait %v: %+v %v", tc.changeWait, res, err)
				}
				return
			}
			var oe *snapsvc.OpError
			if !errors.As(err, &oe) || oe.ChangeID == "" || oe.Retryable() {
				t.Fatalf("a 500 ms restart with ChangeWait %v: %v, want an error naming its change, not retryable", tc.changeWait, err)
			}
		})
	}
	if retry.NestedPolicy().ChangeWait >= 0 {
		t.Error("the nested policy bounds the own change's wait by the loop's time")
	}
}
