// Package conformance replays responses captured from a real snapd (the
// golden cases in testdata/) against a snapd-like target — the in-process
// fake (fake.Server) or a real snapd — and compares the bodies structurally.
//
// The same runner serves both: a Target says where the sockets are, which
// cookie the test snap has, and how to wait for things (the fake advances its
// manual clock, a real snapd is polled).
package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// GoldenDir returns the directory of the golden cases captured from snapd
// version (e.g. "2.57.6"), for callers outside this package's directory.
func GoldenDir(version string) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata", version)
}

// Target is a snapd to run the conformance cases against. The snap under
// test must be "svcdemo" as described in testdata/README.md.
type Target interface {
	// MainSocket is the path of snapd.socket.
	MainSocket() string
	// SnapSocket is the path of snapd-snap.socket.
	SnapSocket() string
	// Cookie is svcdemo's ephemeral context id (/var/lib/snapd/cookie/snap.svcdemo).
	Cookie() string
	// WaitChangeReady returns once change id is ready. A real snapd is
	// polled; the fake advances its clock.
	WaitChangeReady(ctx context.Context, id string) error
	// Await returns once done is closed, moving simulated time on meanwhile
	// if the target has any (done is closed by a request in flight, e.g. a
	// snapctl stop that answers only when its change is ready).
	Await(ctx context.Context, done <-chan struct{}) error
	// WaitInProgress returns once at least one change is in progress.
	WaitInProgress(ctx context.Context) error
	// Prepare makes the state a later step needs. Steps: "add-broken-app"
	// (svcdemo gains the failing oneshot "broken", disabled and inactive;
	// the 2.57.6 capture installed it only for its last cases) and
	// StepSettle (let SettleDelay pass; see Settled).
	Prepare(ctx context.Context, step string) error
}

// RealTarget is a Target for a real snapd, waiting by polling its API.
type RealTarget struct {
	Main, Snap string // socket paths
	SnapCookie string // svcdemo's cookie
	// PrepareFunc implements Prepare; nil means StepSettle waits
	// SettleDelay and every other step is a no-op.
	PrepareFunc func(ctx context.Context, step string) error
	// PollInterval defaults to 100ms, like `snap`'s own wait loop.
	PollInterval time.Duration
}

// MainSocket implements Target.
func (r *RealTarget) MainSocket() string { return r.Main }

// SnapSocket implements Target.
func (r *RealTarget) SnapSocket() string { return r.Snap }

// Cookie implements Target.
func (r *RealTarget) Cookie() string { return r.SnapCookie }

func (r *RealTarget) interval() time.Duration {
	if r.PollInterval > 0 {
		return r.PollInterval
	}
	return 100 * time.Millisecond
}

// poll calls f every interval until it reports true, an error, or ctx ends.
func (r *RealTarget) poll(ctx context.Context, f func() (bool, error)) error {
	tick := time.NewTicker(r.interval())
	defer tick.Stop()
	for {
		ok, err := f()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// WaitChangeReady implements Target by polling GET /v2/changes/{id}.
func (r *RealTarget) WaitChangeReady(ctx context.Context, id string) error {
	return r.poll(ctx, func() (bool, error) {
		_, body, err := Do(ctx, r.Main, "GET", "/v2/changes/"+id, "")
		if err != nil {
			return false, nil // snapd may be restarting: keep polling
		}
		var env struct {
			Result struct {
				Ready bool `json:"ready"`
			} `json:"result"`
		}
		if err := json.Unmarshal(body, &env); err != nil {
			return false, fmt.Errorf("change %s: %v", id, err)
		}
		return env.Result.Ready, nil
	})
}

// Await implements Target: a real snapd keeps its own time.
func (r *RealTarget) Await(ctx context.Context, done <-chan struct{}) error {
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// WaitInProgress implements Target by polling GET /v2/changes.
func (r *RealTarget) WaitInProgress(ctx context.Context) error {
	return r.poll(ctx, func() (bool, error) {
		_, body, err := Do(ctx, r.Main, "GET", "/v2/changes?select=in-progress", "")
		if err != nil {
			return false, nil
		}
		var env struct {
			Result []json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(body, &env); err != nil {
			return false, err
		}
		return len(env.Result) > 0, nil
	})
}

// Prepare implements Target.
func (r *RealTarget) Prepare(ctx context.Context, step string) error {
	if r.PrepareFunc != nil {
		return r.PrepareFunc(ctx, step)
	}
	if step == StepSettle {
		tm := time.NewTimer(SettleDelay) // a real snapd keeps its own time
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Do sends one HTTP request over a Unix socket and returns the status code
// and the raw body.
func Do(ctx context.Context, socket, method, path, body string) (int, []byte, error) {
	c := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, rd)
	if err != nil {
		return 0, nil, err
	}
	rsp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer rsp.Body.Close()
	b, err := io.ReadAll(rsp.Body)
	return rsp.StatusCode, b, err
}
