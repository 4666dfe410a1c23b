package snapd

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
)

// deadOnWrite is a kept-alive connection whose peer went away unseen: the
// next write fails with EPIPE before a byte leaves (as writing to a Unix
// socket whose peer closed does), while reads still wait.
type deadOnWrite struct {
	net.Conn
	dead *atomic.Bool
}

func (c *deadOnWrite) Write(p []byte) (int, error) {
	if c.dead.Load() {
		return 0, &net.OpError{Op: "write", Net: "unix", Err: os.NewSyscallError("write", syscall.EPIPE)}
	}
	return c.Conn.Write(p)
}

// TestRetriedAttemptHasItsOwnFacts: snapd stops while a connection to it
// is kept alive. A POST on that connection fails before any byte is sent,
// and net/http sends it again on a new connection, which cannot be made
// (the socket is gone). The error must describe that last attempt: nothing
// written, no connection, and why (the socket does not exist; snapd not
// installed where nothing would create it). Before, the first attempt's
// facts leaked into the error: "written" (the transport reports a request
// written once it is in its buffer) made a POST that never reached snapd
// an unknown outcome, and "connected" hid the missing socket.
func TestRetriedAttemptHasItsOwnFacts(t *testing.T) {
	for _, tc := range []struct {
		name         string
		notInstalled bool
	}{{"snapd restarting", false}, {"snapd gone for good", true}} {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "snapd.socket")
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"type":"sync","status-code":200,"status":"OK","result":[]}`))
			})}
			go srv.Serve(l)
			defer srv.Close()
			c := New(sock)
			defer c.Close()
			if tc.notInstalled {
				c.CheckInstalled(t.TempDir()) // an empty root: no snapd, no systemd
			}
			var dead atomic.Bool
			dials := 0
			c.dial = func(ctx context.Context) (net.Conn, error) {
				dials++
				if dead.Load() {
					var d net.Dialer
					return d.DialContext(ctx, "unix", sock)
				}
				var d net.Dialer
				conn, err := d.DialContext(ctx, "unix", sock)
				if err != nil {
					return nil, err
				}
				return &deadOnWrite{Conn: conn, dead: &dead}, nil
			}
			ctx := context.Background()
			if _, err := c.Apps(ctx, nil, true); err != nil {
				t.Fatal(err)
			}
			// snapd stops: its socket goes, the kept-alive connection dies
			// unseen.
			l.(*net.UnixListener).SetUnlinkOnClose(true)
			l.Close()
			dead.Store(true)

			_, err = c.PostApps(ctx, AppInstruction{Action: "restart", Names: []string{"k8s.kubelet"}})
			var ce *ConnectionError
			if !errors.As(err, &ce) {
				t.Fatalf("PostApps: %v, want a *ConnectionError", err)
			}
			if dials != 2 {
				t.Fatalf("%d dials, want 2 (the kept-alive connection, then the retry's)", dials)
			}
			if ce.Written || ce.Connected {
				t.Errorf("Written %v, Connected %v: want false, false (the last attempt made no connection): %v", ce.Written, ce.Connected, err)
			}
			if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("error does not say the socket is missing: %v", err)
			}
			if got := errors.Is(err, ErrNotInstalled); got != tc.notInstalled {
				t.Errorf("errors.Is(err, ErrNotInstalled) = %v, want %v: %v", got, tc.notInstalled, err)
			}
		})
	}
}
