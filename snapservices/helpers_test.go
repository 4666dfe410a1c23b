package snapservices_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapservices"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newREST builds a handle for snap k8s on srv in the default (REST) mode.
func newREST(t *testing.T, srv *fake.Server, opts ...snapservices.Option) *snapservices.Snap {
	t.Helper()
	base := []snapservices.Option{snapservices.WithInstance("k8s"),
		snapservices.WithSocket(srv.SocketPath()), snapservices.WithSnapSocket(srv.SnapSocketPath())}
	s, err := snapservices.New(append(base, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// postedNames returns the names of every POST /v2/apps the fake received.
func postedNames(t *testing.T, srv *fake.Server) [][]string {
	t.Helper()
	var out [][]string
	for _, r := range srv.Requests() {
		if r.Method != "POST" || r.Path != "/v2/apps" {
			continue
		}
		var body struct {
			Names []string `json:"names"`
		}
		if err := json.Unmarshal([]byte(r.Body), &body); err != nil {
			t.Fatalf("POST /v2/apps body %q: %v", r.Body, err)
		}
		out = append(out, body.Names)
	}
	return out
}

// slogTo is a text slog.Logger at Info writing to b under mu.
func slogTo(mu *sync.Mutex, b *strings.Builder) *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{mu, b}, nil))
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
