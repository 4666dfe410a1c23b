package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
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
		{"status"},      // no key
		{"status", "k"}, // no endpoints
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
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("unreachable etcd: %s, want within the 2s bound", d)
	}
	t.Logf("unreachable: %s", errb.String())
}

// Without --key each service is its own key (the core expands a snap
// name into its services' keys); --key is put in canonical form, so
// "a+b" and "b+a" on two machines are one key (issue 26, defect 4).
func TestKeys(t *testing.T) {
	var errb bytes.Buffer
	a, err := parse([]string{"--endpoints", "x", "k8s.b", "k8s.a", "k8s.b"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if a.key != "" {
		t.Fatalf("default key %q, want none (each service's own)", a.key)
	}
	b, err := parse([]string{"--endpoints", "x", "--key", "k8s.b+k8s.a", "k8s.a"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if b.key != "k8s.a+k8s.b" {
		t.Fatalf("--key k8s.b+k8s.a gave %q, want k8s.a+k8s.b", b.key)
	}
	for _, args := range [][]string{
		{"--endpoints", "x", "--max", "2", "--max-unavailable", "2", "k8s.a"},
		{"--endpoints", "x", "--max-unavailable", "0%", "k8s.a"},
		{"--endpoints", "x", "--window", "Mon 25:00-01:00", "k8s.a"},
	} {
		if _, err := parse(args, &errb, &errb); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// The etcd flags default to etcdctl's environment variables; a flag
// wins; ETCDCTL_USER may carry the password (issue 29, item 4).
func TestEtcdFromEnvironment(t *testing.T) {
	t.Setenv("ETCDCTL_ENDPOINTS", "https://10.0.0.1:2379,https://10.0.0.2:2379")
	t.Setenv("ETCDCTL_CACERT", "/etc/ca.crt")
	t.Setenv("ETCDCTL_CERT", "/etc/client.crt")
	t.Setenv("ETCDCTL_KEY", "/etc/client.key")
	t.Setenv("ETCDCTL_USER", "node:secret")
	t.Setenv("ETCDCTL_PASSWORD", "")
	var errb bytes.Buffer
	o, err := parse([]string{"k8s.kubelet"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if o.endpoints != "https://10.0.0.1:2379,https://10.0.0.2:2379" || o.etcdCA != "/etc/ca.crt" || o.etcdCert != "/etc/client.crt" ||
		o.etcdKey != "/etc/client.key" || o.etcdUser != "node" || o.etcdPassword != "secret" {
		t.Fatalf("from the environment: %+v", o)
	}
	o, err = parse([]string{"k8s.kubelet", "--endpoints", "http://127.0.0.1:2379", "--etcd-user", "other"}, &errb, &errb)
	if err != nil || o.endpoints != "http://127.0.0.1:2379" || o.etcdUser != "other" {
		t.Fatalf("flags over the environment: %+v %v", o, err)
	}
}

func TestFlagsAnywhere(t *testing.T) {
	var errb bytes.Buffer
	o, err := parse([]string{"k8s.kubelet", "--endpoints", "x", "--max-unavailable=25%", "k8s.containerd", "--", "k8s.kube-proxy"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if o.endpoints != "x" || o.maxUnavailable != "25%" || strings.Join(o.names, " ") != "k8s.kubelet k8s.containerd k8s.kube-proxy" {
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
	for _, want := range []string{"holders (0)", "waiters (1)", "node-b", "blocked by the lock-delay of node-a", "vanished holders", "node-a", "acted 7s ago, not ready since"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
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
}
