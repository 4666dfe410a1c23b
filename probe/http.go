package probe

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
)

// HTTP succeeds when a GET of URL answers with an expected status, for
// example kube-apiserver's /readyz. Certificates and keys are read from
// their files at every check, so a probe may be set up before bootstrap
// writes them. No connection is kept between checks, no proxy is used and
// redirects are not followed (a 3xx is the answer).
type HTTP struct {
	// URL is the http:// or https:// address to GET.
	URL string
	// ExpectStatus lists the statuses that count as ready (default: any
	// 2xx).
	ExpectStatus []int
	// Header is added to the request (for example Authorization).
	Header http.Header
	// Host overrides the Host header. Unless ServerName is set, it also
	// overrides the TLS server name (SNI and the name the server's
	// certificate is checked against), so an endpoint can be reached by IP
	// while being verified by name.
	Host string
	// ServerName overrides the TLS server name alone.
	ServerName string
	// CAFile and CAPEM are PEM bundles of the certificate authorities to
	// trust instead of the system's.
	CAFile string
	CAPEM  []byte
	// CertFile and KeyFile are a PEM client certificate and key;
	// Certificates are client certificates already loaded.
	CertFile, KeyFile string
	Certificates      []tls.Certificate
	// InsecureSkipVerify disables verification of the server's
	// certificate. Prefer CAFile.
	InsecureSkipVerify bool
	// UnixSocket, when set, sends the request over this Unix socket
	// whatever the URL's host (for daemons serving HTTP on a socket).
	UnixSocket string
}

// String returns "GET URL", with the overrides that matter.
func (p *HTTP) String() string {
	s := "GET " + p.URL
	if p.UnixSocket != "" {
		s += " via " + p.UnixSocket
	}
	if p.Host != "" {
		s += " (host " + p.Host + ")"
	}
	return s
}

// maxBody bounds how much of an unexpected answer goes into the error.
const maxBody = 256

// Check makes one GET.
func (p *HTTP) Check(ctx context.Context) error {
	tr := &http.Transport{DisableKeepAlives: true, ForceAttemptHTTP2: false, Proxy: nil}
	if strings.HasPrefix(strings.ToLower(p.URL), "https:") {
		cfg, err := p.tlsConfig()
		if err != nil {
			return err
		}
		tr.TLSClientConfig = cfg
	}
	if p.UnixSocket != "" {
		sock := p.UnixSocket
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL, nil)
	if err != nil {
		return fmt.Errorf("bad request: %w", err)
	}
	for k, vs := range p.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if p.Host != "" {
		req.Host = p.Host
	}
	rsp, err := (&http.Client{Transport: tr, CheckRedirect: noRedirect}).Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) { // String already names the method and URL
			err = ue.Err
		}
		return err
	}
	defer rsp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(rsp.Body, maxBody+1))
	if p.statusOK(rsp.StatusCode) {
		return nil
	}
	text := strings.TrimSpace(string(body))
	if len(text) > maxBody {
		text = text[:maxBody] + "..."
	}
	want := "2xx"
	if len(p.ExpectStatus) > 0 {
		want = fmt.Sprint(p.ExpectStatus)
	}
	if text != "" {
		return fmt.Errorf("status %s (want %s): %q", rsp.Status, want, text)
	}
	return fmt.Errorf("status %s (want %s)", rsp.Status, want)
}

// noRedirect makes a redirect answer count as its own status.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func (p *HTTP) statusOK(code int) bool {
	if len(p.ExpectStatus) == 0 {
		return code >= 200 && code < 300
	}
	return slices.Contains(p.ExpectStatus, code)
}

func (p *HTTP) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{InsecureSkipVerify: p.InsecureSkipVerify, ServerName: p.ServerName}
	if cfg.ServerName == "" && p.Host != "" {
		host := p.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		cfg.ServerName = host
	}
	if p.CAFile != "" || len(p.CAPEM) > 0 {
		pool := x509.NewCertPool()
		if p.CAFile != "" {
			pem, err := os.ReadFile(p.CAFile)
			if err != nil {
				return nil, fmt.Errorf("reading CA bundle: %w", err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", p.CAFile)
			}
		}
		if len(p.CAPEM) > 0 && !pool.AppendCertsFromPEM(p.CAPEM) {
			return nil, errors.New("CAPEM holds no PEM certificate")
		}
		cfg.RootCAs = pool
	}
	cfg.Certificates = slices.Clone(p.Certificates)
	if p.CertFile != "" || p.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("loading client certificate: %w", err)
		}
		cfg.Certificates = append(cfg.Certificates, cert)
	}
	return cfg, nil
}
