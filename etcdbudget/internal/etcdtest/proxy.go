package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a loopback TCP proxy to a cluster's members, one listener per
// member: a client built on its Endpoints reaches etcd only through it,
// so a test can take one machine's network away while its process and
// its client stay up.
//
//   - Hold delays: bytes read are held back, connections stay open, and
//     everything held is delivered once the hold ends (a network that
//     stalls; TCP delivers late).
//   - Cut partitions: while cut, every byte read from either side is
//     dropped and a new connection is accepted but never connected to
//     its member (nothing answers, nothing is refused: requests end only
//     by their own timeouts). A request sent during a cut never reaches
//     etcd. When the cut ends, every connection that lived through it is
//     closed (its streams lost bytes; TCP connections reset after a
//     partition) and the client dials again; a cut that never ends is a
//     machine partitioned for good.
//
// It is test support for etcdbudget's tests, not API.
type Proxy struct {
	ls      []net.Listener
	targets []string
	schemes []string

	mu     sync.Mutex
	cond   *sync.Cond
	held   bool
	cut    bool
	closed bool
	links  map[*link]struct{}
	wg     sync.WaitGroup

	dropped atomic.Int64
}

// link is one proxied connection: c from the client, u to the member
// (nil until dialled, and never dialled while cut).
type link struct {
	c, u net.Conn
	dead bool
}

// NewProxy starts a proxy to the members whose client URLs
// (http://ip:port) are targets, one loopback listener each.
func NewProxy(targets ...string) (*Proxy, error) {
	if len(targets) == 0 {
		return nil, fmt.Errorf("etcdtest: a proxy needs at least one member")
	}
	p := &Proxy{links: map[*link]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	for _, t := range targets {
		u, err := url.Parse(t)
		if err != nil || u.Host == "" {
			p.Close()
			return nil, fmt.Errorf("etcdtest: proxy target %q is not a client URL (http://ip:port)", t)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("etcdtest: proxy to %s: %w", t, err)
		}
		p.ls = append(p.ls, l)
		p.targets = append(p.targets, u.Host)
		p.schemes = append(p.schemes, u.Scheme)
	}
	for i, l := range p.ls {
		p.wg.Add(1)
		go p.serve(l, p.targets[i])
	}
	return p, nil
}

// Endpoints are the proxy's client URLs, one per member, in the order of
// the targets.
func (p *Proxy) Endpoints() []string {
	out := make([]string, len(p.ls))
	for i, l := range p.ls {
		out[i] = p.schemes[i] + "://" + l.Addr().String()
	}
	return out
}

// Hold holds back (on) or delivers and forwards again (off) every byte
// through the proxy.
func (p *Proxy) Hold(on bool) {
	p.mu.Lock()
	p.held = on
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Cut cuts the proxy's client off (on) or reconnects it (off): see Proxy.
// Reconnecting closes every connection that lived through the cut.
func (p *Proxy) Cut(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !on && p.cut {
		for l := range p.links {
			p.killLocked(l)
		}
	}
	p.cut = on
	p.cond.Broadcast()
}

// Dropped is how many bytes cuts have dropped so far.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Close closes the listeners and every connection, and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for _, l := range p.ls {
		l.Close()
	}
	for l := range p.links {
		p.killLocked(l)
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) killLocked(l *link) {
	l.dead = true
	l.c.Close()
	if l.u != nil {
		l.u.Close()
	}
	delete(p.links, l)
	p.cond.Broadcast()
}

func (p *Proxy) kill(l *link) {
	p.mu.Lock()
	p.killLocked(l)
	p.mu.Unlock()
}

func (p *Proxy) serve(ln net.Listener, target string) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		l := &link{c: c}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			return
		}
		p.links[l] = struct{}{}
		cut := p.cut
		if !cut {
			p.wg.Add(1)
		}
		p.mu.Unlock()
		if cut {
			continue // a black hole: closed when the cut ends
		}
		go p.connect(l, target)
	}
}

// connect dials l's member and starts copying both ways.
func (p *Proxy) connect(l *link, target string) {
	defer p.wg.Done()
	u, err := net.DialTimeout("tcp", target, 5*time.Second)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || l.dead {
		if u != nil {
			u.Close()
		}
		if !l.dead {
			p.killLocked(l)
		}
		return
	}
	l.u = u
	p.wg.Add(2)
	go p.pipe(l, l.c, u)
	go p.pipe(l, u, l.c)
}

// pipe copies src to dst: each chunk is held while the proxy holds,
// dropped while it is cut. The link ends with either side.
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		p.mu.Lock()
		for p.held && !p.cut && !l.dead {
			p.cond.Wait()
		}
		drop, dead := p.cut, l.dead
		p.mu.Unlock()
		if dead {
			return
		}
		if n > 0 {
			if drop {
				p.dropped.Add(int64(n))
			} else if _, werr := dst.Write(buf[:n]); werr != nil {
				p.kill(l)
				return
			}
		}
		if err != nil {
			p.kill(l)
			return
		}
	}
}
