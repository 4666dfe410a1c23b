package snapsvc_test

// Tests of logging (reporting.go): the call's logger, faults logged once.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/retry"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Issue 18: while snapd was unreachable the library logged "snapd
// unavailable; backing off" at Info every 50 ms. The state change is
// logged at Info once, repeats at Debug, and the end at Info with the
// count of repeats.
func TestUnreachableLogsOnceAtInfo(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	clock := &instantClock{}
	clock.onPause = func(n int) {
		if n == 30 {
			if err := srv.StartListening(); err != nil {
				t.Error(err)
			}
		}
	}
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	c := newClient(t, srv, snapsvc.WithClock(clock), snapsvc.WithLogger(logger))
	if _, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if n := strings.Count(out, "snapd unavailable"); n != 1 {
		t.Errorf("%d Info lines 'snapd unavailable' for one outage:\n%s", n, out)
	}
	if !strings.Contains(out, "no longer unable to reach snapd") || !strings.Contains(out, "repeats_logged_at_debug=") {
		t.Errorf("the outage's end and its repeats are not logged at Info:\n%s", out)
	}
}

// Issue 29: a call that simply timed out while snapd was unreachable
// logged "no longer unable to reach snapd", as if snapd had come back.
// It logs that it ended while unable to reach it.
func TestUnreachableToTheEndNotLoggedAsOver(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithoutListening())
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p := retry.DefaultPolicy()
	p.MaxUnreachable = 100 * time.Millisecond
	c := newClient(t, srv, snapsvc.WithLogger(logger), snapsvc.WithPolicy(p))
	if _, err := c.Start(ctxT(t), []string{"k8s.kubelet"}, snapsvc.StartOptions{}); !errors.Is(err, snapsvc.ErrGaveUp) {
		t.Fatalf("Start against a snapd that never comes: %v", err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if strings.Contains(out, "no longer unable to reach snapd") || !strings.Contains(out, "ended while unable to reach snapd") {
		t.Errorf("the log says the outage ended:\n%s", out)
	}
}

// lineSink collects funcr's formatted lines.
type lineSink struct {
	mu    sync.Mutex
	lines []string
}

// logrLogger is a logr logger writing to sink. logr.ToSlogHandler maps
// slog's levels to V-levels by negating them, so slog.LevelDebug (-4) is
// V(4): the verbosity that shows snapsvc's debug lines.
func logrLogger(sink *lineSink) logr.Logger {
	return funcr.New(sink.write, funcr.Options{Verbosity: 4})
}

// fromLogr is the WithContextLogger function a logr user (k8sd) plugs in.
func fromLogr(ctx context.Context) *slog.Logger {
	l, err := logr.FromContext(ctx)
	if err != nil {
		return nil
	}
	return slog.New(logr.ToSlogHandler(l))
}

func TestContextLoggerCarriesRequestValues(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
		{Name: "kube-proxy", Daemon: "simple", Enabled: true, Active: true},
	}}))
	clientLog := newLogWatch()
	c := newClient(t, srv, snapsvc.WithLogger(clientLog.logger()), snapsvc.WithContextLogger(fromLogr))

	// Two reconciles with their own request values, concurrently (on
	// different services, so neither merges into the other's restart).
	sinks := map[string]*lineSink{"kubelet": {}, "kube-proxy": {}}
	var wg sync.WaitGroup
	for name, sink := range sinks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := logr.NewContext(context.Background(), logrLogger(sink).WithValues("controller", name))
			if _, err := c.Restart(ctx, []string{"k8s." + name}, snapsvc.RestartOptions{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for name, sink := range sinks {
		lines := sink.all()
		if len(lines) == 0 {
			t.Fatalf("%s: no lines through logr", name)
		}
		done := false
		for _, l := range lines {
			if !strings.Contains(l, fmt.Sprintf(`"controller"=%q`, name)) {
				t.Errorf("%s: line without the request's value: %s", name, l)
			}
			if strings.Contains(l, `"msg"="change done"`) && strings.Contains(l, `"change"=`) {
				done = true
			}
		}
		if !done {
			t.Errorf("%s: no 'change done' line naming the change: %q", name, lines)
		}
	}
	if got := clientLog.all(); len(got) != 0 {
		t.Errorf("the client's own logger got lines meant for the calls' loggers: %q", got)
	}

	// Without a logger in the context the client's own logger is used.
	if _, err := c.Restart(context.Background(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	if len(clientLog.all()) == 0 {
		t.Fatal("no line on the client's logger for a context without one")
	}
}

func TestContextWithLoggerWins(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple"},
	}}))
	viaFunc := &lineSink{}
	c := newClient(t, srv, snapsvc.WithContextLogger(func(context.Context) *slog.Logger {
		return slog.New(logr.ToSlogHandler(logrLogger(viaFunc)))
	}))
	explicit := newLogWatch()
	ctx := snapsvc.ContextWithLogger(context.Background(), explicit.logger().With("request", "r1"))
	if _, err := c.Start(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{Enable: true}); err != nil {
		t.Fatal(err)
	}
	lines := explicit.all()
	if len(lines) == 0 || len(viaFunc.all()) != 0 {
		t.Fatalf("ContextWithLogger lines %q, WithContextLogger lines %q: the context's logger must win", lines, viaFunc.all())
	}
	for _, l := range lines {
		if !strings.Contains(l, "request=r1") {
			t.Errorf("line without the logger's attributes: %s", l)
		}
	}
	if snapsvc.ContextWithLogger(ctx, nil) != ctx {
		t.Error("a nil logger changed the context")
	}
}

