package etcdbudget

// Going around a member that hangs.
//
// A member that hangs (a frozen process or machine, a network that drops
// packets) keeps its gRPC connection READY until the client's keep-alive
// gives up on it: DialKeepAliveTime plus DialKeepAliveTimeout, 13 s with
// ClientConfig (gRPC raises a keep-alive time under 10 s to 10 s,
// google.golang.org/grpc dialoptions.go, WithKeepaliveParams). Until then
// the client's round-robin balancer keeps giving it its share of
// requests, and a retry is not sent to another member: the balancer
// counts every request of the process, so the retries of one call, made
// on the same Attempt cadence as everybody else's, can land on the hung
// member attempt after attempt (a CI run saw one release time out eight
// times in a row, 4.7 s, while two members of three answered at once).
// An Unreachable bound shorter than the keep-alive then fails a call,
// and a FailOpen budget would grant unbudgeted slots, with a quorum up.
//
// So an attempt that hung (its Attempt bound passed, the caller's
// context did not) has the endpoints diagnosed (diagnose: each asked
// directly, once a second at most for the whole budget), and when one
// member did not answer and another did, the client's later attempts go
// for detourFor through a connection of their own to one that answered
// (clientv3.Client.Dial: the client's credentials, interceptors and
// options, only that endpoint). An attempt that fails through it ends
// the detour; one that hangs through it has the endpoints diagnosed
// again. Only requests made through call are sent around a member;
// keep-alives and revokes are sent twice at once (hedge), one of the two
// through the detour while there is one.

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// detourFor is how long requests keep going around a member that hung
// before the client's balancer is tried again (the member may have come
// back, or the keep-alive closed its connection).
const detourFor = 5 * time.Second

// detours are one client's connections of its own to single endpoints,
// and the one requests go through while a member hangs. Every budget of
// a client shares them; they are closed with the client.
type detours struct {
	mu     sync.Mutex
	closed bool
	conns  map[string]*endpointConn
	via    *endpointConn // nil: the client's balancer
	until  time.Time
}

// endpointConn is a connection to one endpoint and the etcd APIs on it.
type endpointConn struct {
	endpoint string
	conn     *grpc.ClientConn
	kv       clientv3.KV
	lease    clientv3.Lease
}

// clientDetours holds each client's detours until the client is closed.
var clientDetours sync.Map // *clientv3.Client -> *detours

// detoursOf returns cli's detours, made on first use.
func detoursOf(cli *clientv3.Client) *detours {
	if d, ok := clientDetours.Load(cli); ok {
		return d.(*detours)
	}
	d, loaded := clientDetours.LoadOrStore(cli, &detours{conns: map[string]*endpointConn{}})
	if !loaded {
		context.AfterFunc(cli.Ctx(), func() {
			clientDetours.Delete(cli)
			d.(*detours).close()
		})
	}
	return d.(*detours)
}

func (d *detours) close() {
	d.mu.Lock()
	d.closed = true
	conns := d.conns
	d.conns, d.via = nil, nil
	d.mu.Unlock()
	for _, c := range conns {
		c.lease.Close()
		c.conn.Close()
	}
}

// current returns the connection requests go through now, nil for the
// client's balancer.
func (d *detours) current() *endpointConn {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.via != nil && time.Now().After(d.until) {
		d.via = nil
	}
	return d.via
}

// end ends the detour through c, if it is still the one taken.
func (d *detours) end(c *endpointConn) {
	d.mu.Lock()
	if d.via == c {
		d.via = nil
	}
	d.mu.Unlock()
}

// take sends requests through a connection of cli's own to endpoint for
// detourFor.
func (d *detours) take(cli *clientv3.Client, endpoint string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("the etcd client was closed")
	}
	c := d.conns[endpoint]
	if c == nil {
		conn, err := cli.Dial(endpoint)
		if err != nil {
			return err
		}
		c = &endpointConn{endpoint: endpoint, conn: conn,
			kv:    clientv3.NewKVFromKVClient(pb.NewKVClient(conn), cli),
			lease: clientv3.NewLeaseFromLeaseClient(pb.NewLeaseClient(conn), cli, 0)}
		d.conns[endpoint] = c
	}
	d.via, d.until = c, time.Now().Add(detourFor)
	return nil
}

// viaKey carries the endpointConn an attempt goes through in its context.
type viaKey struct{}

// kv is the KV an attempt's requests go through: the client's, or the
// detour's the attempt was given (attempt).
func (b *Budget) kv(actx context.Context) clientv3.KV {
	if c, _ := actx.Value(viaKey{}).(*endpointConn); c != nil {
		return c.kv
	}
	return b.cfg.Client.KV
}

// leases is the Lease API an attempt's requests go through (see kv).
func (b *Budget) leases(actx context.Context) clientv3.Lease {
	if c, _ := actx.Value(viaKey{}).(*endpointConn); c != nil {
		return c.lease
	}
	return b.cfg.Client.Lease
}

// routed gives ctx the detour requests go through now, if any, and
// returns it.
func (b *Budget) routed(ctx context.Context) (context.Context, *endpointConn) {
	c := detoursOf(b.cfg.Client).current()
	if c == nil {
		return ctx, nil
	}
	return context.WithValue(ctx, viaKey{}, c), c
}

// hung reports whether an attempt's error is its own Attempt bound
// passing while the caller's context is alive: no answer came.
func hung(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.DeadlineExceeded
}

// afterAttempt updates the detour once an attempt sent through via (nil:
// the balancer) failed with err and is to be retried: a failure through
// a detour ends it, and an attempt that hung has the endpoints diagnosed
// (within Attempt) to go around a member that gives no answer. A call
// that is ending instead (its Unreachable bound reached, a refusal, an
// answer such as a lease not found) does not wait for a diagnosis.
func (b *Budget) afterAttempt(ctx context.Context, via *endpointConn, err error) {
	d := detoursOf(b.cfg.Client)
	if via != nil {
		d.end(via)
	}
	if !hung(ctx, err) {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, b.cfg.Attempt)
	defer cancel()
	diag := b.diagnose(dctx)
	silent := false
	for _, e := range diag {
		silent = silent || e.Err != nil
	}
	if !silent {
		return // every member answered: the request was slow, not lost
	}
	for _, e := range diag {
		if e.Err == nil && (via == nil || e.Endpoint != via.endpoint) {
			if d.take(b.cfg.Client, e.Endpoint) == nil {
				b.detoured.Add(1)
			}
			return
		}
	}
}
