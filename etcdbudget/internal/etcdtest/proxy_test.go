package etcdtest

import (
	"bufio"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// echoServer answers every line with the same line, and counts the lines
// it received.
type echoServer struct {
	l     net.Listener
	mu    sync.Mutex
	lines []string
	wg    sync.WaitGroup
}

func newEchoServer(t *testing.T) *echoServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{l: l}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				r := bufio.NewReader(c)
				for {
					s, err := r.ReadString('\n')
					if err != nil {
						return
					}
					e.mu.Lock()
					e.lines = append(e.lines, s)
					e.mu.Unlock()
					if _, err := c.Write([]byte(s)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); e.wg.Wait() })
	return e
}

func (e *echoServer) received() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.lines...)
}

// roundTrip writes line and reads the answer within d.
func roundTrip(c net.Conn, r *bufio.Reader, line string, d time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(line)); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// A cut drops what is sent during it (it never arrives, even after the
// cut ends), answers nothing (no error before the caller's own timeout),
// black-holes new connections, and closes the connections that lived
// through it when it ends; new ones then work. A hold delivers late.
func TestProxy(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) }) // after the other cleanups
	e := newEchoServer(t)
	p, err := NewProxy("http://" + e.l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	addr := p.Endpoints()[0][len("http://"):]
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, bufio.NewReader(c)
	}
	c, r := dial()
	if s, err := roundTrip(c, r, "one\n", 10*time.Second); err != nil || s != "one\n" {
		t.Fatalf("through the proxy: %q, %v", s, err)
	}

	// Hold: nothing comes back while held; everything arrives once
	// released.
	p.Hold(true)
	if _, err := roundTrip(c, r, "two\n", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("held: %v, want a timeout", err)
	}
	p.Hold(false)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if s, err := r.ReadString('\n'); err != nil || s != "two\n" {
		t.Fatalf("after the hold: %q, %v (want the held line delivered)", s, err)
	}

	// Cut: silence, for the old connection and a new one.
	p.Cut(true)
	if _, err := roundTrip(c, r, "lost\n", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("cut: %v, want a timeout (silence, not an error)", err)
	}
	c2, r2 := dial() // accepted: a black hole, not a refusal
	if _, err := roundTrip(c2, r2, "lost too\n", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection while cut: %v, want a timeout", err)
	}
	if p.Dropped() == 0 {
		t.Error("the cut dropped nothing")
	}
	p.Cut(false)
	for _, cc := range []struct {
		c net.Conn
		r *bufio.Reader
	}{{c, r}, {c2, r2}} {
		cc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		s, err := cc.r.ReadString('\n')
		if err == nil || isTimeout(err) {
			t.Fatalf("a connection that lived through the cut: read %q, %v; want it closed when the cut ended", s, err)
		}
	}
	c3, r3 := dial()
	if s, err := roundTrip(c3, r3, "three\n", 10*time.Second); err != nil || s != "three\n" {
		t.Fatalf("after the cut: %q, %v", s, err)
	}
	for _, s := range e.received() {
		if s == "lost\n" || s == "lost too\n" {
			t.Errorf("%q, sent during the cut, reached the server", s)
		}
	}
	if got := e.received(); len(got) != 3 {
		t.Errorf("server received %q, want one, two, three", got)
	}
}
