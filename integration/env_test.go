//go:build realsnapd

package integration

import (
	"os"
	"strconv"
	"testing"
	"time"
)

// env is what run.sh tells the tests about the real snapd under test.
type env struct {
	Socket     string        // /run/snapd.socket, as reachable from the host
	SnapSocket string        // /run/snapd-snap.socket
	CookieFile string        // /var/lib/snapd/cookie/snap.svcdemo
	Version    string        // snapd's version, e.g. 2.57.6
	Leader     string        // host pid of the container's init
	Slow       time.Duration // gamma's stop and slowstart's start take this long
}

func loadEnv(t testing.TB) env {
	t.Helper()
	e := env{
		Socket:     os.Getenv("SNAPSVC_REALSNAPD_SOCKET"),
		SnapSocket: os.Getenv("SNAPSVC_REALSNAPD_SNAP_SOCKET"),
		CookieFile: os.Getenv("SNAPSVC_REALSNAPD_COOKIE"),
		Version:    os.Getenv("SNAPSVC_REALSNAPD_VERSION"),
		Leader:     os.Getenv("SNAPSVC_REALSNAPD_LEADER"),
	}
	if e.Socket == "" {
		t.Skip("SNAPSVC_REALSNAPD_SOCKET not set: run through integration/run.sh")
	}
	secs, err := strconv.Atoi(os.Getenv("SNAPSVC_SLOW_SECONDS"))
	if err != nil || secs <= 0 {
		secs = 5
	}
	e.Slow = time.Duration(secs) * time.Second
	return e
}

// cookie returns svcdemo's context id, read from snapd's cookie file.
func (e env) cookie(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(e.CookieFile)
	if err != nil {
		t.Fatalf("reading svcdemo's cookie: %v", err)
	}
	return string(b)
}
