package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// lockedBuffer is a bytes.Buffer safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func runInProcess(t *testing.T, terminal bool, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr lockedBuffer
	code := run(context.Background(), args, env{stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }, terminal: terminal})
	return code, stdout.String(), stderr.String()
}

// TestDemoInProcess runs the demo in this process and checks its report
// and that it leaves no goroutine behind.
func TestDemoInProcess(t *testing.T) {
	defer goleak.VerifyNone(t)
	code, out, errOut := runInProcess(t, false, "demo", "--json", "--scale", "0.02")
	if code != 0 {
		t.Fatalf("demo exited %d: %s\n%s", code, errOut, out)
	}
	var rep demoReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("demo --json: %v\n%s", err, out)
	}
	if !rep.OK || rep.Conflicts != 1 || rep.ConflictsBetweenOurOwn != 0 || !rep.ForeignWaitedOut {
		t.Errorf("demo outcome: %+v", rep)
	}
	var kinds []string
	for _, c := range rep.Changes {
		if c.Status != "Done" {
			t.Errorf("change %s %s is %s", c.ID, c.Kind, c.Status)
		}
		kinds = append(kinds, c.ID+":"+c.Kind+":"+c.By)
	}
	want := "1:configure-snap:snap set 2:service-control:k8sd bootstrap 3:service-control:k8sd bootstrap 4:service-control:controller"
	if got := strings.Join(kinds, " "); got != want {
		t.Errorf("changes %q, want %q", got, want)
	}
	for _, s := range rep.Services {
		if !s.Active || !s.Enabled {
			t.Errorf("service %s not enabled and active: %+v", s.FullName(), s)
		}
	}
	if rep.Elapsed <= 0 || rep.Elapsed > 10 {
		t.Errorf("demo took %v", rep.Elapsed)
	}
}

// TestDemoVerbose checks that -v adds the library's slog lines on stderr.
func TestDemoVerbose(t *testing.T) {
	defer goleak.VerifyNone(t)
	code, out, errOut := runInProcess(t, false, "-v", "demo", "--scale", "0")
	if code != 0 {
		t.Fatalf("demo exited %d: %s\n%s", code, errOut, out)
	}
	for _, want := range []string{`level=INFO msg="change created" client=controller`, "conflict; waiting for blocking changes"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
}

// TestProgress checks the terminal line (drawn as wide as the terminal,
// erased) and the lines without a terminal (at once for another's change,
// then every quietEvery), on a manual clock.
func TestProgress(t *testing.T) {
	defer goleak.VerifyNone(t)
	var buf lockedBuffer
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := newProgress(&buf, true, func() int { return 40 }, 0, false)
	p.close() // drive ticks by hand
	p.now = func() time.Time { return now }
	p.begin("restart k8s.kubelet")
	p.waitFor("12", "configure-snap")
	now = now.Add(3 * time.Second)
	p.tickLocked()
	p.end()
	got := buf.String()
	if !strings.Contains(got, " change 12 (configure-snap) running, …\r") {
		t.Errorf("line not cut at the terminal's 40 columns: %q", got)
	}
	if !strings.HasSuffix(got, "\r\033[K") {
		t.Errorf("line not erased at the end: %q", got)
	}

	var plain lockedBuffer
	q := newProgress(&plain, false, nil, 10*time.Second, false)
	q.close()
	q.now = func() time.Time { return now }
	q.begin("restart k8s.kubelet")
	q.kind = "configure-snap"
	q.blocked("42")
	q.kind = "configure-snap"
	for range 25 {
		now = now.Add(time.Second)
		q.tickLocked()
	}
	want := "restart k8s.kubelet: waiting for change 42 that holds the snap\n" +
		"restart k8s.kubelet: still waiting for change 42 (configure-snap) that holds the snap, 10s\n" +
		"restart k8s.kubelet: still waiting for change 42 (configure-snap) that holds the snap, 20s\n"
	if plain.String() != want {
		t.Errorf("without a terminal:\n%s\nwant\n%s", plain.String(), want)
	}
}

// TestReadableHandler checks how library log lines are rendered.
func TestReadableHandler(t *testing.T) {
	var lines []string
	h := &readableHandler{ops: &sync.Map{}, sink: func(_, line string) { lines = append(lines, line) }}
	log := slog.New(h)
	log.With("snap", "k8s", "action", "restart", "names", "k8s.kubelet").Info("change created", "change", "4", "attempt", 1)
	log.Info("change done", "change", "4", "action", "restart")
	log.Debug("dropped")
	want := []string{
		"restart k8s.kubelet: change created (change 4, attempt 1)",
		"restart k8s.kubelet: change done (change 4)",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

// TestDescribeChange checks the progress text for a change in progress.
func TestDescribeChange(t *testing.T) {
	chg := &snapsvc.Change{ID: "5", Kind: "service-control", Status: "Doing", Summary: "Running service command",
		Tasks: []snapsvc.Task{
			{ID: "9", Status: "Done", Summary: "Run service command \"stop\" for services [\"a\"] of snap \"k8s\""},
			{ID: "10", Status: "Doing", Summary: "Run service command \"stop\" for services [\"kubelet\"] of snap \"k8s\"",
				Log: []string{"2026-01-02T03:04:05Z INFO Waiting for \"snap.k8s.kubelet.service\" to stop."}},
			{ID: "11", Status: "Do", Summary: "later"},
		}}
	want := `change 5 (service-control) Doing: Run service command "stop" for services ["kubelet"] of snap "k8s" — INFO Waiting for "snap.k8s.kubelet.service" to stop.`
	if got := describeChange(chg); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	chg.Status, chg.Ready = "Done", true
	if got := describeChange(chg); got != "change 5 (service-control) Done: Running service command" {
		t.Errorf("ready change: %s", got)
	}
	if got := logText("no timestamp here"); got != "no timestamp here" {
		t.Errorf("logText: %q", got)
	}
}
