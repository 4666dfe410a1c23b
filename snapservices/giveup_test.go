package snapservices_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// retryFor is k8sd's control.RetryFor as it is (pkg/utils/control): up to
// retryCount calls, each failure followed by delay, whatever the call took.
func retryFor(ctx context.Context, retryCount int, delay time.Duration, f func() error) error {
	var err error
	for i := 0; i < retryCount; i++ {
		if err = f(); err != nil {
			select {
			case <-ctx.Done():
				return context.Canceled
			case <-time.After(delay):
				continue
			}
		}
		break
	}
	return err
}

// Issue 36: WithGiveUp(0) makes one attempt, so a call inside k8sd's
// RetryFor kept as it is fails at once on a change that holds the snap
// (retryable) and the loop's own pauses are the wait; a snap not held is
// acted on; the call's own change is waited for whatever WithGiveUp says.
func TestGiveUpZeroIsOneAttempt(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnapApps(500*time.Millisecond)))
	s := newREST(t, srv, snapservices.WithGiveUp(0))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	err := s.RestartServices(ctx, []string{"kubelet"})
	var oe *snapsvc.OpError
	if !errors.As(err, &oe) || !oe.Retryable() || !strings.Contains(err.Error(), `"configure-snap" change in progress`) {
		t.Fatalf("held: %v, want a retryable conflict", err)
	}
	if n := srv.Counters().Requests["POST /v2/apps"]; n != 1 {
		t.Errorf("held: %d POST /v2/apps, want 1 (one attempt)", n)
	}
	held.Finish()
	// A 500 ms start is waited for: the bound is before snapd accepts.
	if err := s.StartServices(ctx, []string{"kubelet"}); err != nil {
		t.Fatalf("free: %v", err)
	}
	if st, _ := srv.Service("k8s", "kubelet"); !st.Active {
		t.Errorf("kubelet %+v, want active", st)
	}
}

