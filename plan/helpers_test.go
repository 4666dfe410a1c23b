package plan_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC)

// k8sSnap is a Kubernetes-like snap freshly installed: every service
// inactive and disabled (install-mode: disable).
func k8sSnap() fake.Snap {
	var apps []fake.App
	for _, n := range []string{"containerd", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"} {
		apps = append(apps, fake.App{Name: n, Daemon: "simple"})
	}
	apps = append(apps, fake.App{Name: "k8s"}) // CLI
	return fake.Snap{Name: "k8s", Apps: apps}
}

func newClient(t *testing.T, srv *fake.Server) *snapsvc.Client {
	t.Helper()
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// readyz is an apiserver-like /readyz endpoint that fails until Up.
type readyz struct {
	*httptest.Server
	up    atomic.Bool
	calls atomic.Int32
}

func newReadyz(t *testing.T) *readyz {
	r := &readyz{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.calls.Add(1)
		if req.URL.Path != "/readyz" || !r.up.Load() {
			http.Error(w, "[-]etcd failed: reason withheld", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok"))
	}))
	t.Cleanup(r.Close)
	return r
}

// tcpListener accepts and closes connections on 127.0.0.1 until the test
// ends.
func tcpListener(t *testing.T) string {
	addr, _ := testnet.AcceptAndClose(t)
	return addr
}

// appsPosts returns the names of each POST /v2/apps, in order.
func appsPosts(srv *fake.Server) []string {
	var out []string
	for _, r := range srv.Requests() {
		if r.Method == "POST" && r.Path == "/v2/apps" {
			out = append(out, r.Body)
		}
	}
	return out
}
