package snapservices_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapservices/snapservicestest"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// appsPost is one POST /v2/apps body.
type appsPost struct {
	Action  string   `json:"action"`
	Names   []string `json:"names"`
	Enable  bool     `json:"enable"`
	Disable bool     `json:"disable"`
}

func posts(t *testing.T, srv *fake.Server) []appsPost {
	t.Helper()
	var out []appsPost
	for _, r := range srv.Requests() {
		if r.Method != "POST" || r.Path != "/v2/apps" {
			continue
		}
		var p appsPost
		if err := json.Unmarshal([]byte(r.Body), &p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

func k8sServer(t *testing.T) *fake.Server {
	return fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "k8sd", Daemon: "simple", Enabled: true, Active: true},
		{Name: "containerd", Daemon: "simple"},
		{Name: "kubelet", Daemon: "simple"},
	}}))
}

// k8sd's StartServices always enables and StopServices always disables
// (pkg/snap/snap.go); names may be bare or prefixed, and "k8s" is the
// whole snap (pkg/snap/service.go). A straight replacement keeps all of it.
func TestK8sdContract(t *testing.T) {
	srv := k8sServer(t)
	s := newREST(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.StartServices(ctx, []string{"k8s.containerd", "kubelet"}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"containerd", "kubelet"} {
		if st, _ := srv.Service("k8s", name); !st.Enabled || !st.Active {
			t.Fatalf("after start: k8s.%s %+v, want enabled and active", name, st)
		}
	}
	if err := s.StopServices(ctx, []string{"kubelet"}); err != nil {
		t.Fatal(err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); st.Enabled || st.Active {
		t.Fatalf("after stop: k8s.kubelet %+v, want disabled and inactive", st)
	}
	if err := s.RestartServices(ctx, []string{"k8s"}); err != nil {
		t.Fatal(err)
	}
	want := []appsPost{
		{Action: "start", Names: []string{"k8s.containerd", "k8s.kubelet"}, Enable: true},
		{Action: "stop", Names: []string{"k8s.kubelet"}, Disable: true},
		{Action: "restart", Names: []string{"k8s"}},
	}
	if got := posts(t, srv); !slices.EqualFunc(got, want, func(a, b appsPost) bool {
		return a.Action == b.Action && slices.Equal(a.Names, b.Names) && a.Enable == b.Enable && a.Disable == b.Disable
	}) {
		t.Fatalf("posted %+v\nwant %+v", got, want)
	}
}

// WithPlainFlags keeps the snap command's meaning: no implied flag.
func TestPlainFlags(t *testing.T) {
	srv := k8sServer(t)
	s := newREST(t, srv, snapservices.WithPlainFlags())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.StartServices(ctx, []string{"kubelet"}); err != nil {
		t.Fatal(err)
	}
	if err := s.StopServices(ctx, []string{"kubelet"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range posts(t, srv) {
		if p.Enable || p.Disable {
			t.Fatalf("plain flags: posted %+v", p)
		}
	}
	if st, _ := srv.Service("k8s", "kubelet"); st.Enabled {
		t.Fatalf("a plain start enabled kubelet: %+v", st)
	}
}

// k8sd's tests of the three methods assert the command line through
// SnapOpts.RunCommand. With WithCommandRunner the same lines reach the same
// runner, so those tests pass unchanged; nothing is sent to snapd.
func TestCommandRunnerSeam(t *testing.T) {
	var got []string
	var failWith error
	run := func(_ context.Context, command []string) error {
		got = append(got, strings.Join(command, " "))
		return failWith
	}
	// No SNAP_INSTANCE_NAME, as in k8sd's unit tests.
	t.Setenv("SNAP_INSTANCE_NAME", "")
	t.Setenv("SNAP_NAME", "")
	s := snapservices.Open(snapservices.WithInstance(""), snapservices.WithDefaultInstance("k8s"), snapservices.WithCommandRunner(run))
	if s.Err() != nil || s.Client() != nil || s.Instance() != "k8s" {
		t.Fatalf("Open: %v, client %v, instance %q", s.Err(), s.Client(), s.Instance())
	}
	ctx := context.Background()
	for _, call := range []func() error{
		func() error { return s.StartServices(ctx, []string{"test-service"}) },
		func() error { return s.StartServices(ctx, []string{"test-service"}, "--no-wait") },
		func() error { return s.StopServices(ctx, []string{"test-service"}) },
		func() error { return s.StopServices(ctx, []string{"test-service"}, "--no-wait") },
		func() error { return s.RestartServices(ctx, []string{"test-service"}) },
		func() error { return s.RestartServices(ctx, []string{"test-service"}, "--no-wait") },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		"snap start k8s.test-service --enable",
		"snap start k8s.test-service --enable --no-wait",
		"snap stop k8s.test-service --disable",
		"snap stop k8s.test-service --disable --no-wait",
		"snap restart k8s.test-service",
		"snap restart k8s.test-service --no-wait",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("commands %q\nwant %q", got, want)
	}
	failWith = errors.New("some error")
	if err := s.StartServices(ctx, []string{"test-service"}); !errors.Is(err, failWith) {
		t.Fatalf("runner's error: %v", err)
	}

	// The Recorder plugs into the same seam and records the same lines.
	rec := snapservicestest.NewRecorder("k8s")
	s = snapservices.Open(snapservices.WithInstance("k8s"), snapservices.WithCommandRunner(rec.Run))
	if err := s.StartServices(ctx, []string{"test-service"}, "--no-wait"); err != nil {
		t.Fatal(err)
	}
	if err := s.RestartServices(ctx, []string{"k8s"}); err != nil {
		t.Fatal(err)
	}
	if got := rec.Commands(); !slices.Equal(got, []string{"snap start k8s.test-service --enable --no-wait", "snap restart k8s"}) {
		t.Fatalf("recorder: %q", got)
	}
	if c := rec.Calls()[0]; c.Action != "start" || !slices.Equal(c.Names, []string{"k8s.test-service"}) {
		t.Fatalf("recorder call %+v", c)
	}
}

// Open has no error path: a setup error comes back from every call, says
// what is wrong and is not retryable.
func TestOpenDefersSetupError(t *testing.T) {
	t.Setenv("SNAP_INSTANCE_NAME", "")
	t.Setenv("SNAP_NAME", "")
	s := snapservices.Open()
	if !errors.Is(s.Err(), snapservices.ErrSetup) {
		t.Fatalf("Err() = %v", s.Err())
	}
	err := s.StartServices(context.Background(), []string{"kubelet"})
	var opErr *snapsvc.OpError
	if !errors.Is(err, snapservices.ErrSetup) || !errors.As(err, &opErr) || opErr.Retryable() ||
		opErr.Op != "start" || !strings.Contains(err.Error(), "SNAP_INSTANCE_NAME") || !strings.Contains(err.Error(), "WithDefaultInstance") {
		t.Fatalf("first call: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = snapservices.Open(snapservices.WithInstance("k8s.kubelet"))
	if err := s.RestartServices(context.Background(), []string{"kubelet"}); !errors.Is(err, snapservices.ErrSetup) || !errors.Is(err, snapsvc.ErrInvalidName) {
		t.Fatalf("bad instance: %v", err)
	}
	// The environment wins over the default; WithInstance over both.
	t.Setenv("SNAP_INSTANCE_NAME", "k8s_dev")
	if s := snapservices.Open(snapservices.WithDefaultInstance("k8s"), snapservices.WithCommandRunner(func(context.Context, []string) error { return nil })); s.Instance() != "k8s_dev" {
		t.Fatalf("instance %q, want k8s_dev from the environment", s.Instance())
	}
	if s := snapservices.Open(snapservices.WithInstance("k8s"), snapservices.WithCommandRunner(func(context.Context, []string) error { return nil })); s.Instance() != "k8s" {
		t.Fatalf("instance %q, want k8s", s.Instance())
	}
}
