package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
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
	if code, out, errs := cmd("pause", key, "--endpoints", eps, "--holder", "alice", "--reason", "node-3 disk"); code != exitOK || !strings.Contains(out, "paused by alice") {
		t.Fatalf("pause: %d %q %q", code, out, errs)
	}
	code, out, errs := cmd("status", "--endpoints", eps, key)
	if code != exitOK {
		t.Fatalf("status: %d %q", code, errs)
	}
	for _, want := range []string{"key:      k8s.kube-apiserver", "max:      1", "paused:   by alice since", "(node-3 disk)", "holders (1)", "node-1 pid 4242", "waiters (0)"} {
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
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"status", "k", "--endpoints", "http://127.0.0.1:1", "--timeout", "1s"}, &out, &errb); code != exitRetryable {
		t.Fatalf("unreachable etcd: exit %d (%s)", code, errb.String())
	}
}

func TestHelpOnStdoutAndVersion(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"status", "--help"}, {"pause", "-h"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != exitOK || !strings.Contains(out.String(), "usage: snapsvc-rollout") || errb.Len() != 0 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, out.String(), errb.String())
		}
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != exitOK || !regexp.MustCompile(`^snapsvc-rollout \S+ \(github.com/snapsvc/snapsvc/etcdbudget, go[^)]*\)\n$`).MatchString(out.String()) {
			t.Errorf("%q: exit %d, stdout %q", args, code, out.String())
		}
	}
}

func TestDefaultKeySorted(t *testing.T) {
	var errb bytes.Buffer
	a, err := parse([]string{"--endpoints", "x", "k8s.b", "k8s.a", "k8s.b"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parse([]string{"--endpoints", "x", "k8s.a", "k8s.b"}, &errb, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if a.key != "k8s.a+k8s.b" || b.key != a.key {
		t.Fatalf("keys %q and %q, want both k8s.a+k8s.b", a.key, b.key)
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
