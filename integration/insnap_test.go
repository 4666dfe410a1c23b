//go:build realsnapd

package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// These tests run snapsvc inside the svcdemo snap (the "helper" app, built
// from integration/insnap), so snapd sees a confined snap process: snapctl
// mode comes from SNAP_COOKIE and changes are read on the snap socket.

// helperOutput is what snapsvc-helper prints.
type helperOutput struct {
	Mode      string            `json:"mode"`
	Hook      string            `json:"hook"`
	Result    *snapsvc.Result   `json:"result"`
	Services  []snapsvc.Service `json:"services"`
	Error     string            `json:"error"`
	Retryable bool              `json:"retryable"`
	Took      string            `json:"took"`
}

// runInside runs a command in the container's namespaces. (nsenter -a from
// inside the container's PID namespace leaves the mount namespace alone,
// so the namespaces are named one by one.)
func (e env) runInside(t testing.TB, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	if e.Leader == "" {
		t.Fatal("SNAPSVC_REALSNAPD_LEADER not set")
	}
	argv := append([]string{"nsenter", "-t", e.Leader, "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--"}, args...)
	if cpu := os.Getenv("SNAPSVC_REALSNAPD_CPU"); cpu != "" {
		// On the container's CPU, as run.sh explains (mount namespace ids).
		argv = append([]string{"taskset", "-c", cpu}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	var o, eb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &eb
	err = cmd.Run()
	return o.String(), eb.String(), err
}

func (e env) helper(t testing.TB, args ...string) (helperOutput, error) {
	t.Helper()
	stdout, stderr, err := e.runInside(t, append([]string{"snap", "run", "svcdemo.helper"}, args...)...)
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if l != "" {
			t.Logf("helper: %s", l)
		}
	}
	var out helperOutput
	if jerr := json.Unmarshal([]byte(stdout), &out); jerr != nil {
		t.Fatalf("snapsvc-helper %v: %v; stdout %q; exit %v", args, jerr, stdout, err)
	}
	return out, err
}

func TestInSnapRestart(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })

	before := servicePIDs(t, "alpha")
	out, err := e.helper(t, "restart", "svcdemo.alpha")
	if err != nil {
		t.Fatalf("helper restart: %v: %+v", err, out)
	}
	if out.Mode != "snapctl" || out.Result == nil || out.Result.Status != "Done" || out.Result.Attempts != 1 {
		t.Errorf("helper restart: %+v %+v", out, out.Result)
	}
	for pid := range servicePIDs(t, "alpha") {
		if before[pid] {
			t.Errorf("restart from inside the snap: alpha's process %s survived", pid)
		}
	}
	out, err = e.helper(t, "-disable", "stop", "svcdemo.beta")
	if err != nil {
		t.Fatalf("helper stop --disable: %v: %+v", err, out)
	}
	if a := w.apps(t, "svcdemo.beta")["beta"]; a.Enabled || a.Active {
		t.Errorf("after stop --disable from inside the snap: beta %+v", a)
	}
	// Services from inside a snap cannot use GET /v2/apps (main socket only).
	out, err = e.helper(t, "services", "svcdemo")
	if err != nil || len(out.Services) != 5 {
		t.Errorf("services from inside the snap: %v %s: got %+v, want svcdemo's 5 services", err, out.Error, out.Services)
	}
	if out, err := e.helper(t, "restart", "tinybase.x"); err == nil {
		t.Errorf("restarting another snap's service from inside svcdemo succeeded: %+v", out)
	}
}

