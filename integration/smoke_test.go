//go:build realsnapd

package integration

import (
	"strings"
	"testing"
)

func TestSmokeSystemInfo(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	r := w.do(t, "GET", "/v2/system-info", nil)
	if r.StatusCode != 200 {
		t.Fatalf("GET /v2/system-info: %d %s", r.StatusCode, r.Raw)
	}
	t.Logf("system-info: %s", r.Raw)
}

// TestSmokeNoStartLimit checks that run.sh turned systemd's start rate
// limit off in the container: the tests start the same services more
// often than its default (5 starts in 10 s) allows, and a start it refuses
// ("attempted too often") would fail some test at random.
func TestSmokeNoStartLimit(t *testing.T) {
	e := loadEnv(t)
	if e.Leader == "" {
		t.Skip("SNAPSVC_REALSNAPD_LEADER not set: not in run.sh's container")
	}
	out, stderr, err := e.runInside(t, "systemctl", "show", "--property=StartLimitIntervalUSec", "--value", "snap.svcdemo.alpha.service")
	if err != nil {
		t.Fatalf("systemctl show: %v %s", err, stderr)
	}
	if got := strings.TrimSpace(out); got != "0" {
		t.Fatalf("alpha's StartLimitIntervalUSec is %q, want 0 (run.sh's system.conf.d drop-in not applied)", got)
	}
}
