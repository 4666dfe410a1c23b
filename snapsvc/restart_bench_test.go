package snapsvc_test

import (
	"context"
	"testing"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// BenchmarkRestartUncontended measures one restart with nothing in the
// way, services taking no time, so what is left is snapsvc's own cost:
// validation, the locks, POST /v2/apps and waiting for the change
// (notices on 2.77, polling on 2.57, whose change is ready by the first
// read). reqs/op is the snapd requests per restart.
func BenchmarkRestartUncontended(b *testing.B) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		v    fake.Version
		opts []snapsvc.Option
	}{
		{"2.77/file-lock", fake.Version277, nil},
		{"2.77/in-process-lock", fake.Version277, []snapsvc.Option{snapsvc.WithoutFileLock()}},
		{"2.57/file-lock", fake.Version257, nil},
	} {
		b.Run(tc.name, func(b *testing.B) {
			srv := fake.NewServer(b, fake.AllowNonRoot(), fake.WithVersion(tc.v), fake.WithSnaps(k8sSnap(0)))
			c, err := snapsvc.New(append([]snapsvc.Option{snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST)}, tc.opts...)...)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			// Warm up: the connection, and whether snapd has notices.
			if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
				b.Fatal(err)
			}
			before := totalRequests(srv)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
				if err != nil || res.Attempts != 1 || res.Conflicts != 0 {
					b.Fatalf("restart: %+v, %v", res, err)
				}
			}
			b.ReportMetric(float64(totalRequests(srv)-before)/float64(b.N), "reqs/op")
		})
	}
}
