package probe

import (
	"context"
	"fmt"
	"net"
)

// TCP succeeds when a TCP connection to Address ("host:port", local or
// remote) can be opened. The connection is closed at once.
type TCP struct {
	// Address is "host:port".
	Address string
}

// Check dials Address.
func (p TCP) Check(ctx context.Context) error { return dial(ctx, "tcp", p.Address) }

// String returns "tcp ADDRESS".
func (p TCP) String() string { return "tcp " + p.Address }

// Unix succeeds when a connection to the Unix stream socket at Path can be
// opened (the socket exists and something accepts on it, for example
// containerd's /run/containerd/containerd.sock).
type Unix struct {
	// Path is the socket's path.
	Path string
}

// Check dials Path.
func (p Unix) Check(ctx context.Context) error { return dial(ctx, "unix", p.Path) }

// String returns "unix PATH".
func (p Unix) String() string { return "unix " + p.Path }

func dial(ctx context.Context, network, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return fmt.Errorf("cannot connect: %w", err)
	}
	return conn.Close()
}
