package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// A halted key shows plainly in status and list (who, which change, why,
// since, how to resume); history shows the restarts, the halt and the
// resume, as lines, a table or the []budget.Record document; resume lifts
// the halt and says what it lifted.
func TestHaltedStatusHistoryResume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := etcdtest.StartProcesses(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	eps := strings.Join(cl.Endpoints(), ",")
	cli, err := etcdtest.Client(cl.Endpoints()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const key = "k8s.kube-apiserver"
	b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Holder: "node-1 pid 4242", TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	slot, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer slot.Release(ctx)
	rec := slot.(budget.Recorder)
	act := budget.Act{Holder: "node-1 pid 4242", Machine: "node-1", Action: "restart", Services: []string{key}, Change: "41",
		Outcome: budget.OutcomeReady, Waited: 2 * time.Second, Held: 30 * time.Second}
	if _, err := rec.Record(ctx, act); err != nil {
		t.Fatal(err)
	}
	act.Change, act.Outcome, act.Reason = "42", budget.OutcomeFailed, "not ready within 5m0s"
	if h, err := rec.Record(ctx, act); err != nil || h == nil {
		t.Fatalf("Record: %+v %v", h, err)
	}
	cmd := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, args, &out, &errb)
		return code, out.String(), errb.String()
	}

	code, out, errs := cmd("status", key, "--endpoints", eps)
	if code != exitOK {
		t.Fatalf("status: %d %s", code, errs)
	}
	for _, want := range []string{"HALTED:   since ", "after 1 failed restart(s): node-1's restart of k8s.kube-apiserver (change 42): not ready within 5m0s",
		"halted by node-1 pid 4242", "resume with: snapsvc-rollout resume k8s.kube-apiserver"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	t.Logf("status:\n%s", out)
	code, out, _ = cmd("status", key, "--endpoints", eps, "-w", "json")
	var st etcdbudget.KeyStatus
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Halt == nil || st.Halt.Change != "42" || st.Paused == nil {
		t.Fatalf("status -w json: %d %s", code, out)
	}
	code, out, _ = cmd("list", "--endpoints", eps)
	if code != exitOK || !strings.Contains(out, key+", max 1, 1 holding, 0 waiting, HALTED since ") ||
		!strings.Contains(out, "(change 42): not ready within 5m0s; resume with: snapsvc-rollout resume "+key) {
		t.Fatalf("list: %d %q", code, out)
	}
	code, out, _ = cmd("list", "--endpoints", eps, "-w", "json")
	var keys []keySummary
	if code != exitOK || json.Unmarshal([]byte(out), &keys) != nil || len(keys) != 1 || keys[0].Halt == nil {
		t.Fatalf("list -w json: %d %s", code, out)
	}

	code, out, _ = cmd("history", key, "--endpoints", eps)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 3 || !strings.HasPrefix(lines[0], "#1 ") ||
		!strings.Contains(lines[0], "ready: node-1's restart of k8s.kube-apiserver (change 41), waited 2s, held 30s") ||
		!strings.Contains(lines[1], "failed: node-1's restart of k8s.kube-apiserver (change 42), waited 2s, held 30s: not ready within 5m0s") ||
		!strings.Contains(lines[2], "HALTED after 1 failed restart(s): node-1's restart") {
		t.Fatalf("history: %d\n%s", code, out)
	}
	t.Logf("history:\n%s", out)
	code, out, _ = cmd("history", key, "--endpoints", eps, "-w", "table")
	if code != exitOK || !strings.Contains(out, "| SEQ | TIME") || !strings.Contains(out, "| halted ") {
		t.Fatalf("history -w table: %d\n%s", code, out)
	}

	t.Setenv("SUDO_USER", "alice")
	host, _ := os.Hostname()
	code, out, errs = cmd("resume", key, "--endpoints", eps, "--reason", "reverted the flag")
	if code != exitOK || !strings.HasPrefix(out, key+" resumed (it was halted: node-1's restart of k8s.kube-apiserver (change 42)") {
		t.Fatalf("resume: %d %q %s", code, out, errs)
	}
	code, out, _ = cmd("history", key, "--endpoints", eps, "-w", "json")
	var recs []budget.Record
	if code != exitOK || json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 4 {
		t.Fatalf("history -w json: %d %s", code, out)
	}
	if r := recs[3]; r.Kind != budget.RecordResumed || r.By != "alice@"+host || r.Reason != "reverted the flag" || r.Seq != 4 {
		t.Fatalf("resumed record %+v", r)
	}
	if recs[1].Act == nil || recs[1].Act.Change != "42" || recs[2].Halt == nil {
		t.Fatalf("records %+v", recs)
	}
	// Durations are seconds in *_seconds fields, as in every command's
	// JSON (issue 44, item 4), not the nanoseconds stored in etcd.
	var docs []struct {
		Act map[string]any `json:"act"`
	}
	if err := json.Unmarshal([]byte(out), &docs); err != nil {
		t.Fatal(err)
	}
	if a := docs[1].Act; a["held_seconds"] != 30.0 || a["waited_seconds"] != 2.0 || a["held"] != nil || a["waited"] != nil || a["change"] != "42" {
		t.Fatalf("act document %v, want held_seconds 30 and waited_seconds 2 only", a)
	}
	code, out, _ = cmd("history", key, "--endpoints", eps, "--limit", "1")
	if code != exitOK || !strings.HasPrefix(out, "#4 ") || strings.Count(out, "\n") != 1 {
		t.Fatalf("history --limit 1: %d %q", code, out)
	}
	code, out, _ = cmd("status", key, "--endpoints", eps)
	if code != exitOK || !strings.Contains(out, "paused:   no") {
		t.Fatalf("status once resumed: %d\n%s", code, out)
	}
	code, _, errs = cmd("history", "nothing.here", "--endpoints", eps)
	if code != exitOK || !strings.Contains(errs, `note: budget key "nothing.here" not found under /snapsvc/restart-budget/`) {
		t.Fatalf("history of an unknown key: %d %q", code, errs)
	}
	code, _, errs = cmd("history", "k8s.kube-apiservr", "--endpoints", eps)
	if code != exitOK || !strings.Contains(errs, "Did you mean k8s.kube-apiserver?") {
		t.Fatalf("history of a typo: %d %q", code, errs)
	}
	if code, _, _ := cmd("history", key, "--endpoints", eps, "--limit", "-1"); code != exitUsage {
		t.Fatalf("--limit -1: exit %d", code)
	}
}

