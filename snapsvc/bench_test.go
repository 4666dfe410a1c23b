package snapsvc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// foreignHold is how long the foreign change holds the snap in the
// benchmarks below.
const foreignHold = 10 * time.Millisecond

// BenchmarkRestartThroughForeignChange measures a kubelet restart that
// meets a foreign change holding the snap for 10ms: snapsvc, which waits
// for the blocker's notice and retries at once, against the loop k8sd uses
// today (5 attempts, a fixed pause, any error), its 5s pause scaled down
// 100x to 50ms. Compare the ns/op of the two sub-benchmarks, and the
// requests each sends (reqs/op).
func BenchmarkRestartThroughForeignChange(b *testing.B) {
	b.Run("snapsvc", func(b *testing.B) {
		srv := fake.NewServer(b, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
		c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		benchRestart(b, srv, func(ctx context.Context) error {
			_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
			return err
		})
	})
	b.Run("fixed-retry-50ms", func(b *testing.B) {
		srv := fake.NewServer(b, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
		wire := snapd.New(srv.SocketPath())
		defer wire.CloseIdleConnections()
		benchRestart(b, srv, func(ctx context.Context) error {
			return fixedRetry(ctx, 5, 50*time.Millisecond, func() error {
				id, err := wire.PostApps(ctx, snapd.AppInstruction{Action: "restart", Names: []string{"k8s.kubelet"}})
				if err != nil {
					return err
				}
				for {
					chg, err := wire.Change(ctx, id)
					if err != nil {
						return err
					}
					if chg.Ready {
						return nil
					}
					time.Sleep(100 * time.Millisecond)
				}
			})
		})
	})
}

func benchRestart(b *testing.B, srv *fake.Server, restart func(context.Context) error) {
	ctx := context.Background()
	before := totalRequests(srv)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
		timer := time.AfterFunc(foreignHold, foreign.Finish)
		if err := restart(ctx); err != nil {
			b.Fatal(err)
		}
		timer.Stop()
		<-foreign.Ready()
	}
	b.StopTimer()
	b.ReportMetric(float64(totalRequests(srv)-before)/float64(b.N), "reqs/op")
}

// fixedRetry is k8sd's control.RetryFor: a fixed pause after every
// failure, whatever the error.
func fixedRetry(ctx context.Context, attempts int, pause time.Duration, f func() error) error {
	var err error
	for i := 0; i < attempts; i++ {
		if err = f(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
	return errors.Join(errors.New("retries exhausted"), err)
}

func totalRequests(srv *fake.Server) int {
	n := 0
	for _, c := range srv.Counters().Requests {
		n += c
	}
	return n
}

// BenchmarkClassify measures classifying snapd's conflict error.
func BenchmarkClassify(b *testing.B) {
	err := &snapd.Error{StatusCode: 400, Message: `snap "k8s" has "service-control" change in progress`}
	for i := 0; i < b.N; i++ {
		if retry.Classify(err) != retry.Conflict {
			b.Fatal("not a conflict")
		}
	}
}
