package fake_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/snapsvc/snapsvc/fake"
)

// snapctl is "the user's code": what a hook or daemon inside the snap runs
// (here through the REST API directly, as the snapctl binary does).
func snapctl(socket, cookie string, args ...string) string {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		}}}
	body, _ := json.Marshal(map[string]any{"context-id": cookie, "args": args})
	rsp, err := c.Post("http://localhost/v2/snapctl", "application/json", bytes.NewReader(body))
	if err != nil {
		return err.Error()
	}
	defer rsp.Body.Close()
	b, _ := io.ReadAll(rsp.Body)
	return string(b)
}

// A configure hook that restarts its service: from the configure hook the
// restart is queued and happens once the hook has finished.
func Example() {
	// in a test: s := fake.NewServer(t, ...) closes itself at the end.
	// AllowNonRoot: examples run as you, and snapctl lets only root (a
	// hook runs as root) start services.
	s, _ := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true},
	}}))
	defer s.Close()

	hook := s.StartHook("k8s", "configure")
	fmt.Println(snapctl(s.SnapSocketPath(), hook.Cookie(), "start", "k8s.kubelet"))
	st, _ := s.Service("k8s", "kubelet")
	fmt.Println("active during the hook:", st.Active)
	hook.Finish()
	st, _ = s.Service("k8s", "kubelet")
	fmt.Println("active after the hook:", st.Active)
	// Output:
	// {"type":"sync","status-code":200,"status":"OK","result":{"stdout":"","stderr":""}}
	// active during the hook: false
	// active after the hook: true
}
