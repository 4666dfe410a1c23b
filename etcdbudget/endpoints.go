package etcdbudget

// Endpoints as etcd's client reads them (go.etcd.io/etcd/client/v3
// internal/endpoint, translateEndpoint): http://HOST:PORT and
// https://HOST:PORT, unix://PATH and unixs://PATH, or a bare HOST:PORT
// (TLS when the client has a TLS configuration). Anything else is dialled
// as it is and fails only when a request times out, after the dial
// timeout, with a bare "context deadline exceeded": etcdctl 3.4 says
// just that after its 5 s command timeout. CheckEndpoints says at once
// what is wrong instead.
//
// And a scheme that does not match the server: http:// (plain gRPC)
// against a member that serves TLS, or https:// against one that serves
// plain gRPC, fails the same way, as if etcd were down. The diagnosis
// (diagnose.go) asks such an endpoint which it speaks.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// CheckEndpoints checks etcd client endpoints as etcd's client will read
// them: each is http://HOST:PORT, https://HOST:PORT, unix://PATH,
// unixs://PATH or HOST:PORT. The error names the first endpoint that is
// none of these and what is wrong with it: a configuration error, which
// no retry can fix. NewClient checks its endpoints with it.
func CheckEndpoints(endpoints []string) error {
	if len(endpoints) == 0 {
		return errors.New("no etcd endpoint")
	}
	for _, ep := range endpoints {
		if err := checkEndpoint(ep); err != nil {
			return fmt.Errorf("etcd endpoint %q: %s", ep, err)
		}
	}
	return nil
}

// checkEndpoint says what is wrong with ep (nil: nothing).
func checkEndpoint(ep string) error {
	switch {
	case ep == "":
		return errors.New("empty (a stray comma?)")
	case strings.TrimSpace(ep) != ep:
		return errors.New("spaces around it")
	case strings.HasPrefix(ep, "unix:") || strings.HasPrefix(ep, "unixs:"):
		_, path, _ := strings.Cut(ep, ":")
		if strings.TrimPrefix(path, "//") == "" {
			return errors.New("no socket path after the scheme")
		}
		return nil
	case !strings.Contains(ep, "://"):
		if fixed, ok := missingColonSlash(ep); ok {
			return fmt.Errorf("not a URL: did you mean %q?", fixed)
		}
		if err := checkHostPort(ep); err != nil {
			return fmt.Errorf("want http://HOST:PORT, https://HOST:PORT or HOST:PORT: %w", err)
		}
		return nil
	}
	u, err := url.Parse(ep)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("not a URL: %v", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("scheme %q: etcd's client takes http://, https://, unix:// or unixs://", u.Scheme)
	case u.User != nil:
		return errors.New("a user in the URL: give it with --user (etcdctl's flag) or Config.Username")
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return errors.New("a path, query or fragment: an endpoint is SCHEME://HOST:PORT only (etcd's client would ignore the rest)")
	}
	if err := checkHostPort(u.Host); err != nil {
		return fmt.Errorf("want %s://HOST:PORT: %w", u.Scheme, err)
	}
	return nil
}

// missingColonSlash returns ep as the URL it was meant to be when it is
// one with the "://" mistyped ("https//h:2379", "http:/h:2379").
func missingColonSlash(ep string) (string, bool) {
	for _, scheme := range []string{"https", "http"} {
		for _, typo := range []string{"//", ":/", ":"} {
			if rest, ok := strings.CutPrefix(ep, scheme+typo); ok && rest != "" && !strings.HasPrefix(rest, "/") {
				if typo == ":" {
					if _, err := strconv.Atoi(rest); err == nil {
						continue // "http:80" is host "http", port 80
					}
				}
				return scheme + "://" + rest, true
			}
		}
	}
	return "", false
}

// checkHostPort checks a HOST:PORT: a port from 1 to 65535 and a host
// that is an IP address or a host name (empty: this machine).
func checkHostPort(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return errors.New(ae.Err)
		}
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	if host == "" || net.ParseIP(host) != nil {
		return nil
	}
	for _, r := range host {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.' || r == '_') {
			return fmt.Errorf("host %q is neither an IP address nor a host name", host)
		}
	}
	return nil
}

// SchemeError is an endpoint whose scheme does not match what its server
// speaks: plain gRPC (http://, or HOST:PORT without TLS) to a member that
// serves TLS, or TLS (https://) to one that serves plain gRPC. It is a
// refusal (wrapped in budget.ErrRefused): no retry can fix it.
type SchemeError struct {
	// Endpoint is the endpoint as configured.
	Endpoint string
	// ServesTLS: the server answered a TLS handshake (else it answered
	// plain HTTP).
	ServesTLS bool
}

func (e *SchemeError) Error() string {
	host := hostOf(e.Endpoint)
	if e.ServesTLS {
		return fmt.Sprintf("the server speaks TLS, not plain gRPC: use https://%s (and the CA that signed its certificate: etcdctl's --cacert)", host)
	}
	return fmt.Sprintf("the server speaks plain gRPC, not TLS: use http://%s", host)
}

// hostOf is the HOST:PORT of an http(s):// or bare endpoint.
func hostOf(ep string) string {
	if u, err := url.Parse(ep); err == nil && u.Host != "" {
		return u.Host
	}
	return ep
}

// servesTLS reports whether the server at hostport answers a TLS
// handshake (of any certificate: this only tells the protocol, nothing is
// sent after the handshake).
func servesTLS(ctx context.Context, hostport string) bool {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return false
	}
	defer raw.Close()
	conn := tls.Client(raw, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // only to tell TLS from plain; no data is sent
	err = conn.HandshakeContext(ctx)
	var alert tls.AlertError
	return err == nil || errors.As(err, &alert) // an alert is TLS too (a server that wants a client certificate)
}

// servesPlainHTTP reports whether the server at hostport answers an
// HTTP/1.1 request for /version in the clear with 200 OK, as a plain etcd
// client port does (beside gRPC; a TLS server answers such a request 400
// at most).
func servesPlainHTTP(ctx context.Context, hostport string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return false
	}
	defer conn.Close()
	deadline := time.Now().Add(time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	if _, err := fmt.Fprintf(conn, "GET /version HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hostport); err != nil {
		return false
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "HTTP/1.1 200 ")
}

// schemeMismatch returns a *SchemeError when ep's connection failed
// (msg, from gRPC) because its scheme does not match its server's: a plain
// endpoint (plain: the client dials it without TLS) whose server answers
// a TLS handshake, or a TLS one whose server answers plain HTTP. Else nil.
func schemeMismatch(ctx context.Context, ep, msg string, plain bool) error {
	if strings.HasPrefix(ep, "unix") || strings.HasPrefix(msg, "dial ") {
		return nil // a socket, or no connection at all
	}
	host := hostOf(ep)
	switch {
	case plain && servesTLS(ctx, host):
		return &SchemeError{Endpoint: ep, ServesTLS: true}
	case !plain && (strings.Contains(msg, "EOF") || strings.Contains(msg, "connection reset by peer") ||
		strings.Contains(msg, "first record does not look like a TLS handshake")) && servesPlainHTTP(ctx, host):
		return &SchemeError{Endpoint: ep}
	}
	return nil
}
