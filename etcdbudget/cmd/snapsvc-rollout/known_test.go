package main

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
)

func TestNearKeys(t *testing.T) {
	keys := []string{"k8s", "k8s.containerd", "k8s.kube-apiserver", "k8s.kubelet", "microceph.osd"}
	for _, tc := range []struct {
		key  string
		want []string
	}{
		{"k8s.kube-apiservr", []string{"k8s.kube-apiserver"}},
		{"k8s.kubelett", []string{"k8s.kubelet"}},
		{"K8S.Kubelet", []string{"k8s.kubelet"}},
		{"k8s.kube", []string{"k8s.kubelet", "k8s.kube-apiserver"}}, // the start of both; kubelet is nearer
		{"k9s", []string{"k8s"}},
		{"ceph", nil},
		{"zzz.zzz", nil},
	} {
		if got := nearKeys(tc.key, keys); !slices.Equal(got, tc.want) {
			t.Errorf("nearKeys(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

// A write to a key nothing has used fails, names the key and the keys it
// resembles, says how to create it on purpose, and writes nothing; a read
// notes it (issue 44, item 4: a typo'd key was paused, exit 0, then
// listed). kubectl answers `Error from server (NotFound)`, exit 1;
// etcdctl's writes to a user or lease that does not exist fail the same
// way, exit 1. The KEY arguments complete from etcd.
func TestUnknownKeyIsRefused(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := etcdtest.StartProcesses(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cli, err := etcdtest.Client(cl.Endpoints()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	t.Setenv("ETCDCTL_ENDPOINTS", strings.Join(cl.Endpoints(), ","))
	t.Setenv("SUDO_USER", "alice")
	cmd := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(ctx, args, &out, &errb)
		return code, out.String(), errb.String()
	}
	stored := func() []string {
		resp, err := cli.Get(ctx, etcdbudget.DefaultPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, kv := range resp.Kvs {
			keys = append(keys, string(kv.Key))
		}
		return keys
	}

	// Nothing used yet: refused, nothing written.
	code, out, errs := cmd("pause", "k8s.kube-apiserver")
	if code != exitNotFound || out != "" || !strings.Contains(errs, `error: budget key "k8s.kube-apiserver" not found under /snapsvc/restart-budget/`) ||
		!strings.Contains(errs, "No key has been used under this prefix at all: is --prefix right?") ||
		!strings.Contains(errs, "Nothing was written; to pause a key before its first rollout: snapsvc-rollout pause --create k8s.kube-apiserver") {
		t.Fatalf("pause of an unused key: %d %q %q", code, out, errs)
	}
	if keys := stored(); len(keys) != 0 {
		t.Fatalf("a refused pause wrote %q", keys)
	}
	// On purpose.
	if code, out, errs := cmd("pause", "--create", "--reason", "before its first rollout", "k8s.kube-apiserver"); code != exitOK || !strings.Contains(out, "k8s.kube-apiserver paused by alice@") {
		t.Fatalf("pause --create: %d %q %q", code, out, errs)
	}
	n := len(stored())
	// A typo of a key in use.
	code, out, errs = cmd("pause", "k8s.kube-apiservr")
	if code != exitNotFound || out != "" || !strings.Contains(errs, `budget key "k8s.kube-apiservr" not found`) || !strings.Contains(errs, "Did you mean k8s.kube-apiserver?") ||
		strings.Count(errs, "\n") != 1 {
		t.Fatalf("pause of a typo: %d %q %q", code, out, errs)
	}
	code, out, errs = cmd("resume", "k8s.kube-apiservr")
	if code != exitNotFound || out != "" || !strings.Contains(errs, "Did you mean k8s.kube-apiserver? Nothing was written.") {
		t.Fatalf("resume of a typo: %d %q %q", code, out, errs)
	}
	code, out, _ = cmd("pause", "-w", "json", "k8s.kube-apiservr")
	var doc struct {
		Error struct {
			Message   string `json:"message"`
			Retryable bool   `json:"retryable"`
		} `json:"error"`
	}
	if code != exitNotFound || json.Unmarshal([]byte(out), &doc) != nil || !strings.Contains(doc.Error.Message, "Did you mean k8s.kube-apiserver?") || doc.Error.Retryable {
		t.Fatalf("pause -w json of a typo: %d %q", code, out)
	}
	if m := len(stored()); m != n {
		t.Fatalf("refused writes stored %d keys more", m-n)
	}
	// Reads go on, with a note.
	code, out, errs = cmd("status", "k8s.kube-apiservr")
	if code != exitOK || !strings.Contains(out, "holders (0)") || !strings.HasPrefix(errs, `note: budget key "k8s.kube-apiservr" not found`) || !strings.Contains(errs, "Did you mean k8s.kube-apiserver?") {
		t.Fatalf("status of a typo: %d %q %q", code, out, errs)
	}
	if code, _, errs := cmd("status", "k8s.kube-apiserver"); code != exitOK || errs != "" {
		t.Fatalf("status of a key in use: %d %q", code, errs)
	}
	// The snap of a key in use is known: its pause holds the key.
	if code, _, errs := cmd("pause", "k8s"); code != exitOK {
		t.Fatalf("pause of the snap of a key in use: %d %q", code, errs)
	}
	for _, k := range []string{"k8s", "k8s.kube-apiserver"} {
		if code, _, errs := cmd("resume", k); code != exitOK {
			t.Fatalf("resume %s: %d %q", k, code, errs)
		}
	}
	if code, out, _ := cmd("list"); code != exitOK || strings.Contains(out, "apiservr") {
		t.Fatalf("list: %d %q", code, out)
	}

	// Completion of KEY: the keys in use (pause: also their snaps and
	// parts), read from etcd.
	if code, out, _ := cmd("__complete", "status", "k8s.k"); code != exitOK || !strings.HasPrefix(out, "k8s.kube-apiserver\n:4\n") {
		t.Fatalf("completion of status KEY: %d %q", code, out)
	}
	if code, out, _ := cmd("__complete", "pause", ""); code != exitOK || !strings.HasPrefix(out, "k8s\nk8s.kube-apiserver\n:4\n") {
		t.Fatalf("completion of pause KEY: %d %q", code, out)
	}
	if code, out, _ := cmd("__complete", "status", "k8s", ""); code != exitOK || out != ":4\n" {
		t.Fatalf("completion after KEY: %d %q", code, out)
	}
	if code, out, _ := cmd("__complete", "--budget-key", "k8s.ku"); code != exitOK || !strings.HasPrefix(out, "k8s.kube-apiserver\n:4\n") {
		t.Fatalf("completion of --budget-key: %d %q", code, out)
	}
	// etcd unreachable: nothing, within the completion's bound.
	start := time.Now()
	if code, out, _ := cmd("__complete", "status", "--endpoints", "http://127.0.0.1:1", "--dial-timeout", "10s", ""); code != exitOK || strings.Contains(out, "k8s") {
		t.Fatalf("completion with etcd unreachable: %d %q", code, out)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("completion with etcd unreachable took %s, want about %s", d, completeTimeout)
	}
}

// status --watch prints a status only when it changed, as kubectl get -w
// (issue 44, item 4: the same snapshot three times): a write to etcd that
// changes nothing shown prints nothing.
func TestWatchPrintsOnChangeOnly(t *testing.T) {
	checkLeaks(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, err := etcdtest.StartProcesses(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cli, err := etcdtest.Client(cl.Endpoints()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	const key = "k8s.kubelet"
	for _, format := range []string{"simple", "json"} {
		t.Run(format, func(t *testing.T) {
			b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Holder: "alice@ops-1"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.Pause(ctx, key, "disk alarm"); err != nil {
				t.Fatal(err)
			}
			o := &options{key: key, prefix: etcdbudget.DefaultPrefix, writeOut: format}
			request := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 5*time.Second) }
			var out syncBuffer
			wctx, stop := context.WithCancel(ctx)
			defer stop()
			done := make(chan error, 1)
			go func() { done <- watchStatus(wctx, cli, b, o, request, &out) }()
			shown := func() int {
				if format == "json" {
					return strings.Count(out.String(), "\n")
				}
				return strings.Count(out.String(), "(revision ")
			}
			await := func(what string, cond func() bool) {
				t.Helper()
				for !cond() {
					select {
					case err := <-done:
						t.Fatalf("watch ended (%v) before %s:\n%s", err, what, out.String())
					case <-ctx.Done():
						t.Fatalf("no %s:\n%s", what, out.String())
					case <-time.After(10 * time.Millisecond): // polling the output and a counter, not a synchronisation
					}
				}
			}
			await("first status", func() bool { return shown() == 1 })
			// The pause record written again as it is: an event, the
			// status read again, nothing changed.
			resp, err := cli.Get(ctx, etcdbudget.DefaultPrefix+key+"#pause")
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("the pause record: %v", err)
			}
			reads := b.Stats().Requests
			if _, err := cli.Put(ctx, string(resp.Kvs[0].Key), string(resp.Kvs[0].Value)); err != nil {
				t.Fatal(err)
			}
			await("the status read again", func() bool { return b.Stats().Requests > reads })
			// A change: printed.
			if _, err := b.Resume(ctx, key); err != nil {
				t.Fatal(err)
			}
			await("the status once resumed", func() bool { return shown() >= 2 })
			stop()
			if err := <-done; err != context.Canceled {
				t.Fatalf("watch ended with %v", err)
			}
			got := out.String()
			if shown() != 2 {
				t.Fatalf("%d statuses, want 2:\n%s", shown(), got)
			}
			second := got[strings.LastIndex(strings.TrimSuffix(got, "\n"), "\n")+1:]
			if format == "simple" {
				second = got[strings.LastIndex(got, "(revision "):]
			}
			if strings.Contains(second, "alice@ops-1") {
				t.Fatalf("the second status is not the resumed one:\n%s", got)
			}
			t.Logf("%s", got)
		})
	}
}

// checkLeaks verifies, at the end of the test (after the clients and
// etcd members it made are closed), that no goroutine of ours is left.
func checkLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}