// --admit-command admits on exit 0 and otherwise says why not with its
// first line of output; --admit-url admits on 2xx.
func TestAdmission(t *testing.T) {
	ctx := context.Background()
	a := snapsvc.Admission{Action: "restart", Services: []string{"ceph.mon"}, Keys: []string{"ceph.mon"}}
	o := &options{admitCommand: `test "$SNAPSVC_SERVICES" = ceph.mon`}
	admit, err := admission(o)
	if err != nil || admit == nil {
		t.Fatal(err)
	}
	if err := admit(ctx, a); err != nil {
		t.Fatalf("exit 0 refused: %v", err)
	}
	o.admitCommand = "echo; echo 'mon.b down: 2 of 3 in quorum'; echo more; exit 3"
	if err := admit(ctx, a); err == nil || err.Error() != "--admit-command: mon.b down: 2 of 3 in quorum" {
		t.Fatalf("refusal: %v", err)
	}
	o.admitCommand = "echo 'no' >&2; exit 1"
	if err := admit(ctx, a); err == nil || !strings.Contains(err.Error(), "no") {
		t.Fatalf("refusal on stderr: %v", err)
	}

	var refuse atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if refuse.Load() {
			http.Error(w, "not ok-to-stop: pg 1.2 degraded", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	admit, err = admission(&options{admitURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if err := admit(ctx, a); err != nil {
		t.Fatalf("2xx refused: %v", err)
	}
	refuse.Store(true)
	if err := admit(ctx, a); err == nil || !strings.Contains(err.Error(), "503 Service Unavailable: not ok-to-stop: pg 1.2 degraded") {
		t.Fatalf("503: %v", err)
	}
	if admit, err := admission(&options{}); err != nil || admit != nil {
		t.Fatalf("no check: %v", err)
	}
	if _, err := admission(&options{admitURL: srv.URL, admitCA: "/nonexistent"}); err == nil {
		t.Fatal("a missing --admit-ca accepted")
	}
}

// An --admit-command whose shell's child keeps the output open ends with
// its context: the whole process group is killed, and the check returns
// a refusal well before the child would have ended (5 s: a correctness
// bound, not a timing claim).
func TestAdmitCommandEndsWithContext(t *testing.T) {
	admit, err := admission(&options{admitCommand: "sleep 5; echo hi"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = admit(ctx, snapsvc.Admission{Action: "restart", Services: []string{"ceph.mon"}})
	if took := time.Since(start); took >= 5*time.Second {
		t.Fatalf("returned after %v: the command outlived its context", took)
	}
	if err == nil || !strings.HasPrefix(err.Error(), "--admit-command: ") {
		t.Fatalf("a command killed at its bound admitted: %v", err)
	}
}

// waitOutput polls out until it contains want, or done reports the
// command's end (a failure).
func waitOutput(t *testing.T, ctx context.Context, out *syncBuffer, want string, done <-chan int) {
	t.Helper()
	for !strings.Contains(out.String(), want) {
		select {
		case code := <-done:
			t.Fatalf("ended (%d) before %q: %s", code, want, out.String())
		case <-ctx.Done():
			t.Fatalf("never saw %q: %s", want, out.String())
		case <-time.After(10 * time.Millisecond): // polling the output, not a synchronisation
		}
	}
}

// A rollout whose service never becomes ready halts its key (--halt-after
// 1): the next machine restarts nothing while it is halted, and says so;
// resumed, it goes on. An admission command that refuses holds the
// machine, slot kept, until it admits.
func TestRolloutHaltsAndAdmits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := etcdtest.StartProcesses(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	eps := strings.Join(cl.Endpoints(), ",")
	const key = "k8s.kube-apiserver"
	var notReady atomic.Bool
	notReady.Store(true)
	ready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if notReady.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
		}
	}))
	defer ready.Close()
	common := func(holder string, srv *fake.Server) []string {
		return []string{"--endpoints", eps, "--ttl", "3s", "--socket", srv.SocketPath(), "--holder", holder, "--ready-url", ready.URL,
			"--ready-interval", "20ms", "--ready-timeout", "300ms", "--halt-after", "1"}
	}

	// node-a restarts; its service is never ready: exit 1, key halted.
	a := fake.NewServer(t, fake.AllowNonRoot(), k8s())
	var out, errb bytes.Buffer
	if code := run(ctx, append(common("node-a", a), key), &out, &errb); code != exitFailed {
		t.Fatalf("node-a: exit %d, want %d: %s", code, exitFailed, errb.String())
	}
	host, _ := os.Hostname() // the machine a halt names (the holder is node-a)
	if !strings.Contains(errb.String(), "HALTED "+key+" after 1 failed restart(s): "+host+"'s restart of "+key) {
		t.Errorf("node-a did not say it halted the key: %s", errb.String())
	}
	changeA := a.Changes()[0].ID
	out.Reset()
	if code := run(ctx, []string{"status", key, "--endpoints", eps}, &out, &errb); code != exitOK ||
		!strings.Contains(out.String(), "HALTED:") || !strings.Contains(out.String(), "(change "+changeA+")") {
		t.Fatalf("status: %s", out.String())
	}

	// node-b: held back by the halt, nothing restarted.
	b := fake.NewServer(t, fake.AllowNonRoot(), k8s())
	var stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		var out bytes.Buffer
		done <- run(ctx, append(common("node-b", b), key), &out, &stderr)
	}()
	waitOutput(t, ctx, &stderr, "waiting for "+key+": paused by node-a since ", done)
	if line := stderr.String(); !strings.Contains(line, "halted: "+host+"'s restart of "+key) || !strings.Contains(line, "resume with: snapsvc-rollout resume "+key) {
		t.Errorf("progress line %q", line)
	}
	if n := len(b.Changes()); n != 0 {
		t.Fatalf("restarted while halted: %d changes", n)
	}
	notReady.Store(false)
	if code := run(ctx, []string{"resume", key, "--endpoints", eps}, &out, &errb); code != exitOK {
		t.Fatalf("resume: %d %s", code, errb.String())
	}
	if code := <-done; code != exitOK || len(b.Changes()) != 1 {
		t.Fatalf("after resume: exit %d, %d changes: %s", code, len(b.Changes()), stderr.String())
	}

	// node-c: the admission command refuses until a file exists.
	c := fake.NewServer(t, fake.AllowNonRoot(), k8s())
	flag := t.TempDir() + "/quorum-ok"
	var cerr syncBuffer
	go func() {
		var out bytes.Buffer
		done <- run(ctx, append(common("node-c", c), "--admit-command", "test -e "+flag+" || { echo 'mon.b down: 2 of 3 in quorum'; exit 1; }", key), &out, &cerr)
	}()
	waitOutput(t, ctx, &cerr, "admission check refused "+key, done)
	if !strings.Contains(cerr.String(), "mon.b down: 2 of 3 in quorum") {
		t.Errorf("refusal line %q", cerr.String())
	}
	if n := len(c.Changes()); n != 0 {
		t.Fatalf("restarted while refused: %d changes", n)
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != exitOK || len(c.Changes()) != 1 {
		t.Fatalf("once admitted: exit %d, %d changes: %s", code, len(c.Changes()), cerr.String())
	}

	// The history: node-a's failure, its halt, the resume, node-b's and
	// node-c's restarts, with snapd's change ids.
	out.Reset()
	if code := run(ctx, []string{"history", key, "--endpoints", eps, "-w", "json"}, &out, &errb); code != exitOK {
		t.Fatalf("history: %d %s", code, errb.String())
	}
	var recs []budget.Record
	if err := json.Unmarshal(out.Bytes(), &recs); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		s := string(r.Kind)
		if r.Act != nil {
			s += ":" + string(r.Act.Outcome) + ":" + r.Act.Change
		}
		got = append(got, s)
	}
	want := fmt.Sprintf("act:failed:%s halted resumed act:ready:%s act:ready:%s", changeA, b.Changes()[0].ID, c.Changes()[0].ID)
	if strings.Join(got, " ") != want {
		t.Fatalf("history %q, want %q", strings.Join(got, " "), want)
	}
}
