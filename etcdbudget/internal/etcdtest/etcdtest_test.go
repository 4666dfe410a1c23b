package etcdtest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// A member that exits before it serves fails the start at once, quoting
// its output, instead of leaving the caller to wait out its bound (a CI
// run waited 2 minutes for a cluster whose member was gone).
func TestStartFailsAtOnceWhenAMemberExits(t *testing.T) {
	script := t.TempDir() + "/etcd"
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho 'listen tcp: address already in use' >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	UseInstalledEtcd(script)
	defer UseInstalledEtcd("")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := StartProcesses(ctx, 3)
	if err == nil {
		p.Close()
		t.Fatal("a cluster of members that exit at once started")
	}
	if ctx.Err() != nil || !strings.Contains(err.Error(), "exited (exit status 3) before it served") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("error %v (context: %v); want the member's exit and its output, before the bound", err, ctx.Err())
	}
}

// The ports of one cluster are distinct: two members never get one port.
func TestPlanPortsAreDistinct(t *testing.T) {
	for range 20 {
		ms, err := plan(t.TempDir(), 5, Options{})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, m := range ms {
			for _, u := range []string{m.PeerURL, m.ClientURL} {
				if seen[u] {
					t.Fatalf("port %s handed out twice: %+v", u, ms)
				}
				seen[u] = true
			}
		}
	}
}
