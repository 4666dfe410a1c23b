package probe_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
	"github.com/snapsvc/snapsvc/testsupport/testnet"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// statusServer answers the given statuses in turn, then the last one
// forever, and counts requests.
func statusServer(t *testing.T, body string, codes ...int) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		code := codes[min(i, len(codes)-1)]
		w.WriteHeader(code)
		if code != http.StatusOK {
			w.Write([]byte(body))
		}
	}))
	t.Cleanup(ts.Close)
	return ts, &n
}

func TestWaitHTTPSuccessThreshold(t *testing.T) {
	ts, hits := statusServer(t, "[-]etcd failed", 503, 503, 200, 503, 200, 200)
	mc := fake.NewManualClock(t0)
	errc := make(chan error, 1)
	go func() {
		errc <- probe.Wait(context.Background(), &probe.HTTP{URL: ts.URL + "/readyz"},
			probe.Options{Interval: time.Second, Timeout: time.Hour, SuccessThreshold: 2, Clock: testclock.Of(mc)})
	}()
	if err := testclock.Drive(t, mc, time.Minute, errc); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	// 503 503 200 503 200 200: two in a row only at the sixth check.
	if got := hits.Load(); got != 6 {
		t.Errorf("checks = %d, want 6", got)
	}
	if got := mc.Now().Sub(t0); got != 5*time.Second {
		t.Errorf("waited %v on the clock, want 5s (five intervals)", got)
	}
}

func TestWaitMaxWaitNamesProbeAndLastError(t *testing.T) {
	ts, hits := statusServer(t, "[-]etcd failed: not ready", 503)
	p := &probe.HTTP{URL: ts.URL + "/readyz"}
	mc := fake.NewManualClock(t0)
	errc := make(chan error, 1)
	go func() {
		errc <- probe.Wait(context.Background(), p,
			probe.Options{Interval: time.Second, Timeout: time.Hour, MaxWait: 3 * time.Second, Clock: testclock.Of(mc)})
	}()
	err := testclock.Drive(t, mc, time.Minute, errc)
	if err == nil {
		t.Fatal("Wait succeeded against a server answering 503")
	}
	var nr *probe.NotReadyError
	if !errors.As(err, &nr) || !errors.Is(err, probe.ErrNotReady) {
		t.Fatalf("error %T %v is not a NotReadyError", err, err)
	}
	msg := err.Error()
	for _, want := range []string{"GET " + ts.URL + "/readyz", "503 Service Unavailable", "etcd failed: not ready", "maximum wait exceeded (3s)", "4 checks"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not mention %q", msg, want)
		}
	}
	if hits.Load() != 4 || nr.Checks != 4 {
		t.Errorf("checks: server saw %d, error says %d; want 4 (t=0,1,2,3s)", hits.Load(), nr.Checks)
	}
	if nr.Waited != 3*time.Second {
		t.Errorf("Waited = %v, want 3s", nr.Waited)
	}
}

func TestCheckTimeout(t *testing.T) {
	calls := 0
	blocked := probe.Func("hangs", func(ctx context.Context) error {
		calls++
		<-ctx.Done()
		return ctx.Err()
	})
	mc := fake.NewManualClock(t0)
	errc := make(chan error, 1)
	go func() {
		errc <- probe.Wait(context.Background(), blocked,
			probe.Options{Interval: time.Second, Timeout: 2 * time.Second, MaxWait: 4 * time.Second, Clock: testclock.Of(mc)})
	}()
	err := testclock.Drive(t, mc, time.Hour, errc)
	var cte *probe.CheckTimeoutError
	if !errors.As(err, &cte) || cte.Timeout != 2*time.Second {
		t.Fatalf("error %v does not carry the check timeout", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "probe hangs") || !strings.Contains(msg, "check timed out after 2s") {
		t.Errorf("error %q does not name the probe and the timeout", msg)
	}
	// Checks at 0s (times out at 2s) and 3s (times out at 5s, past MaxWait).
	if calls != 2 {
		t.Errorf("calls = %d, want 2", calls)
	}
}

func TestWaitContextCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	p := probe.Func("never", func(context.Context) error {
		n++
		if n == 2 {
			cancel()
		}
		return errors.New("connection refused")
	})
	mc := fake.NewManualClock(t0)
	errc := make(chan error, 1)
	go func() { errc <- probe.Wait(ctx, p, probe.Options{Interval: time.Second, Clock: testclock.Of(mc)}) }()
	err := testclock.Drive(t, mc, time.Minute, errc)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, probe.ErrNotReady) {
		t.Fatalf("err = %v, want not ready, context canceled", err)
	}
	if !strings.Contains(err.Error(), "last error: connection refused") {
		t.Errorf("error %q lacks the last error", err)
	}
}