// A conflict held by a slow stop, absorbed from inside the snap. With
// snap-refresh-observe connected the helper sees the blocking change on
// the snap socket and retries right after it; without it (snapd 2.57 has
// no such interface) it can only back off.
func TestInSnapConflictAbsorbed(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	t.Cleanup(func() { w.ensureBaseline(t) })
	observe := os.Getenv("SNAPSVC_REALSNAPD_OBSERVE") == "1"

	r := w.postApps(t, "stop", []string{"svcdemo.gamma"}, nil)
	if r.StatusCode != 202 {
		t.Fatalf("stop gamma: %s", r.Raw)
	}
	out, err := e.helper(t, "restart", "svcdemo.alpha")
	returned := time.Now()
	if err != nil {
		t.Fatalf("helper restart during a slow stop: %v: %+v", err, out)
	}
	blk := w.change(t, r.Change)
	if !blk.Ready {
		t.Fatalf("helper returned while the blocking change is %s", blk.Status)
	}
	res := out.Result
	if res == nil || res.Conflicts < 1 {
		t.Fatalf("helper result %+v: want a conflict absorbed", res)
	}
	if observe && (len(res.WaitedFor) == 0 || res.WaitedFor[0] != blk.ID) {
		t.Errorf("with snap-refresh-observe: WaitedFor %v, want blocking change %s", res.WaitedFor, blk.ID)
	}
	// The helper's own change: the first service-control change after the
	// blocking one.
	var own *change
	rr := w.do(t, "GET", "/v2/changes?select=all", nil)
	var all []change
	decode(t, rr, &all)
	for i := range all {
		c := &all[i]
		if c.Kind == "service-control" && lessChangeID(blk.ID, c.ID) && (own == nil || lessChangeID(c.ID, own.ID)) {
			own = c
		}
	}
	if own == nil {
		t.Fatalf("no service-control change after %s", blk.ID)
	}
	lag := own.SpawnTime.Sub(blk.ReadyTime)
	t.Logf("snapd %s (snap-refresh-observe=%v): blocking change %s ready; helper's change %s spawned %v later; helper returned %v after; %d attempts, %d conflicts, waited for %v",
		e.Version, observe, blk.ID, own.ID, lag.Round(100*time.Microsecond), returned.Sub(blk.ReadyTime).Round(time.Millisecond), res.Attempts, res.Conflicts, res.WaitedFor)
	if lag < 0 {
		t.Errorf("helper's change %s spawned before blocking change %s was ready", own.ID, blk.ID)
	}
	if observe && lag > 2*time.Second {
		t.Errorf("helper's change spawned %v after the blocking change ended; want right after", lag)
	}
}

func lessChangeID(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// snapsvc inside the configure hook: snapd queues service commands until
// the hook ends, so the helper must return at once with Queued (waiting
// would deadlock), and the restart must still happen.
func TestInSnapConfigureHookQueued(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	common := "/proc/" + e.Leader + "/root/var/snap/svcdemo/common"
	os.Remove(filepath.Join(common, "hook-restart.json"))
	t.Cleanup(func() {
		w.waitIdle(t)
		w.waitChange(t, w.setConf(t, map[string]any{"hook-restart": nil, "hook-sleep": 0}), time.Minute)
		w.ensureBaseline(t)
	})

	before := servicePIDs(t, "alpha")
	cfg := w.setConf(t, map[string]any{"hook-restart": "svcdemo.alpha", "hook-sleep": 0})
	chg := w.waitChange(t, cfg, time.Minute)
	if chg.Status != "Done" {
		t.Fatalf("configure change %s ended %s: %s", chg.ID, chg.Status, chg.Err)
	}
	b, err := os.ReadFile(filepath.Join(common, "hook-restart.json"))
	if err != nil {
		logb, _ := os.ReadFile(filepath.Join(common, "hook-restart.log"))
		t.Fatalf("the hook left no helper output: %v; log: %s", err, logb)
	}
	var out helperOutput
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("helper output %q: %v", b, err)
	}
	if out.Error != "" || out.Hook != "configure" || out.Result == nil || !out.Result.Queued {
		t.Errorf("helper in the configure hook: %+v result %+v; want a queued restart", out, out.Result)
	}
	var kinds []string
	for _, tk := range chg.Tasks {
		kinds = append(kinds, tk.Kind+": "+tk.Summary)
	}
	t.Logf("configure change %s tasks: %q", chg.ID, kinds)
	after := servicePIDs(t, "alpha")
	for pid := range after {
		if before[pid] {
			t.Errorf("queued restart did not happen: alpha's process %s survived", pid)
		}
	}
}
