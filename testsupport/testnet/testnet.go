// Package testnet gives tests a real local listener to probe: it accepts
// connections and closes them at once.
package testnet

import (
	"net"
	"sync"
	"testing"
)

// AcceptAndClose listens on 127.0.0.1, accepting and closing connections
// until stop is called or the test ends. It returns the address and stop,
// which closes the listener and waits for its goroutine (safe to call
// twice).
func AcceptAndClose(t testing.TB) (addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { ln.Close(); wg.Wait() }) }
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}
