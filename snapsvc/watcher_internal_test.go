package snapsvc

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
)

// K callers of one process waiting for one change, or for one snap to be
// idle, share one wait: snapd sees the requests of one waiter, however
// many there are. A caller that leaves early gets its context's error;
// the others still get the outcome.
func TestSharedWaits(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	const k = 10
	for _, tc := range []struct {
		v    fake.Version
		idle bool
	}{{fake.Version277, false}, {fake.Version277, true}, {fake.Version257, false}, {fake.Version257, true}} {
		name := string(tc.v) + map[bool]string{true: "/idle", false: "/change"}[tc.idle]
		t.Run(name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.WithVersion(tc.v), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
			clients := make([]*Client, 2) // two Clients of one process share too
			for i := range clients {
				c, err := New(WithSocket(srv.SocketPath()), WithMode(ModeREST), WithPollInterval(20*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				clients[i] = c
			}
			blk := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: "k8s"})
			key := clients[0].waitKey("change " + blk.ID())
			if tc.idle {
				key = clients[0].waitKey("idle k8s")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			early, leave := context.WithCancel(ctx)
			errs := make([]error, k+1)
			var wg sync.WaitGroup
			for i := range k + 1 {
				c, cctx := clients[i%2], ctx
				if i == k {
					cctx = early
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if tc.idle {
						errs[i] = c.WaitIdle(cctx, "k8s")
						return
					}
					var chg *Change
					chg, errs[i] = c.WaitChange(cctx, blk.ID())
					if errs[i] == nil && chg.Status != "Done" {
						t.Errorf("waiter %d: change %+v", i, chg)
					}
				}()
			}
			if err := processWaits.awaitSubscribers(ctx, key, k+1); err != nil {
				t.Fatal(err)
			}
			leave()
			if err := processWaits.awaitSubscribers(ctx, key, k); err != nil {
				t.Fatal(err)
			}
			blk.Finish()
			wg.Wait()
			for i, err := range errs[:k] {
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
			}
			if errs[k] == nil || early.Err() == nil {
				t.Errorf("the caller that left: %v", errs[k])
			}
			reads := 0
			for _, r := range srv.Requests() {
				if r.Method == "GET" {
					reads++
				}
			}
			// One waiter's reads: with notices a first read, a long-poll,
			// the change (+ a listing for WaitIdle, and one to see the snap
			// idle); without, the listing and the polls of one waiter.
			if limit := map[fake.Version]int{fake.Version277: 6, fake.Version257: 8}[tc.v]; reads > limit {
				t.Errorf("%d callers made %d reads, want at most %d (one waiter's)", k, reads, limit)
			}
			t.Logf("%d callers: %d reads", k, reads)
		})
	}
}
