package snapsvc_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// countingTransport counts the requests it passes on; otelhttp.NewTransport
// wraps the same way.
type countingTransport struct {
	next http.RoundTripper
	n    *atomic.Int64
}

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.n.Add(1)
	return t.next.RoundTrip(r)
}

// ExampleWithTransport wraps the transport that dials snapd's socket.
func ExampleWithTransport() {
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "web", Apps: []fake.App{{Name: "server", Daemon: "simple"}}}))
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	var n atomic.Int64
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithoutFileLock(),
		snapsvc.WithTransport(func(base http.RoundTripper) http.RoundTripper {
			return countingTransport{next: base, n: &n}
		}))
	if err != nil {
		panic(err)
	}
	defer c.Close()
	svcs, err := c.Services(context.Background(), "web")
	if err != nil {
		panic(err)
	}
	fmt.Println(len(svcs), "service;", n.Load(), "request through the wrapped transport")
	// Output: 1 service; 1 request through the wrapped transport
}
