package retry_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// goldenError decodes an error body captured from real snapd into the
// error the wire client returns for it.
func goldenError(b *testing.B, file, method, path string) error {
	b.Helper()
	body, err := os.ReadFile(filepath.Join("..", "testdata", "snapd-golden", file))
	if err != nil {
		b.Fatal(err)
	}
	var env struct {
		Status int `json:"status-code"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		b.Fatal(err)
	}
	_, err = snapd.Decode(method, path, env.Status, body)
	if err == nil {
		b.Fatalf("%s is not an error body", file)
	}
	return err
}

// BenchmarkClassify measures retry.Classify on the errors snapsvc meets
// most, decoded from bodies captured from real snapd (plus a missing
// socket, which has no body), and on every captured error body in turn.
func BenchmarkClassify(b *testing.B) {
	cases := []struct {
		name string
		err  error
		want retry.Class
	}{
		{"conflict-apps-400", goldenError(b, "2.57.6/conflict-restart-alpha.json", "POST", "/v2/apps"), retry.Conflict},
		{"conflict-snapctl-2.57", goldenError(b, "2.57.6/snapctl-conflict-restart-alpha.json", "POST", "/v2/snapctl"), retry.Conflict},
		{"conflict-snapctl-2.77", goldenError(b, "2.77.1/snapctl-conflict-restart-alpha.json", "POST", "/v2/snapctl"), retry.Conflict},
		{"conflict-409", goldenError(b, "2.77.1/put-conf-during-configure.json", "PUT", "/v2/snaps/svcdemo/conf"), retry.Conflict},
		{"app-not-found", goldenError(b, "2.57.6/apps-unknown-app.json", "GET", "/v2/apps"), retry.Permanent},
		{"bad-action", goldenError(b, "2.57.6/post-bad-action.json", "POST", "/v2/apps"), retry.Permanent},
		{"longpoll-canceled-500", goldenError(b, "2.77.1/restart-longpoll-inflight.json", "GET", "/v2/notices"), retry.Transient},
		{"no-socket", &snapd.ConnectionError{Socket: "/run/snapd.socket", Method: "POST", Path: "/v2/apps", Err: syscall.ENOENT}, retry.Transient},
	}
	for _, tc := range cases {
		if got := retry.Classify(tc.err); got != tc.want {
			b.Fatalf("%s: Classify = %v, want %v", tc.name, got, tc.want)
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				retry.Classify(tc.err)
			}
		})
	}

	files, err := filepath.Glob("../testdata/snapd-golden/*/*.json")
	if err != nil {
		b.Fatal(err)
	}
	var all []error
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			b.Fatal(err)
		}
		var env struct {
			Type   string `json:"type"`
			Status int    `json:"status-code"`
		}
		if json.Unmarshal(body, &env) != nil || env.Type != "error" {
			continue
		}
		path := "/v2/apps"
		if strings.Contains(filepath.Base(f), "snapctl") {
			path = "/v2/snapctl"
		}
		_, err = snapd.Decode("POST", path, env.Status, body)
		var apiErr *snapd.Error
		if !errors.As(err, &apiErr) {
			b.Fatalf("%s: %v", f, err)
		}
		all = append(all, err)
	}
	b.Run("every-golden-error", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			for _, err := range all {
				retry.Classify(err)
			}
		}
		b.ReportMetric(float64(len(all)), "errors/op")
	})
}
