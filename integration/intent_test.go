//go:build realsnapd

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// A process that asked for a restart WithIntents is killed (SIGKILL, by
// itself, at an exact point) on real snapd; a process started after it
// replays the intent. Judged from snapd's own change list: one restart
// change for one restart asked, whatever the point.

const intentWorkerEnv = "SNAPSVC_INTEGRATION_INTENT_WORKER"

type intentWorker struct {
	Socket, LockDir string
	KillAt          string // "request-out" (snapd never read it) or "answered" (snapd acted and answered, unread)
	Replay          bool
}

func TestMain(m *testing.M) {
	if raw := os.Getenv(intentWorkerEnv); raw != "" {
		os.Exit(runIntentWorker(raw))
	}
	os.Exit(m.Run())
}

func runIntentWorker(raw string) int {
	var spec intentWorker
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	kill := func(point string) {
		if point == spec.KillAt {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
	c, err := snapsvc.New(snapsvc.WithSocket(spec.Socket), snapsvc.WithMode(snapsvc.ModeREST), snapsvc.WithLockDir(spec.LockDir), snapsvc.WithIntents(),
		snapsvc.WithTransport(func(rt http.RoundTripper) http.RoundTripper { return killAround{rt: rt, point: kill} }))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if spec.Replay {
		rs, err := c.Startup(ctx)
		json.NewEncoder(os.Stdout).Encode(map[string]any{"replayed": rs, "error": fmt.Sprint(err)})
		return 0
	}
	_, err = c.Restart(ctx, []string{"svcdemo.alpha"}, snapsvc.RestartOptions{})
	fmt.Fprintln(os.Stderr, "restart returned:", err)
	return 0
}

// killAround calls point before and after a POST /v2/apps.
type killAround struct {
	rt    http.RoundTripper
	point func(string)
}

func (k killAround) RoundTrip(r *http.Request) (*http.Response, error) {
	acting := r.Method == http.MethodPost && r.URL.Path == "/v2/apps"
	if acting {
		k.point("request-out")
	}
	resp, err := k.rt.RoundTrip(r)
	if acting && err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		if rerr == nil {
			k.point("answered")
		}
	}
	return resp, err
}

func TestIntentKilledProcessRestartsOnce(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	for _, at := range []string{"request-out", "answered"} {
		t.Run(at, func(t *testing.T) {
			w.ensureBaseline(t)
			dir := t.TempDir()
			before := maxChangeID(t, w)
			spec := intentWorker{Socket: e.Socket, LockDir: dir, KillAt: at}
			if _, killed := runIntentProc(t, spec); !killed {
				t.Fatal("the worker was not killed")
			}
			made := restartsAfter(t, w, before)
			want := map[string]int{"request-out": 0, "answered": 1}[at]
			if len(made) != want {
				t.Fatalf("killed at %s: %d restart changes %v before the replay, want %d", at, len(made), made, want)
			}
			spec.Replay, spec.KillAt = true, ""
			out, _ := runIntentProc(t, spec)
			w.waitIdle(t)
			made = restartsAfter(t, w, before)
			if len(made) != 1 {
				t.Fatalf("killed at %s: %d restart changes %v after the replay (%s), want 1", at, len(made), made, out)
			}
			if a := w.apps(t, "svcdemo")["alpha"]; !a.Active {
				t.Fatalf("alpha not active after the replayed restart")
			}
			t.Logf("killed at %s; replay: %s", at, out)
		})
	}
}

// maxChangeID is the highest change id snapd lists.
func maxChangeID(t *testing.T, w *wire) int {
	t.Helper()
	var cs []change
	decode(t, w.do(t, "GET", "/v2/changes?select=all", nil), &cs)
	n := 0
	for _, c := range cs {
		if id, err := strconv.Atoi(c.ID); err == nil && id > n {
			n = id
		}
	}
	return n
}

// restartsAfter lists the service-control changes restarting alpha made
// after change id before.
func restartsAfter(t *testing.T, w *wire, before int) []string {
	t.Helper()
	var cs []change
	decode(t, w.do(t, "GET", "/v2/changes?select=all", nil), &cs)
	var out []string
	for _, c := range cs {
		id, _ := strconv.Atoi(c.ID)
		if id > before && c.Kind == "service-control" && touchesSvcdemo(c) {
			out = append(out, c.ID+":"+c.Status)
		}
	}
	return out
}

// runIntentProc runs a worker: its output, and whether it was killed.
func runIntentProc(t *testing.T, spec intentWorker) (out string, killed bool) {
	t.Helper()
	raw, _ := json.Marshal(spec)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), intentWorkerEnv+"="+string(raw))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return string(b), true
		}
	}
	if err != nil {
		t.Fatalf("worker: %v\n%s", err, stderr.String())
	}
	return string(b), false
}