func (s *lineSink) write(prefix, args string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lines = append(s.lines, prefix+" "+args)
}

func (s *lineSink) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.lines...)
}

// dupCheck is a slog handler that keeps every record as its message and
// the keys it carries (the logger's With attributes and the record's), and
// the keys that appear twice on one line.
type dupCheck struct {
	mu    *sync.Mutex
	lines *[]string
	dups  *[]string
	with  []string
}

func newDupCheck() dupCheck {
	return dupCheck{mu: &sync.Mutex{}, lines: new([]string), dups: new([]string)}
}

func (d dupCheck) Enabled(context.Context, slog.Level) bool { return true }
func (d dupCheck) WithGroup(string) slog.Handler            { return d }
func (d dupCheck) WithAttrs(as []slog.Attr) slog.Handler {
	with := slices.Clone(d.with)
	for _, a := range as {
		with = append(with, a.Key)
	}
	d.with = with
	return d
}
func (d dupCheck) Handle(_ context.Context, r slog.Record) error {
	keys := slices.Clone(d.with)
	r.Attrs(func(a slog.Attr) bool { keys = append(keys, a.Key); return true })
	d.mu.Lock()
	defer d.mu.Unlock()
	*d.lines = append(*d.lines, r.Message)
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			*d.dups = append(*d.dups, fmt.Sprintf("%q: %s twice (%v)", r.Message, k, keys))
		}
		seen[k] = true
	}
	return nil
}

func (d dupCheck) saw(msg string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.ContainsFunc(*d.lines, func(l string) bool { return strings.Contains(l, msg) })
}

// Issue 44, item 3: "watching the snap for the machine's processes" said
// snap=svcdemo twice, the operation's logger carrying it already (as
// "pacing restart" did names). No line of an operation repeats a key.
func TestLogLinesRepeatNoAttribute(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)))
	d := newDupCheck()
	c := newClient(t, srv, snapsvc.WithLogger(slog.New(d)), snapsvc.WithLockDir(t.TempDir()),
		snapsvc.WithMinRestartInterval(50*time.Millisecond), snapsvc.WithPollInterval(time.Millisecond))
	ctx := ctxT(t)
	// A conflict waited out, this process the machine's watcher of the snap.
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	out := make(chan restartOutcome, 1)
	restartAsync(c, ctx, out, "k8s.kubelet")
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Conflicts() > 0 }); err != nil {
		t.Fatal(err)
	}
	foreign.Finish()
	if o := recvT(t, out); o.err != nil {
		t.Fatal(o.err)
	}
	// A second restart at once is paced.
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"watching the snap for the machine's processes", "pacing restart", "conflict; "} {
		if !d.saw(msg) {
			t.Errorf("no line %q: the case did not run", msg)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, dup := range *d.dups {
		t.Error(dup)
	}
}