// WithGiveUp(d) bounds the wait for a change that never ends to d, and
// says what held the snap.
func TestGiveUpBoundsTheWait(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnapApps(0)))
	s := newREST(t, srv, snapservices.WithGiveUp(300*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	start := time.Now()
	err := s.RestartServices(ctx, []string{"kubelet"})
	took := time.Since(start)
	var oe *snapsvc.OpError
	if !errors.As(err, &oe) || !oe.Retryable() || !errors.Is(err, snapsvc.ErrGaveUp) {
		t.Fatalf("%v, want a retryable give-up", err)
	}
	// Not before the bound; the upper margin is the safety net's, for a
	// loaded machine (the contract is "about d", not a benchmark).
	if took < 300*time.Millisecond || took > 20*time.Second {
		t.Errorf("gave up after %v, want about 300ms", took)
	}
}

// WithLogLines hands one line per action, as text, to a logger that
// takes lines: the message, then the services, the change and the time.
func TestLogLines(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnapApps(0)))
	var mu sync.Mutex
	var lines []string
	s := newREST(t, srv, snapservices.WithLogLines(func(l string) {
		mu.Lock()
		lines = append(lines, l)
		mu.Unlock()
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.RestartServices(ctx, []string{"kubelet"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RestartServices(ctx, []string{"nosuch"}); err == nil {
		t.Fatal("nosuch restarted")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "restarted services services=k8s.kubelet change=") ||
		!strings.Contains(lines[0], " elapsed=") || !strings.HasPrefix(lines[1], "cannot restart services services=k8s.nosuch ") {
		t.Errorf("lines %q, want one per action", lines)
	}
}

// k8sSnapApps is a k8s snap whose kubelet takes start to start.
func k8sSnapApps(start time.Duration) fake.Snap {
	return fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", StartDuration: start},
		{Name: "k8sd", Daemon: "simple", Enabled: true, Active: true},
	}}
}

// TestAdopterRecipesWorstCase measures each recipe of docs/ as written,
// against the fake with a change that never ends holding the snap: how
// long the caller waits before its call fails, how many requests reach
// snapd, and how many lines reach the adopter's own logger. It is a
// measurement, not part of the suite: SNAPSVC_MEASURE_ADOPTERS=1 runs it
// (about 35 s of wall time, the cases in parallel), and the figures are
// in docs/*.md.
func TestAdopterRecipesWorstCase(t *testing.T) {
	if os.Getenv("SNAPSVC_MEASURE_ADOPTERS") == "" {
		t.Skip("a measurement: SNAPSVC_MEASURE_ADOPTERS=1")
	}
	type recipe struct {
		name, snap string
		strict     bool // snapctl mode, without snap-refresh-observe
		opts       func(logLine func(string)) []snapservices.Option
		call       func(ctx context.Context, s *snapservices.Snap) error
		ctx        time.Duration // the caller's own deadline (0: none)
	}
	recipes := []recipe{
		{name: "k8sd, one-file port, RetryFor kept", snap: "k8s",
			opts: func(logLine func(string)) []snapservices.Option {
				// docs/k8sd.md: NewSnap's options; logr from the context is
				// k8sd's, given here as the lines' sink.
				return []snapservices.Option{snapservices.WithInstance("k8s"), snapservices.WithDefaultInstance("k8s"),
					snapservices.WithGiveUp(0), snapservices.WithLogLines(logLine)}
			},
			call: func(ctx context.Context, s *snapservices.Snap) error {
				return retryFor(ctx, 5, 5*time.Second, func() error { return s.StartServices(ctx, []string{"kubelet"}) })
			}},
		{name: "microk8s-cluster-agent, classic, /configure handler", snap: "microk8s", ctx: 240 * time.Second,
			opts: func(logLine func(string)) []snapservices.Option {
				return []snapservices.Option{snapservices.SnapctlStyle(), snapservices.WithInstance("microk8s"),
					snapservices.WithClientOptions(snapsvc.WithMode(snapsvc.ModeREST)),
					snapservices.WithGiveUp(30 * time.Second), snapservices.WithLogLines(logLine)}
			},
			call: func(ctx context.Context, s *snapservices.Snap) error {
				return s.RestartServices(ctx, []string{"microk8s.daemon-kubelite"})
			}},
		{name: "microk8s-cluster-agent, strict, /configure handler", snap: "microk8s", strict: true, ctx: 240 * time.Second,
			opts: func(logLine func(string)) []snapservices.Option {
				return []snapservices.Option{snapservices.SnapctlStyle(), snapservices.WithInstance("microk8s"), snapservices.WithSnapctl(),
					snapservices.WithGiveUp(30 * time.Second), snapservices.WithLogLines(logLine)}
			},
			call: func(ctx context.Context, s *snapservices.Snap) error {
				return s.RestartServices(ctx, []string{"microk8s.daemon-kubelite"})
			}},
		{name: "microovn, service API handler", snap: "microovn", strict: true,
			opts: func(logLine func(string)) []snapservices.Option {
				return []snapservices.Option{snapservices.SnapctlStyle(), snapservices.WithInstance("microovn"), snapservices.WithSnapctl(),
					snapservices.WithGiveUp(30 * time.Second), snapservices.WithLogLines(logLine)}
			},
			call: func(ctx context.Context, s *snapservices.Snap) error {
				return s.RestartServices(ctx, []string{"microovn.ovn-northd"})
			}},
		{name: "microceph, hook or API handler", snap: "microceph", strict: true,
			opts: func(logLine func(string)) []snapservices.Option {
				return []snapservices.Option{snapservices.SnapctlStyle(), snapservices.WithInstance("microceph"), snapservices.WithSnapctl(),
					snapservices.WithGiveUp(30 * time.Second), snapservices.WithLogLines(logLine)}
			},
			call: func(ctx context.Context, s *snapservices.Snap) error {
				return s.RestartServices(ctx, []string{"microceph.rgw"})
			}},
	}
	var mu sync.Mutex
	var table []string
	for _, r := range recipes {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			app := strings.TrimPrefix(map[string]string{"k8s": "kubelet", "microk8s": "daemon-kubelite", "microovn": "ovn-northd", "microceph": "rgw"}[r.snap], "")
			fopts := []fake.Option{fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: r.snap, Apps: []fake.App{{Name: app, Daemon: "simple", Enabled: true, Active: true}}})}
			if r.strict {
				fopts = append(fopts, fake.WithoutRefreshObserve())
			}
			srv := fake.NewServer(t, fopts...)
			var lines []string
			var lmu sync.Mutex
			opts := append(r.opts(func(l string) { lmu.Lock(); lines = append(lines, l); lmu.Unlock() }),
				snapservices.WithClientOptions(snapsvc.WithSnapSocket(srv.SnapSocketPath()), snapsvc.WithLockDir(filepath.Join(t.TempDir(), "locks"))))
			if r.strict {
				// A strict snap reaches the snap socket only, with its
				// cookie, and (WithoutRefreshObserve) reads no changes.
				opts = append(opts, snapservices.WithClientOptions(snapsvc.WithCookie(srv.Cookie(r.snap))))
			} else {
				opts = append(opts, snapservices.WithClientOptions(snapsvc.WithSocket(srv.SocketPath())))
			}
			s, err := snapservices.New(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: r.snap}) // never ends
			ctx := context.Background()
			if r.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, r.ctx)
				defer cancel()
			}
			start := time.Now()
			err = r.call(ctx, s)
			took := time.Since(start)
			if err == nil || !retry.IsRetryable(err) && !errors.Is(err, snapsvc.ErrGaveUp) {
				t.Errorf("%v, want a retryable failure", err)
			}
			reqs := len(srv.Requests())
			lmu.Lock()
			n := len(lines)
			last := ""
			if n > 0 {
				last = lines[n-1]
			}
			lmu.Unlock()
			mu.Lock()
			table = append(table, fmt.Sprintf("| %s | %.1f s | %d | %d | %.160s |", r.name, took.Seconds(), reqs, n, last))
			mu.Unlock()
		})
	}
	t.Cleanup(func() {
		fmt.Println("| recipe | gave up after | requests | log lines | last line |")
		for _, row := range table {
			fmt.Println(row)
		}
	})
}
