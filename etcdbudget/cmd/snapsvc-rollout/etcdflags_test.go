package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// --endpoints defaults to etcdctl's, 127.0.0.1:2379, and
// $ETCDCTL_ENDPOINTS replaces it, as in etcdctl (issue 44, item 4: the
// help said "etcdctl's defaults" with no default endpoint). An unreachable
// default says it was the default.
func TestDefaultEndpoint(t *testing.T) {
	var errb bytes.Buffer
	o, err := parse([]string{"k8s.kubelet"}, &errb, &errb)
	if err != nil || o.endpoints != "127.0.0.1:2379" || o.endpointsFrom != defaultEndpointsFrom {
		t.Fatalf("no --endpoints: %+v %v", o, err)
	}
	t.Setenv("ETCDCTL_ENDPOINTS", "https://10.0.0.1:2379")
	o, err = parse([]string{"k8s.kubelet"}, &errb, &errb)
	if err != nil || o.endpoints != "https://10.0.0.1:2379" || o.endpointsFrom != "$ETCDCTL_ENDPOINTS" {
		t.Fatalf("$ETCDCTL_ENDPOINTS: %+v %v", o, err)
	}
	unreachable := fmt.Errorf("%w: reading the status of k: connection refused", snapsvc.ErrBudgetUnavailable)
	if got := endpointHint(&options{endpointsFrom: defaultEndpointsFrom}, unreachable); !errors.Is(got, snapsvc.ErrBudgetUnavailable) ||
		!strings.HasSuffix(got.Error(), "(no --endpoints or $ETCDCTL_ENDPOINTS given: tried etcdctl's default, 127.0.0.1:2379)") {
		t.Errorf("hint: %v", got)
	}
	if got := endpointHint(&options{endpointsFrom: "$ETCDCTL_ENDPOINTS"}, unreachable); got != unreachable {
		t.Errorf("hint for endpoints given: %v", got)
	}
}

// A malformed endpoint is a usage error said at once, naming where it
// came from, never "retryable" after the dial timeout (issue 44, item 4;
// etcdctl 3.4: "context deadline exceeded" after its 5 s command timeout,
// exit 1).
func TestMalformedEndpoints(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), k8s())
	for _, tc := range []struct{ ep, bad, want string }{
		{"https//127.0.0.1:2379", "https//127.0.0.1:2379", `not a URL: did you mean "https://127.0.0.1:2379"?`},
		{"127.0.0.1", "127.0.0.1", "missing port in address"},
		{"htp://127.0.0.1:2379", "htp://127.0.0.1:2379", `scheme "htp"`},
		{"http://127.0.0.1:2379:9", "http://127.0.0.1:2379:9", "invalid port"},
		{"http://127.0.0.1:2379,", "", "empty (a stray comma?)"},
		{"", "", "empty"},
	} {
		for _, args := range [][]string{
			{"status", "k8s.kubelet"},
			{"pause", "k8s.kubelet"},
			{"list"},
			{"--socket", srv.SocketPath(), "k8s.kubelet"},
		} {
			var out, errb bytes.Buffer
			start := time.Now()
			code := run(context.Background(), append(args, "--dial-timeout", "10s", "--endpoints", tc.ep), &out, &errb)
			if code != exitUsage || !strings.HasPrefix(errb.String(), fmt.Sprintf("error: --endpoints: etcd endpoint %q: ", tc.bad)) ||
				!strings.Contains(errb.String(), tc.want) || !strings.Contains(errb.String(), "--help' for usage.") {
				t.Errorf("%q --endpoints %q: exit %d\n%s", args, tc.ep, code, errb.String())
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("%q --endpoints %q: %s, want at once", args, tc.ep, d)
			}
		}
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("%d restarts", n)
	}
	t.Setenv("ETCDCTL_ENDPOINTS", "10.0.0.1")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"status", "k8s.kubelet"}, &out, &errb); code != exitUsage || !strings.HasPrefix(errb.String(), `error: $ETCDCTL_ENDPOINTS: etcd endpoint "10.0.0.1": `) {
		t.Errorf("$ETCDCTL_ENDPOINTS=10.0.0.1: exit %d\n%s", code, errb.String())
	}
}

// A CA file with no certificate in it says so (issue 44, item 4: etcd's
// client read it as an empty pool, and every server was "signed by
// unknown authority"; etcdctl 3.4: "context deadline exceeded" after 5 s).
func TestCAFileWithoutCertificate(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"empty.pem": "",
		"junk.pem":  "not a certificate\n",
		"key.pem":   "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIHXl\n-----END PRIVATE KEY-----\n",
	}
	whys := map[string]string{"empty.pem": "the file is empty", "junk.pem": "no PEM block", "key.pem": "it holds PRIVATE KEY, no CERTIFICATE"}
	srv := fake.NewServer(t, fake.AllowNonRoot(), k8s())
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"status", "k8s.kubelet"}, {"--socket", srv.SocketPath(), "k8s.kubelet"}} {
			var out, errb bytes.Buffer
			code := run(context.Background(), append(args, "--endpoints", "https://127.0.0.1:1", "--cacert", path), &out, &errb)
			want := "error: etcd TLS: no certificate found in CA file " + path + " (" + whys[name]
			if code != exitUsage || !strings.HasPrefix(errb.String(), want) {
				t.Errorf("%q --cacert %s: exit %d\n%s\nwant %q", args, name, code, errb.String(), want)
			}
		}
	}
	if n := len(srv.Changes()); n != 0 {
		t.Fatalf("%d restarts", n)
	}
}
