package etcdbudget

// Why etcd cannot be reached, endpoint by endpoint.
//
// etcd's client sends every request with gRPC's WaitForReady(true)
// (go.etcd.io/etcd/client/v3 options.go, defaultWaitForReady): a request
// on a connection that cannot be made waits for it until its context
// ends, and the client then returns the bare context error
// (client.go, ContextError), whatever stopped the connection: a refused
// TCP connection, a TLS handshake that failed (unknown authority, an
// expired certificate, a client certificate the server rejects). So a
// budget whose requests time out asks each endpoint directly: a
// connection of its own to that endpoint, made with the client's own
// credentials (clientv3.Client.Dial), and a Maintenance.Status request
// sent with WaitForReady(false). gRPC fails such a request at once, with
// codes.Unavailable and the connection's last error, once the connection
// is in TRANSIENT_FAILURE (google.golang.org/grpc picker_wrapper.go,
// pick: "RPCs should fail with unavailable" when failfast), so the cause
// reaches the caller: "transport: authentication handshake failed: tls:
// failed to verify certificate: x509: certificate signed by unknown
// authority", "connection refused", "remote error: tls: expired
// certificate".

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/snapsvc/snapsvc/budget"
)

// EndpointError is why one etcd endpoint could not be used.
type EndpointError struct {
	// Endpoint is the endpoint's URL.
	Endpoint string
	// Err is what connecting to it and asking it for its status gave
	// (nil: it answered).
	Err error
}

func (e EndpointError) String() string {
	if e.Err == nil {
		return e.Endpoint + ": answered"
	}
	return e.Endpoint + ": " + e.Err.Error()
}

// endpointsString renders every endpoint's outcome.
func endpointsString(es []EndpointError) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.String()
	}
	return strings.Join(parts, "; ")
}

// isTLSFailure reports whether err is a TLS handshake or certificate
// failure (either side's): retrying cannot help until an operator acts.
func isTLSFailure(err error) bool {
	if err == nil {
		return false
	}
	var r serverRejected
	var se *SchemeError
	if errors.As(err, &r) || errors.As(err, &se) {
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "authentication handshake failed") || strings.Contains(msg, "x509:") ||
		strings.Contains(msg, "tls:") || strings.Contains(msg, "certificate")
}

// serverRejected: an https endpoint closed the connection right after the
// TLS handshake, before gRPC's server preface. In TLS 1.3 the client's
// handshake completes before the server has checked the client's
// certificate; a server that rejects it sends an alert and closes, and
// when the client had already sent its HTTP/2 preface the close is a
// reset that can discard the alert ("connection closed before server
// preface received", "broken pipe", "connection reset by peer"). For a
// client whose TLS configuration the budget does not know (not built by
// NewClient) this is judged a TLS failure: a refusal, never a fail-open
// grant.
type serverRejected struct{ msg string }

func (e serverRejected) Error() string {
	return e.msg + " (the server closed the connection right after the TLS handshake, as it does when it rejects the client's certificate)"
}

// clientTLS remembers the TLS configuration of the clients NewClient
// built (nil: none), until they are closed, so that a diagnosis can make
// a TLS handshake of its own and read the server's verdict, and knows
// whether a bare HOST:PORT endpoint is dialled with TLS.
var clientTLS sync.Map // *clientv3.Client -> *tls.Config

func rememberTLS(cli *clientv3.Client, cfg *tls.Config) {
	clientTLS.Store(cli, cfg)
	context.AfterFunc(cli.Ctx(), func() { clientTLS.Delete(cli) })
}

// refusedEndpoints is the refusal of endpoints of which at least one
// failed its TLS handshake.
type refusedEndpoints []EndpointError

func (r refusedEndpoints) Error() string {
	for _, e := range r {
		var se *SchemeError
		if e.Err != nil && !errors.As(e.Err, &se) {
			return "TLS failed on " + endpointsString(r)
		}
	}
	return "wrong scheme: " + endpointsString(r)
}

// Unwrap returns each endpoint's error (errors.As finds a *SchemeError).
func (r refusedEndpoints) Unwrap() []error {
	var errs []error
	for _, e := range r {
		if e.Err != nil {
			errs = append(errs, e.Err)
		}
	}
	return errs
}

