package etcdbudget_test

import (
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/etcdbudget/internal/etcdtest"
)

// Endpoints are checked as etcd's client reads them, before anything is
// dialled: a malformed one is a configuration error said at once (issue
// 44, item 4: it was retried as unreachable until the dial timeout, and
// etcdctl 3.4 says only "context deadline exceeded" after 5 s).
func TestCheckEndpoints(t *testing.T) {
	for _, ep := range []string{"http://127.0.0.1:2379", "https://etcd-0.example.com:2379", "https://h:2379/", "127.0.0.1:2379",
		"[::1]:2379", "http://[::1]:2379", "etcd_0:2379", "unix:///run/etcd.sock", "unixs://etcd.sock:0", "unix:etcd.sock"} {
		if err := etcdbudget.CheckEndpoints([]string{ep}); err != nil {
			t.Errorf("%q: %v", ep, err)
		}
	}
	for _, tc := range []struct{ ep, want string }{
		{"", "empty (a stray comma?)"},
		{" http://127.0.0.1:2379", "spaces around it"},
		{"https//127.0.0.1:2379", `not a URL: did you mean "https://127.0.0.1:2379"?`},
		{"http:/127.0.0.1:2379", `did you mean "http://127.0.0.1:2379"?`},
		{"127.0.0.1", "missing port in address"},
		{"http://127.0.0.1", "want http://HOST:PORT: missing port in address"},
		{"htp://127.0.0.1:2379", `scheme "htp": etcd's client takes http://, https://, unix:// or unixs://`},
		{"http://127.0.0.1:2379:9", "not a URL: invalid port"},
		{"http://[::1", "not a URL: missing ']' in host"},
		{"http://10.0.0.1:2379/v3/kv", "a path, query or fragment"},
		{"http://root:pw@10.0.0.1:2379", "a user in the URL"},
		{"10.0.0.1:99999", `port "99999" is not a number from 1 to 65535`},
		{"etcd 1:2379", `host "etcd 1" is neither an IP address nor a host name`},
		{"etcd/1:2379", `host "etcd/1" is neither an IP address nor a host name`},
		{"unix://", "no socket path"},
	} {
		err := etcdbudget.CheckEndpoints([]string{"http://10.0.0.1:2379", tc.ep})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `etcd endpoint "`) {
			t.Errorf("%q: %v, want %q", tc.ep, err, tc.want)
		}
	}
	// NewClient checks them: at once, neither unavailable nor refused.
	start := time.Now()
	cfg := etcdbudget.ClientConfig([]string{"https//127.0.0.1:2379"})
	cli, err := etcdbudget.NewClient(cfg)
	if err == nil {
		cli.Close()
	}
	if err == nil || errors.Is(err, budget.ErrUnavailable) || errors.Is(err, budget.ErrRefused) || !strings.Contains(err.Error(), "did you mean") || time.Since(start) > time.Second {
		t.Fatalf("NewClient of a malformed endpoint: %v after %s", err, time.Since(start))
	}
}

// A scheme that does not match the member: plain gRPC (http://, or a bare
// HOST:PORT without TLS) to a member serving TLS, or https:// to one
// serving plain gRPC, is a refusal that says which scheme to use, at the
// first diagnosis (250 ms), never unreachability retried until the
// bound (issue 44, item 4: "retryable" after 2 s; etcdctl 3.4 says
// "context deadline exceeded" after 5 s).
func TestSchemeMismatch(t *testing.T) {
	checkLeaks(t)
	ctx := ctxT(t, 3*time.Minute)
	c := startTLSCluster(t, ctx, func(ca *etcdtest.CA, ip net.IP) (*etcdtest.Issued, error) {
		return ca.Issue(etcdtest.CertOptions{CommonName: "etcd-server", IPs: []net.IP{ip}})
	})
	acquire := func(t *testing.T, cli *clientv3.Client) {
		t.Helper()
		b := newBudget(t, cli, "node-a", 1, func(cfg *etcdbudget.Config) { cfg.FailOpen, cfg.Unreachable = true, 10*time.Second })
		start := time.Now()
		s, err := b.Acquire(ctx, uniqueKey(t), nil)
		if err == nil {
			s.Release(ctx)
		}
		took := time.Since(start)
		var se *etcdbudget.SchemeError
		if !errors.As(err, &se) {
			t.Errorf("want a *SchemeError, got %v", err)
		}
		refusedWell(t, b, err, took, "", "use https://"+c.host, "use http://")
		// Within the first diagnosis: far from the 10s bound.
		if took > 5*time.Second {
			t.Errorf("refused after %s, want at the first diagnosis", took)
		}
	}
	for _, ep := range []string{"http://" + c.host, c.host} {
		t.Run("plain to TLS "+ep, func(t *testing.T) {
			cli, err := etcdbudget.NewClient(etcdbudget.ClientConfig([]string{ep}))
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			acquire(t, cli)
		})
	}
	t.Run("http:// to TLS, plain client", func(t *testing.T) {
		cli, err := clientv3.New(etcdbudget.ClientConfig([]string{"http://" + c.host}))
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		acquire(t, cli)
	})
	t.Run("https:// to plain", func(t *testing.T) {
		p, err := etcdtest.StartProcesses(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		u, _ := url.Parse(p.Endpoint(0))
		cfg := etcdbudget.ClientConfig([]string{"https://" + u.Host})
		cfg.TLS = &tls.Config{RootCAs: c.ca.Pool()}
		cli, err := etcdbudget.NewClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		b := newBudget(t, cli, "node-a", 1, func(cfg *etcdbudget.Config) { cfg.FailOpen, cfg.Unreachable = true, 10*time.Second })
		start := time.Now()
		_, err = b.Status(ctx, uniqueKey(t))
		took := time.Since(start)
		refusedWell(t, b, err, took, u.Host, "the server speaks plain gRPC, not TLS: use http://"+u.Host)
		if took > 5*time.Second {
			t.Errorf("refused after %s, want at the first diagnosis", took)
		}
	})
}
