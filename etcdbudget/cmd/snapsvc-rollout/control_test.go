package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
	"github.com/snapsvc/snapsvc/fake"
)

func TestStatusPauseResumeCommands(t *testing.T) {
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
	cmd := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, args, &out, &errb)
		return code, out.String(), errb.String()
	}
	// The pause records the operator, not a process (issue 29, item 4).
	t.Setenv("SUDO_USER", "alice")
	host, _ := os.Hostname()
	if code, out, errs := cmd("pause", key, "--endpoints", eps, "--reason", "node-3 disk"); code != exitOK || !strings.Contains(out, "paused by alice@"+host+" since") {
		t.Fatalf("pause: %d %q %q", code, out, errs)
	}
	code, out, errs := cmd("status", "--endpoints", eps, key)
	if code != exitOK {
		t.Fatalf("status: %d %q", code, errs)
	}
	for _, want := range []string{"key:      k8s.kube-apiserver", "max:      1", "paused:   by alice@" + host + " since", "(node-3 disk)", "holders (1)", "node-1 pid 4242", "waiters (0)"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	t.Logf("status:\n%s", out)
	code, out, _ = cmd("status", key, "--endpoints", eps, "--json")
	var st etcdbudget.KeyStatus
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil || len(st.Holders) != 1 || st.Holders[0].Holder != "node-1 pid 4242" || st.Paused == nil {
		t.Fatalf("status --json: %d %s", code, out)
	}
	if code, out, _ := cmd("resume", key, "--endpoints", eps); code != exitOK || out != key+" resumed\n" {
		t.Fatalf("resume: %d %q", code, out)
	}
	if code, out, _ := cmd("resume", key, "--endpoints", eps); code != exitOK || out != key+" was not paused\n" {
		t.Fatalf("resume again: %d %q", code, out)
	}
}

func TestControlUsageAndUnreachable(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"status"}, // no key
		{"pause", "a/b", "--endpoints", "http://127.0.0.1:1"}, // bad key
		{"resume", "k", "extra", "--endpoints", "http://127.0.0.1:1"},
	} {
		var out, errb bytes.Buffer
		if code := run(ctx, args, &out, &errb); code != exitUsage {
			t.Errorf("%q: exit %d, want %d (%s)", args, code, exitUsage, errb.String())
		}
	}
	// Unreachable: the error names the endpoint and the cause, within
	// the command's bound (issue 29, item 4).
	var out, errb bytes.Buffer
	start := time.Now()
	code := run(ctx, []string{"status", "k", "--endpoints", "http://127.0.0.1:1", "--timeout", "2s"}, &out, &errb)
	if code != exitRetryable || !strings.Contains(errb.String(), "http://127.0.0.1:1: ") || !strings.Contains(errb.String(), "connection refused") {
		t.Fatalf("unreachable etcd: exit %d (%s)", code, errb.String())
	}
	// Within the 2s bound; the 15s Unreachable (or v0.2's 10s) is what a
	// bound not applied would take, so 9s leaves a loaded machine its
	// margin.
	if d := time.Since(start); d > 9*time.Second {
		t.Errorf("unreachable etcd: %s, want within the 2s bound", d)
	}
	t.Logf("unreachable: %s", errb.String())
}