// tlsRefusal returns an error naming the endpoints when at least one of
// them failed its TLS handshake and none answered (all: every one must
// have failed its handshake), else nil.
func tlsRefusal(es []EndpointError, all bool) error {
	tlsFailed, answered := 0, 0
	for _, e := range es {
		switch {
		case e.Err == nil:
			answered++
		case isTLSFailure(e.Err):
			tlsFailed++
		}
	}
	if answered > 0 || tlsFailed == 0 || (all && tlsFailed < len(es)) {
		return nil
	}
	return refusedEndpoints(es)
}

// diagnosis caches the budget's last look at its endpoints for a second,
// so that many requests failing together probe each endpoint once.
type diagnosis struct {
	mu   sync.Mutex
	at   time.Time
	last []EndpointError
	busy chan struct{} // closed when the probe under way ends
}

// diagnose probes every endpoint of the budget's client at once, each
// bounded by Config.Attempt and ctx.
func (b *Budget) diagnose(ctx context.Context) []EndpointError {
	d := &b.diag
	for {
		d.mu.Lock()
		if d.last != nil && time.Since(d.at) < time.Second {
			out := d.last
			d.mu.Unlock()
			return out
		}
		if busy := d.busy; busy != nil {
			d.mu.Unlock()
			select {
			case <-busy:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		busy := make(chan struct{})
		d.busy = busy
		d.mu.Unlock()
		out := b.probeEndpoints(ctx)
		d.mu.Lock()
		d.last, d.at, d.busy = out, time.Now(), nil
		d.mu.Unlock()
		close(busy)
		return out
	}
}

func (b *Budget) probeEndpoints(ctx context.Context) []EndpointError {
	eps := b.cfg.Client.Endpoints()
	out := make([]EndpointError, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = EndpointError{Endpoint: ep, Err: b.probeEndpoint(ctx, ep)}
		}()
	}
	wg.Wait()
	return out
}

// probeEndpoint asks ep for its status on a connection of its own, with
// the client's credentials, failing fast (see the top of this file).
func (b *Budget) probeEndpoint(ctx context.Context, ep string) error {
	pctx, cancel := context.WithTimeout(ctx, b.cfg.Attempt)
	defer cancel()
	_, err := askStatus(pctx, b.cfg.Client, ep)
	switch {
	case err == nil:
		return nil
	case pctx.Err() != nil && ctx.Err() == nil:
		return fmt.Errorf("no answer within %s (a member that hangs, or a network that drops packets)", b.cfg.Attempt)
	}
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
		msg := connectionError(st.Message())
		if plain, known := b.dialsPlain(ep); known {
			if serr := schemeMismatch(pctx, ep, msg, plain); serr != nil {
				return serr
			}
		}
		if !secure(ep) || isTLSFailure(errors.New(msg)) || strings.HasPrefix(msg, "dial ") {
			return errors.New(msg)
		}
		// Connected over TLS, then the connection failed: the server's
		// verdict on the client certificate may have been lost with a
		// reset (the client had sent its HTTP/2 preface). Ask with a
		// handshake of our own when the configuration is known
		// (NewClient): it sends nothing after the handshake and reads the
		// alert.
		if cfg, ok := clientTLS.Load(b.cfg.Client); ok && cfg.(*tls.Config) != nil {
			if herr := handshake(pctx, ep, cfg.(*tls.Config)); isTLSFailure(herr) {
				return herr
			}
			return errors.New(msg)
		}
		for _, after := range []string{"closed before server preface", "broken pipe", "connection reset by peer"} {
			if strings.Contains(msg, after) {
				return serverRejected{msg}
			}
		}
		return errors.New(msg)
	}
	return rpctypes.Error(err)
}

// dialsPlain reports whether the budget's client dials ep without TLS,
// and whether that is known: http:// is plain and https:// TLS whatever
// the client's configuration (etcd's client/v3 internal/endpoint); a bare
// HOST:PORT is TLS when the client has a TLS configuration, known only
// for a client NewClient built.
func (b *Budget) dialsPlain(ep string) (plain, known bool) {
	switch {
	case strings.HasPrefix(ep, "http://"):
		return true, true
	case strings.HasPrefix(ep, "https://"):
		return false, true
	case strings.Contains(ep, "://") || strings.HasPrefix(ep, "unix"):
		return false, false
	}
	cfg, ok := clientTLS.Load(b.cfg.Client)
	return ok && cfg.(*tls.Config) == nil, ok
}

// askStatus asks ep for its status on a connection of its own, made with
// cli's credentials, failing fast when no connection can be made.
func askStatus(ctx context.Context, cli *clientv3.Client, ep string) (*pb.StatusResponse, error) {
	conn, err := cli.Dial(ep)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(false))
}

