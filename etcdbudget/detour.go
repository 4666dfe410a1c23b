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
// So when an attempt gets no answer (its Attempt bound passed, the
// caller's context did not), every endpoint is asked for its status at
// once, each on a connection of its own, and the first to answer that it
// has a leader is taken: for detourFor, the requests the client's budgets
// send (through call and hedge) go through a connection to that member,
// shared by every budget of the client and made with the client's
// credentials, interceptors and options (clientv3.Client.Dial, only that
// endpoint), each request requiring a leader (clientv3.WithRequireLeader:
// a member cut off from the quorum fails it at once). What the detour does
// not keep is the client's retry of a request that failed as unavailable
// (its balancer's): such a failure ends the detour, and call retries. A
// member that hung through the detour starts a new search, avoiding it.
//
// Not covered: watches stay on the client's balancer (a waiter's silent
// watch is read again after Recheck, and gRPC's keep-alive moves it),
// and with a user and password the client authenticates each stream it
// opens through its balancer (go.etcd.io/etcd/client/v3
// retry_interceptor.go, streamClientInterceptor calls getToken), so a
// keep-alive may still wait on the hung member; a token or client
// certificates avoid that.

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// detourFor is how long requests keep going around a member that hung
// before the client's balancer is tried again (the member may have come
// back, or the keep-alive closed its connection).
const detourFor = 5 * time.Second

// detours are one client's connections to single endpoints, and the one
// requests go through while a member hangs. Every budget of a client
// shares them; they are closed with the client.
type detours struct {
	mu      sync.Mutex
	closed  bool
	conns   map[string]*endpointConn
	via     *endpointConn // nil: the client's balancer
	until   time.Time
	finding chan struct{} // closed when the search under way ends
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

// detoursOf returns cli's detours, made on first use; nil once cli is
// closed.
func detoursOf(cli *clientv3.Client) *detours {
	if d, ok := clientDetours.Load(cli); ok {
		return d.(*detours)
	}
	if cli.Ctx().Err() != nil {
		return nil
	}
	d, loaded := clientDetours.LoadOrStore(cli, &detours{conns: map[string]*endpointConn{}})
	if !loaded {
		context.AfterFunc(cli.Ctx(), func() {
			clientDetours.CompareAndDelete(cli, d)
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
	if d == nil {
		return nil
	}
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

// take sends requests through a connection of cli's to endpoint for
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

// find searches, within ctx, for a member to go through instead of the
// client's balancer, avoiding the endpoint avoid (one that hung through
// the detour), and takes the first found. A search under way is joined
// instead. It reports whether it took a detour itself.
func (d *detours) find(ctx context.Context, cli *clientv3.Client, avoid string) bool {
	d.mu.Lock()
	if busy := d.finding; busy != nil {
		d.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
		}
		return false
	}
	busy := make(chan struct{})
	d.finding = busy
	d.mu.Unlock()
	defer func() {
		d.mu.Lock()
		d.finding = nil
		d.mu.Unlock()
		close(busy)
	}()
	ep := firstWithLeader(ctx, cli, avoid)
	return ep != "" && d.take(cli, ep) == nil
}

// firstWithLeader asks every endpoint of cli but avoid for its status at
// once and returns the first to answer that it has a leader ("" if none
// did before ctx ended). It returns once every question has ended.
func firstWithLeader(ctx context.Context, cli *clientv3.Client, avoid string) string {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	found := make(chan string, 1)
	var wg sync.WaitGroup
	for _, ep := range cli.Endpoints() {
		if ep == avoid {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if st, err := askStatus(ctx, cli, ep); err == nil && st.Leader != 0 {
				select {
				case found <- ep:
					cancel()
				default:
				}
			}
		}()
	}
	wg.Wait()
	select {
	case ep := <-found:
		return ep
	default:
		return ""
	}
}

// viaKey carries the endpointConn an attempt goes through in its context
// (a nil one: the client's balancer).
type viaKey struct{}

// kv is the KV an attempt's requests go through: the client's, or the
// detour's the attempt was given (routed).
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

// routed gives ctx the detour requests go through now, if any, requiring
// a leader of the member, and returns it.
func (b *Budget) routed(ctx context.Context) (context.Context, *endpointConn) {
	c := detoursOf(b.cfg.Client).current()
	if c == nil {
		return ctx, nil
	}
	return clientv3.WithRequireLeader(context.WithValue(ctx, viaKey{}, c)), c
}

// hung reports whether an attempt's error is its own Attempt bound
// passing while the caller's context is alive: no answer came.
func hung(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	code, _ := codeOf(err)
	return errors.Is(err, context.DeadlineExceeded) || code == codes.DeadlineExceeded
}

// afterAttempt updates the detour once an attempt of a call sent through
// via (nil: the balancer) failed with err and is to be retried: a failure
// through a detour ends it, and an attempt that got no answer searches
// for a member to go through, unless another call took a detour
// meanwhile. The search waits at most Attempt, and never past what is
// left of out's Unreachable bound.
func (b *Budget) afterAttempt(ctx context.Context, out *outage, via *endpointConn, err error) {
	d := detoursOf(b.cfg.Client)
	if d == nil {
		return
	}
	if via != nil {
		d.end(via)
	}
	if !hung(ctx, err) || d.current() != nil {
		return
	}
	wait := min(b.cfg.Attempt, out.bound-out.lasted())
	if wait <= 0 {
		return
	}
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	avoid := ""
	if via != nil {
		avoid = via.endpoint
	}
	if d.find(fctx, b.cfg.Client, avoid) {
		b.detoured.Add(1)
	}
}
