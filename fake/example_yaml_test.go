package fake_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)

// A snap built from its snap.yaml, and `snap set` holding it: the
// configure-snap change and its hook block a service command until the
// hook has run.
func ExampleSnapFromYAML() {
	sn, err := fake.SnapFromYAML([]byte(`
name: k8s
version: "1.32"
apps:
  containerd: {daemon: notify, install-mode: disable, before: [kubelet]}
  kubelet: {daemon: simple, install-mode: disable, after: [containerd]}
  k8sd: {daemon: simple}
hooks:
  configure: {}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	sn.ConfigureHookDuration = 2 * time.Second
	clk := fake.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	// AllowNonRoot: examples run as you, and snapd lets only root set a
	// snap's configuration and restart its services.
	s, _ := fake.New(fake.AllowNonRoot(), fake.WithSnaps(sn), fake.WithClock(clk))
	defer s.Close()

	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", s.SocketPath())
		}}}
	send := func(method, path, body string) string {
		req, _ := http.NewRequest(method, "http://localhost"+path, strings.NewReader(body))
		rsp, err := c.Do(req)
		if err != nil {
			return err.Error()
		}
		defer rsp.Body.Close()
		b, _ := io.ReadAll(rsp.Body)
		return string(b)
	}
	fmt.Println(send("PUT", "/v2/snaps/k8s/conf", `{"cluster.name":"one"}`)) // snap set k8s cluster.name=one
	fmt.Println(send("POST", "/v2/apps", `{"action":"restart","names":["k8s.k8sd"]}`))
	s.AdvanceUntilReady(context.Background(), "1")
	fmt.Println(send("GET", "/v2/snaps/k8s/conf?keys=cluster.name", ""))
	// Output:
	// {"type":"async","status-code":202,"status":"Accepted","result":null,"change":"1"}
	// {"type":"error","status-code":400,"status":"Bad Request","result":{"message":"snap \"k8s\" has \"configure-snap\" change in progress"}}
	// {"type":"sync","status-code":200,"status":"OK","result":{"cluster.name":"one"}}
}
