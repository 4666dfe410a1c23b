package snapservices_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// logrLines is a logr.Logger at verbosity v that keeps its lines.
type logrLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logrLines) logger(v int) logr.Logger {
	return funcr.New(func(_, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{Verbosity: v})
}

func (l *logrLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// Issue 27, item 8: the snap command's messages ("Started.", "error: ...")
// reached k8sd's output at every call, and after the port nothing did. A
// handle now writes one line per action to the logr.Logger in the call's
// context (k8sd's log.NewContext) at V(0), with the change and the
// conflicts waited out, and the client's own steps one level lower (V(1),
// where k8sd logs "Starting services").
func TestActionsLogThroughTheContextLogger(t *testing.T) {
	srv := k8sServer(t)
	s := newREST(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var v0 logrLines
	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	done := make(chan error, 1)
	go func() { done <- s.RestartServices(logr.NewContext(ctx, v0.logger(0)), []string{"kubelet"}) }()
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Conflicts() > 0 }); err != nil {
		t.Fatal(err)
	}
	held.Finish()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := v0.all()
	if len(lines) != 1 || !strings.Contains(lines[0], `"level"=0 "msg"="restarted services" "services"="k8s.kubelet"`) ||
		!strings.Contains(lines[0], `"change"=`) || !strings.Contains(lines[0], `"conflicts"=1`) {
		t.Fatalf("V(0) lines %q: want one, restarted, with the change and the conflict", lines)
	}

	// At V(1) the client's steps are there too, and none at V(0) but ours.
	var v1 logrLines
	if err := s.StartServices(logr.NewContext(ctx, v1.logger(1)), []string{"containerd"}); err != nil {
		t.Fatal(err)
	}
	lines = v1.all()
	var own, steps int
	for _, l := range lines {
		switch {
		case strings.Contains(l, `"level"=0 "msg"="started services" "services"="k8s.containerd" "flags"="--enable"`):
			own++
		case strings.Contains(l, `"level"=1 `):
			steps++
		default:
			t.Errorf("unexpected line %q", l)
		}
	}
	if own != 1 || steps == 0 {
		t.Fatalf("lines %q: want our line at V(0) and the client's at V(1)", lines)
	}

	// A failure is logged with its error, at V(0).
	var fail logrLines
	err := s.StopServices(logr.NewContext(ctx, fail.logger(0)), []string{"kubelt"})
	if !errors.Is(err, snapsvc.ErrNotFound) {
		t.Fatalf("%v", err)
	}
	if lines := fail.all(); len(lines) != 1 || !strings.Contains(lines[0], `"msg"="cannot stop services"`) || !strings.Contains(lines[0], `"error"=`) {
		t.Fatalf("failure lines %q", lines)
	}

	// snapsvc.ContextWithLogger wins, as for the client's own lines.
	var buf strings.Builder
	var mu sync.Mutex
	sl := slogTo(&mu, &buf)
	if err := s.RestartServices(snapsvc.ContextWithLogger(logr.NewContext(ctx, fail.logger(0)), sl), []string{"kubelet"}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), "msg=\"restarted services\"") || len(fail.all()) != 1 {
		t.Fatalf("slog lines %q; logr lines %q", buf.String(), fail.all())
	}
}
