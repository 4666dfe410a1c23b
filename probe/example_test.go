package probe_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/snapsvc/snapsvc/probe"
)

// Wait for an apiserver-like /readyz, checking every 100ms, for at most a
// minute, and requiring two successes in a row.
func ExampleWait() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	defer api.Close()

	err := probe.Wait(context.Background(), &probe.HTTP{URL: api.URL + "/readyz"},
		probe.Options{Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, SuccessThreshold: 2, MaxWait: time.Minute})
	fmt.Println("ready:", err == nil)
	// Output: ready: true
}

// A probe that does not pass in time names itself and its last error.
func ExampleNotReadyError() {
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "[-]etcd failed", http.StatusServiceUnavailable)
	}))
	defer down.Close()

	err := probe.Wait(context.Background(), probe.Func("kube-apiserver /readyz", func(ctx context.Context) error {
		return (&probe.HTTP{URL: down.URL + "/readyz"}).Check(ctx)
	}), probe.Options{MaxWait: time.Nanosecond}) // one check only
	var nr *probe.NotReadyError
	if errors.As(err, &nr) {
		fmt.Printf("%s: %d check(s); last error: %v\n", nr.Probe, nr.Checks, nr.Last)
	}
	// Output: kube-apiserver /readyz: 1 check(s); last error: status 503 Service Unavailable (want 2xx): "[-]etcd failed"
}