func TestTCPAndUnix(t *testing.T) {
	ctx := context.Background()
	addr, stop := testnet.AcceptAndClose(t)
	if err := (probe.TCP{Address: addr}).Check(ctx); err != nil {
		t.Errorf("TCP %s: %v", addr, err)
	}
	stop()
	err := (probe.TCP{Address: addr}).Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("TCP to a closed port: %v, want connection refused", err)
	}

	sock := filepath.Join(t.TempDir(), "containerd.sock")
	up := probe.Unix{Path: sock}
	if err := up.Check(ctx); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Unix to a missing socket: %v, want not exist", err)
	}
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	if err := up.Check(ctx); err != nil {
		t.Errorf("Unix %s: %v", sock, err)
	}
	if got := up.String(); got != "unix "+sock {
		t.Errorf("String = %q", got)
	}
}

func TestExec(t *testing.T) {
	ctx := context.Background()
	if err := (probe.Exec{Command: []string{"sh", "-c", "exit 0"}}).Check(ctx); err != nil {
		t.Errorf("exit 0: %v", err)
	}
	err := (probe.Exec{Command: []string{"sh", "-c", "echo containerd not up >&2; exit 3"}}).Check(ctx)
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "containerd not up") {
		t.Errorf("exit 3: %v, want status and output", err)
	}
	if err := (probe.Exec{}).Check(ctx); err == nil {
		t.Error("empty command succeeded")
	}
}

func TestHTTPExpectStatusAndUnixSocket(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized) // alive, but wants credentials
	})}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	defer func() { srv.Close(); <-done }()

	p := &probe.HTTP{URL: "http://localhost/healthz", UnixSocket: sock}
	if err := p.Check(context.Background()); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("401 with default expectations: %v", err)
	}
	p.ExpectStatus = []int{200, 401}
	if err := p.Check(context.Background()); err != nil {
		t.Errorf("401 expected: %v", err)
	}
}

func TestHTTPSCAAndHostOverride(t *testing.T) {
	var gotHost, gotSNI atomic.Value
	ts := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHost.Store(r.Host)
		gotSNI.Store(r.TLS.ServerName)
	}))
	defer ts.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})
	ctx := context.Background()

	// Without the CA the server is not trusted.
	if err := (&probe.HTTP{URL: ts.URL}).Check(ctx); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("untrusted server: %v, want a certificate error", err)
	}
	// Reached by IP, verified and addressed by name (httptest's
	// certificate is valid for example.com).
	p := &probe.HTTP{URL: ts.URL + "/readyz", CAPEM: caPEM, Host: "example.com"}
	if err := p.Check(ctx); err != nil {
		t.Fatalf("with CA and host override: %v", err)
	}
	if gotHost.Load() != "example.com" || gotSNI.Load() != "example.com" {
		t.Errorf("server saw Host %v, SNI %v; want example.com for both", gotHost.Load(), gotSNI.Load())
	}
	// A CA file works the same; a wrong server name fails verification.
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	os.WriteFile(caFile, caPEM, 0o600)
	p = &probe.HTTP{URL: ts.URL, CAFile: caFile, ServerName: "wrong.test"}
	if err := p.Check(ctx); err == nil || !strings.Contains(err.Error(), "wrong.test") {
		t.Errorf("wrong server name: %v", err)
	}
	p.ServerName = ""
	if err := p.Check(ctx); err != nil {
		t.Errorf("CA file: %v", err)
	}
	p.CAFile = filepath.Join(t.TempDir(), "missing.crt")
	if err := p.Check(ctx); err == nil || !strings.Contains(err.Error(), "reading CA bundle") {
		t.Errorf("missing CA file: %v", err)
	}
}

func TestHTTPSClientCertificate(t *testing.T) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kubelet"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)

	var cn atomic.Value
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cn.Store(r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	ts.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	ts.StartTLS()
	defer ts.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})

	ctx := context.Background()
	if err := (&probe.HTTP{URL: ts.URL, CAPEM: caPEM}).Check(ctx); err == nil {
		t.Error("no client certificate: succeeded")
	}
	if err := (&probe.HTTP{URL: ts.URL, CAPEM: caPEM, CertFile: certFile, KeyFile: keyFile}).Check(ctx); err != nil {
		t.Fatalf("with client certificate: %v", err)
	}
	if cn.Load() != "kubelet" {
		t.Errorf("server saw client %v", cn.Load())
	}
}

// A wait cancelled in the middle of a check reports the failure before,
// not the cancellation of the check.
func TestWaitCancelledMidCheckKeepsLastFailure(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	p := probe.Func("apiserver", func(cctx context.Context) error {
		n++
		if n == 1 {
			return errors.New("status 503: etcd not ready")
		}
		cancel()
		<-cctx.Done()
		return cctx.Err()
	})
	mc := fake.NewManualClock(t0)
	errc := make(chan error, 1)
	go func() {
		errc <- probe.Wait(ctx, p, probe.Options{Interval: time.Second, Timeout: time.Hour, Clock: testclock.Of(mc)})
	}()
	err := testclock.Drive(t, mc, time.Minute, errc)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "last error: status 503: etcd not ready") {
		t.Errorf("err = %v", err)
	}
}
