package snapsvc

import (
	"context"
	"path/filepath"
	"testing"
)

// BenchmarkLock measures taking and releasing one snap's locks: the
// in-process lock alone, with the cross-process file lock (open, flock,
// owner and mode checks, unlock), and the in-process lock contended by
// parallel goroutines. No request is sent.
func BenchmarkLock(b *testing.B) {
	ctx := context.Background()
	socket := filepath.Join(b.TempDir(), "snapd.socket")
	newClient := func(b *testing.B, opts ...Option) *Client {
		c, err := New(append([]Option{WithSocket(socket), WithMode(ModeREST)}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	lockOnce := func(b *testing.B, c *Client) {
		h, err := c.snaps.lock(ctx, []string{"k8s"}, c.lockDirs, []byte(`{"for":"bench"}`), nil)
		if err != nil {
			b.Fatal(err)
		}
		h.release()
	}
	b.Run("in-process", func(b *testing.B) {
		c := newClient(b, WithoutFileLock())
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			lockOnce(b, c)
		}
	})
	b.Run("with-file-lock", func(b *testing.B) {
		c := newClient(b, WithLockDir(b.TempDir()))
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			lockOnce(b, c)
		}
	})
	b.Run("in-process-contended", func(b *testing.B) {
		c := newClient(b, WithoutFileLock())
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lockOnce(b, c)
			}
		})
	})
}
