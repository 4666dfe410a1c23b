package snapd_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// goldenBody is one body captured from real snapd, with the request it
// answered and the result type the client decodes it into.
type goldenBody struct {
	name, file, method, path string
	result                   func() any // nil: envelope only
}

// hotBodies are the answers snapsvc reads on every operation: the 202 of
// POST /v2/apps, a change while it runs and when done, the in-progress
// listing that finds a blocker, notices, a conflict, and a long listing.
var hotBodies = []goldenBody{
	{"async-202", "2.57.6/post-restart-snap.json", "POST", "/v2/apps", nil},
	{"conflict-400", "2.57.6/conflict-restart-alpha.json", "POST", "/v2/apps", nil},
	{"change-doing", "2.57.6/change-stop-gamma-doing.json", "GET", "/v2/changes/8", func() any { return new(snapd.Change) }},
	{"change-done-2.77", "2.77.1/change-start-alpha-done.json", "GET", "/v2/changes/5", func() any { return new(snapd.Change) }},
	{"changes-in-progress", "2.77.1/changes-in-progress.json", "GET", "/v2/changes", func() any { return new([]snapd.Change) }},
	{"changes-final-9KB", "2.57.6/changes-final.json", "GET", "/v2/changes", func() any { return new([]snapd.Change) }},
	{"notices-2.68", "2.68.3/notices-change-update.json", "GET", "/v2/notices", func() any { return new([]snapd.Notice) }},
	{"apps", "2.57.6/apps-snap.json", "GET", "/v2/apps", func() any { return new([]snapd.AppInfo) }},
}

func readGolden(b *testing.B, g goldenBody) ([]byte, int) {
	b.Helper()
	body, err := os.ReadFile(filepath.Join("..", "..", "testdata", "snapd-golden", g.file))
	if err != nil {
		b.Fatal(err)
	}
	var env struct {
		Status int `json:"status-code"`
	}
	if err := json.Unmarshal(body, &env); err != nil || env.Status == 0 {
		b.Fatalf("%s: no status-code: %v", g.file, err)
	}
	return body, env.Status
}

// BenchmarkDecode measures decoding snapd's envelope (Decode) and, for
// bodies the client reads a result from, the envelope plus its result,
// on bodies captured from real snapd. Run with -benchmem.
func BenchmarkDecode(b *testing.B) {
	for _, g := range hotBodies {
		body, status := readGolden(b, g)
		wantErr := status >= 400
		b.Run("envelope/"+g.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				if _, err := snapd.Decode(g.method, g.path, status, body); (err != nil) != wantErr {
					b.Fatalf("Decode: %v", err)
				}
			}
		})
		if g.result == nil {
			continue
		}
		b.Run("result/"+g.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for i := 0; i < b.N; i++ {
				rsp, err := snapd.Decode(g.method, g.path, status, body)
				if err != nil {
					b.Fatal(err)
				}
				if err := json.Unmarshal(rsp.Result, g.result()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
