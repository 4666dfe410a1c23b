//go:build realsnapd

package integration

import "testing"

func TestSmokeSystemInfo(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	r := w.do(t, "GET", "/v2/system-info", nil)
	if r.StatusCode != 200 {
		t.Fatalf("GET /v2/system-info: %d %s", r.StatusCode, r.Raw)
	}
	t.Logf("system-info: %s", r.Raw)
}