// secure reports whether ep is served over TLS.
func secure(ep string) bool {
	return strings.HasPrefix(ep, "https://") || strings.HasPrefix(ep, "unixs://")
}

// connectionError shortens gRPC's message of a failed connection to its
// cause: `connection error: desc = "transport: Error while dialing: dial
// tcp 127.0.0.1:1: connect: connection refused"` is "dial tcp
// 127.0.0.1:1: connect: connection refused".
func connectionError(msg string) string {
	msg = strings.TrimPrefix(msg, "connection error: desc = ")
	msg = strings.Trim(msg, `"`)
	msg = strings.TrimPrefix(msg, "transport: ")
	return strings.TrimPrefix(msg, "Error while dialing: ")
}

// connecting reports whether the client has no ready connection to any
// endpoint (every one failing or still connecting): then a diagnosis
// tells why at once. A client with one ready connection (a member that
// hangs, quorum lost with one member up) is diagnosed only when the
// Unreachable bound is reached.
func (b *Budget) connecting() bool {
	conn := b.cfg.Client.ActiveConnection()
	return conn != nil && conn.GetState() != connectivity.Ready
}

// NewClient is clientv3.New with endpoints checked first
// (CheckEndpoints: a malformed one fails at once, neither unavailable nor
// refused: a configuration error) and errors that say which endpoints were
// tried and why each failed. A budget whose client NewClient built also
// knows its TLS configuration, which makes its diagnosis of a server that
// rejects the client's certificate exact. When the client cannot be built (it
// authenticates at once when cfg has a user and password, within
// cfg.DialTimeout), it probes each endpoint with a TCP connection and,
// for https endpoints, a TLS handshake with cfg.TLS. A failed handshake
// or a refused authentication wraps budget.ErrRefused (retrying
// cannot help), anything else budget.ErrUnavailable.
func NewClient(cfg clientv3.Config) (*clientv3.Client, error) {
	if err := CheckEndpoints(cfg.Endpoints); err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cfg)
	if err == nil {
		rememberTLS(cli, cfg.TLS)
		return cli, nil
	}
	if isRefusal(err) {
		return nil, fmt.Errorf("%w: etcd at %s refused the client: %w", budget.ErrRefused, strings.Join(cfg.Endpoints, ","), err)
	}
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	es := make([]EndpointError, len(cfg.Endpoints))
	var wg sync.WaitGroup
	for i, ep := range cfg.Endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := handshake(ctx, ep, cfg.TLS)
			// A scheme that does not match the server: the handshake
			// of a plain endpoint is only a TCP connection.
			plain := strings.HasPrefix(ep, "http://") || (!strings.Contains(ep, "://") && cfg.TLS == nil)
			if (err == nil) == plain {
				msg := ""
				if err != nil {
					msg = err.Error()
				}
				if serr := schemeMismatch(ctx, ep, msg, plain); serr != nil {
					err = serr
				}
			}
			es[i] = EndpointError{Endpoint: ep, Err: err}
		}()
	}
	wg.Wait()
	if r := tlsRefusal(es, false); r != nil {
		return nil, fmt.Errorf("%w: etcd client: %w (client: %v)", budget.ErrRefused, r, err)
	}
	return nil, fmt.Errorf("%w: etcd client: %v (endpoints: %s)", budget.ErrUnavailable, err, endpointsString(es))
}

// handshake connects to ep and, for https (or a non-nil tlsCfg), makes a
// TLS handshake and waits briefly for the server's verdict on the client
// certificate (in TLS 1.3 the server sends it after the client's
// handshake has completed: an alert such as "certificate required" or
// "expired certificate" arrives with the first read).
func handshake(ctx context.Context, ep string, tlsCfg *tls.Config) error {
	u, err := url.Parse(ep)
	host := ep
	useTLS := tlsCfg != nil
	if err == nil && u.Host != "" {
		host, useTLS = u.Host, secure(ep) || tlsCfg != nil
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return err
	}
	defer raw.Close()
	if !useTLS {
		return nil
	}
	cfg := &tls.Config{}
	if tlsCfg != nil {
		cfg = tlsCfg.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(host)
	}
	cfg.NextProtos = []string{"h2"}
	conn := tls.Client(raw, cfg)
	if err := conn.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var buf [1]byte
	if _, err := conn.Read(buf[:]); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // no alert: the server accepted the handshake
		}
		return fmt.Errorf("TLS: %w", err)
	}
	return nil
}