// Without --budget-key each service is its own key (the core expands a
// snap name into its services' keys); --budget-key is put in canonical
// form, so "a+b" and "b+a" on two machines are one key (issue 26, defect
// 4). --key is etcdctl's client key file now: v0.2's --key KEY is told
// where the budget key went (issue 36).
func TestKeys(t *testing.T) {
	var errb bytes.Buffer
	a, err := parse([]string{"--endpoints", "http://10.0.0.1:2379", "k8s.b", "k8s.a", "k8s.b"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if a.key != "" {
		t.Fatalf("default key %q, want none (each service's own)", a.key)
	}
	b, err := parse([]string{"--endpoints", "http://10.0.0.1:2379", "--budget-key", "k8s.b+k8s.a", "k8s.a"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if b.key != "k8s.a+k8s.b" {
		t.Fatalf("--budget-key k8s.b+k8s.a gave %q, want k8s.a+k8s.b", b.key)
	}
	// A v0.1.1 machine's key, verbatim (v0.1.1 never sorted it), and
	// v0.1.1's whole-snap keys counted unless switched off (issue 41,
	// item 7: the upgrade advice named a flag that no longer did it).
	l, err := parse([]string{"--endpoints", "http://10.0.0.1:2379", "--legacy-key", "k8s.b+k8s.a", "k8s.a", "k8s.b"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if got := legacyKeysOf(l)("k8s.a"); !slices.Equal(got, []string{"k8s", "k8s.b+k8s.a"}) {
		t.Errorf("--legacy-key k8s.b+k8s.a: legacy keys %q, want [k8s k8s.b+k8s.a]", got)
	}
	n, err := parse([]string{"--endpoints", "http://10.0.0.1:2379", "--legacy-snap-keys=false", "k8s.a"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if got := legacyKeysOf(n)("k8s.a"); len(got) != 0 {
		t.Errorf("--legacy-snap-keys=false: legacy keys %q, want none", got)
	}
	if _, err := parse([]string{"--endpoints", "http://10.0.0.1:2379", "--legacy-key", "a/b", "k8s.a"}, &errb, &errb); err == nil || !strings.Contains(err.Error(), "--legacy-key") {
		t.Errorf("--legacy-key a/b: %v, want a usage error", err)
	}
	if _, err := parse([]string{"--endpoints", "http://10.0.0.1:2379", "--key", "k8s.b+k8s.a", "k8s.a"}, &errb, &errb); err == nil ||
		!strings.Contains(err.Error(), "--key is etcd's client key FILE (as etcdctl's); the budget key is --budget-key") {
		t.Errorf("v0.2's --key KEY: %v, want the way to --budget-key", err)
	}
	for _, args := range [][]string{
		{"--endpoints", "http://10.0.0.1:2379", "--max", "2", "--max-unavailable", "2", "k8s.a"},
		{"--endpoints", "http://10.0.0.1:2379", "--max-unavailable", "0%", "k8s.a"},
		{"--endpoints", "http://10.0.0.1:2379", "--window", "Mon 25:00-01:00", "k8s.a"},
	} {
		if _, err := parse(args, &errb, &errb); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// The etcd flags are etcdctl's, with its defaults (--dial-timeout 2s,
// --command-timeout 5s, -w simple), and read its environment variables; a
// flag wins; ETCDCTL_USER may carry the password (issue 29, item 4; issue
// 36); v0.2's --etcd-* spellings still work, deprecated.
func TestEtcdFromEnvironment(t *testing.T) {
	var errb bytes.Buffer
	o, err := parse([]string{"k8s.kubelet", "--endpoints", "http://10.0.0.1:2379"}, &errb, &errb)
	if err != nil || o.dialTimeout != 2*time.Second || o.commandTimeout != 5*time.Second || o.writeOut != "simple" {
		t.Fatalf("defaults: %+v %v", o, err)
	}
	t.Setenv("ETCDCTL_ENDPOINTS", "https://10.0.0.1:2379,https://10.0.0.2:2379")
	t.Setenv("ETCDCTL_CACERT", "/etc/ca.crt")
	t.Setenv("ETCDCTL_CERT", "/etc/client.crt")
	t.Setenv("ETCDCTL_KEY", "/etc/client.key")
	t.Setenv("ETCDCTL_USER", "node:secret")
	t.Setenv("ETCDCTL_PASSWORD", "")
	t.Setenv("ETCDCTL_DIAL_TIMEOUT", "3s")
	t.Setenv("ETCDCTL_COMMAND_TIMEOUT", "7s")
	t.Setenv("ETCDCTL_WRITE_OUT", "json")
	o, err = parse([]string{"k8s.kubelet"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if o.endpoints != "https://10.0.0.1:2379,https://10.0.0.2:2379" || o.etcdCA != "/etc/ca.crt" || o.etcdCert != "/etc/client.crt" ||
		o.etcdKey != "/etc/client.key" || o.etcdUser != "node" || o.etcdPassword != "secret" ||
		o.dialTimeout != 3*time.Second || o.commandTimeout != 7*time.Second || o.writeOut != "json" || !o.jsonOut {
		t.Fatalf("from the environment: %+v", o)
	}
	o, err = parse([]string{"k8s.kubelet", "--endpoints", "http://127.0.0.1:2379", "--user", "other", "--dial-timeout=1s", "-w", "simple"}, &errb, &errb)
	if err != nil || o.endpoints != "http://127.0.0.1:2379" || o.etcdUser != "other" || o.dialTimeout != time.Second || o.jsonOut {
		t.Fatalf("flags over the environment: %+v %v", o, err)
	}
	errb.Reset()
	o, err = parse([]string{"k8s.kubelet", "--etcd-user", "old", "--etcd-ca", "/old/ca.crt"}, &errb, &errb)
	if err != nil || o.etcdUser != "old" || o.etcdCA != "/old/ca.crt" || !strings.Contains(errb.String(), "--etcd-ca has been deprecated, use --cacert") {
		t.Fatalf("v0.2's spellings: %+v %v %q", o, err, errb.String())
	}
	t.Setenv("ETCDCTL_DIAL_TIMEOUT", "soon")
	if _, err := parse([]string{"k8s.kubelet"}, &errb, &errb); err == nil || !strings.Contains(err.Error(), `$ETCDCTL_DIAL_TIMEOUT="soon"`) {
		t.Errorf("a bad variable: %v, want it named", err)
	}
}

func TestFlagsAnywhere(t *testing.T) {
	var errb bytes.Buffer
	o, err := parse([]string{"k8s.kubelet", "--endpoints", "http://10.0.0.1:2379", "--max-unavailable=25%", "k8s.containerd", "--", "k8s.kube-proxy"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if o.endpoints != "http://10.0.0.1:2379" || o.maxUnavailable != "25%" || strings.Join(o.names, " ") != "k8s.kubelet k8s.containerd k8s.kube-proxy" {
		t.Fatalf("%+v", o)
	}
}

// Status tells holders, waiters blocked by a lock-delay and vanished
// holders apart (issue 26, defect 7).
func TestPrintStatusBlockedAndVanished(t *testing.T) {
	now := time.Date(2026, 12, 4, 10, 35, 0, 0, time.UTC)
	st := &etcdbudget.KeyStatus{Key: "k8s.kube-apiserver", Max: 1, Holders: []etcdbudget.Entry{},
		Waiters:  []etcdbudget.Entry{{Holder: "node-b", Since: now.Add(-5 * time.Second), BlockedBy: []string{"node-a"}}},
		Vanished: []etcdbudget.Entry{{Holder: "node-a", Since: now.Add(-9 * time.Second), Acquired: now.Add(-8 * time.Second), Acts: 1, Acted: now.Add(-7 * time.Second)}}}
	var b bytes.Buffer
	printStatus(&b, st, now)
	out := b.String()
	for _, want := range []string{"holders (0)", "waiters (1)", "node-b", "blocked by the lock-delay of node-a", "vanished holders", "node-a", "acted 7s ago, not marked ready since\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

// What a holder recorded, in words that say what is true when the times
// are zero, now, or ahead of this machine's clock (issue 44, item 4:
// "acted 0s ago, not ready since").
func TestEntryNote(t *testing.T) {
	now := time.Date(2026, 12, 4, 10, 35, 0, 0, time.UTC)
	for _, tc := range []struct {
		e    etcdbudget.Entry
		want string
	}{
		{etcdbudget.Entry{}, ""},
		{etcdbudget.Entry{Acts: 1, Acted: now.Add(-300 * time.Millisecond)}, "acted just now, not marked ready since"},
		{etcdbudget.Entry{Acts: 1, Acted: now}, "acted just now, not marked ready since"},
		{etcdbudget.Entry{Acts: 2, Acted: now.Add(-9 * time.Second), ReadyAt: now.Add(-2 * time.Second)}, "acted 9s ago, marked ready 2s ago"},
		{etcdbudget.Entry{Acts: 1, Acted: now.Add(-time.Second), ReadyAt: now.Add(-100 * time.Millisecond)}, "acted 1s ago, marked ready just now"},
		{etcdbudget.Entry{Acts: 1, Acted: now.Add(3 * time.Second)}, "acted 3s ahead of this machine's clock, not marked ready since"},
		{etcdbudget.Entry{Acts: 1}, "may have acted (no act record: an earlier version)"},
		{etcdbudget.Entry{BlockedBy: []string{"node-a"}}, "blocked by the lock-delay of node-a"},
	} {
		if got := strings.TrimPrefix(entryNote(tc.e, now), "\t"); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.e, got, tc.want)
		}
	}
	if got := age(now, now.Add(2*time.Second)); got != "0s" {
		t.Errorf("age of a time ahead of the clock: %q, want 0s", got)
	}
}

// The operator commands over TLS with client certificate auth, configured
// only by etcdctl's environment variables; a CA that does not trust the
// server is refused (exit 2), naming the endpoint and the cause (issue 26;
// issue 29, item 4).
func TestTLSFromEnvironment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	ca, err := etcdtest.NewCA(dir, "etcd")
	if err != nil {
		t.Fatal(err)
	}
	ip := etcdtest.LoopbackIP()
	srv, err := ca.Issue(etcdtest.CertOptions{CommonName: "etcd-server", IPs: []net.IP{net.ParseIP(ip)}})
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.Issue(etcdtest.CertOptions{CommonName: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := etcdtest.StartProcessesWith(ctx, 1, etcdtest.Options{IP: ip,
		TLS:       &etcdtest.TLSFiles{CertFile: srv.CertFile, KeyFile: srv.KeyFile, TrustedCAFile: ca.File, ClientCertAuth: true},
		ClientTLS: etcdtest.ClientTLS(ca.Pool(), node)})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	t.Setenv("ETCDCTL_ENDPOINTS", cl.Endpoint(0))
	t.Setenv("ETCDCTL_CACERT", ca.File)
	t.Setenv("ETCDCTL_CERT", node.CertFile)
	t.Setenv("ETCDCTL_KEY", node.KeyFile)
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"status", "k8s.kube-apiserver"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "holders (0)") {
		t.Fatalf("status over TLS from the environment: exit %d\n%s%s", code, out.String(), errb.String())
	}
	other, err := etcdtest.NewCA(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("ETCDCTL_CACERT", other.File)
	out.Reset()
	errb.Reset()
	code := run(ctx, []string{"status", "k8s.kube-apiserver"}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), cl.Endpoint(0)) || !strings.Contains(errb.String(), "certificate signed by unknown authority") {
		t.Fatalf("status with a CA that does not trust etcd: exit %d (want %d)\n%s", code, exitUsage, errb.String())
	}
	t.Logf("%s", errb.String())

	// http:// to a member serving TLS: a usage error that says to use
	// https://, at once, for the operator commands and a rollout alike
	// (issue 44, item 4: retryable, exit 3, after the dial timeout; a
	// rollout said "restart failed", exit 1). etcdctl 3.4: "context
	// deadline exceeded" after 5 s.
	t.Setenv("ETCDCTL_CACERT", ca.File)
	host := strings.TrimPrefix(cl.Endpoint(0), "https://")
	t.Setenv("ETCDCTL_ENDPOINTS", "http://"+host)
	t.Setenv("ETCDCTL_DIAL_TIMEOUT", "10s")
	snapd := fake.NewServer(t, fake.AllowNonRoot(), k8s())
	for _, args := range [][]string{{"status", "k8s.kube-apiserver"}, {"--socket", snapd.SocketPath(), "--unreachable", "10s", "k8s.kube-apiserver"}} {
		out.Reset()
		errb.Reset()
		start := time.Now()
		code = run(ctx, args, &out, &errb)
		took := time.Since(start)
		if code != exitUsage || !strings.Contains(errb.String(), "http://"+host+": the server speaks TLS, not plain gRPC: use https://"+host) {
			t.Fatalf("%q with http:// to TLS: exit %d (want %d)\n%s", args, code, exitUsage, errb.String())
		}
		if took > 5*time.Second {
			t.Errorf("%q with http:// to TLS: %s, want at the first diagnosis, not the 10s bound", args, took)
		}
		t.Logf("%q after %s: %s", args, took.Round(time.Millisecond), errb.String())
	}
	if n := len(snapd.Changes()); n != 0 {
		t.Fatalf("%d restarts", n)
	}
}

// Issue 36: etcdctl's habits. list shows every key, -w simple|table|json
// shape list and status, status --watch prints the status again at each
// change of the key (and not of a longer key sharing its beginning) until
// interrupted, which ends it with exit 0. The variables are etcdctl's.
func TestListWatchAndWriteOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := etcdtest.StartProcesses(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	t.Setenv("ETCDCTL_ENDPOINTS", strings.Join(cl.Endpoints(), ","))
	cmd := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, args, &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, errs := cmd("list"); code != exitOK || out != "" || !strings.Contains(errs, "no budget keys under /snapsvc/restart-budget/") {
		t.Fatalf("list of nothing: %d %q %q", code, out, errs)
	}
	t.Setenv("SUDO_USER", "alice")
	for _, k := range []string{"k8s.kubelet", "k8s"} {
		if code, _, errs := cmd("pause", "--create", k, "--reason", "test"); code != exitOK {
			t.Fatalf("pause %s: %q", k, errs)
		}
	}
	code, out, _ := cmd("list")
	if host, _ := os.Hostname(); code != exitOK || out != "k8s, max 1, 0 holding, 0 waiting, paused by alice@"+host+"\nk8s.kubelet, max 1, 0 holding, 0 waiting, paused by alice@"+host+"\n" {
		t.Fatalf("list: %d %q", code, out)
	}
	code, out, _ = cmd("list", "-w", "table")
	if code != exitOK || !strings.HasPrefix(out, "+-") || !strings.Contains(out, "| KEY         | MAX | HOLDERS | WAITERS | PAUSED ") || !strings.Contains(out, "| k8s.kubelet | 1   | 0       | 0       | paused by alice@") {
		t.Fatalf("list -w table: %d\n%s", code, out)
	}
	t.Setenv("ETCDCTL_WRITE_OUT", "json")
	code, out, _ = cmd("list")
	var keys []keySummary
	if code != exitOK || json.Unmarshal([]byte(out), &keys) != nil || len(keys) != 2 || keys[1].Key != "k8s.kubelet" || keys[1].Paused == nil {
		t.Fatalf("list with ETCDCTL_WRITE_OUT=json: %d %s", code, out)
	}
	if code, out, _ := cmd("status", "k8s", "-w", "table"); code != exitOK || !strings.Contains(out, "| KEY | ROLE | # | HOLDER |") || !strings.Contains(out, "max 1, paused by alice@") {
		t.Fatalf("status -w table: %d\n%s", code, out)
	}

	// --watch, as JSON lines: the status now, then after each change of
	// k8s (the resume), not of k8s.kubelet.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		var errb bytes.Buffer
		done <- run(wctx, []string{"status", "--watch", "k8s"}, pw, &errb)
		pw.CloseWithError(errors.New(errb.String()))
	}()
	lines := bufio.NewScanner(pr)
	next := func() etcdbudget.KeyStatus {
		if !lines.Scan() {
			t.Fatalf("watch ended: %v", lines.Err())
		}
		var st etcdbudget.KeyStatus
		if err := json.Unmarshal(lines.Bytes(), &st); err != nil {
			t.Fatalf("watch line %q: %v", lines.Text(), err)
		}
		return st
	}
	if st := next(); st.Key != "k8s" || st.Paused == nil {
		t.Fatalf("first status %+v, want k8s paused", st)
	}
	if code, _, errs := cmd("resume", "k8s.kubelet"); code != exitOK { // another key: no new line
		t.Fatal(errs)
	}
	if code, _, errs := cmd("resume", "k8s"); code != exitOK {
		t.Fatal(errs)
	}
	if st := next(); st.Key != "k8s" || st.Paused != nil {
		t.Fatalf("after resume k8s: %+v, want k8s not paused (and no line for k8s.kubelet)", st)
	}
	stop()
	go io.Copy(io.Discard, pr)
	if code := <-done; code != exitOK {
		t.Errorf("interrupted watch: exit %d, want 0", code)
	}
}
