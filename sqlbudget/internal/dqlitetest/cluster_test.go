//go:build libsqlite3

package dqlitetest

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/canonical/go-dqlite/app"
	"github.com/canonical/go-dqlite/client"
	"github.com/canonical/go-dqlite/driver"
	"go.uber.org/goleak"
)

// A node is this test binary re-executed with nodeEnv set: a go-dqlite
// app node (its own data directory, a loopback address) that joins the
// cluster, prints "ready" once it serves, and runs until killed. A node
// restarted on its directory rejoins with its data.
const nodeEnv = "DQLITETEST_NODE"

type nodeConfig struct {
	Dir     string   `json:"dir"`
	Address string   `json:"address"`
	Join    []string `json:"join,omitempty"`
}

func TestMain(m *testing.M) {
	maybeRunNode()
	maybeRunHolder()
	maybeRunMachine()
	code := m.Run()
	if shared != nil {
		shared.Close()
	}
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func silent(client.LogLevel, string, ...interface{}) {}

func maybeRunNode() {
	raw := os.Getenv(nodeEnv)
	if raw == "" {
		return
	}
	var cfg nodeConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	opts := []app.Option{app.WithAddress(cfg.Address), app.WithLogFunc(silent)}
	if len(cfg.Join) > 0 {
		opts = append(opts, app.WithCluster(cfg.Join))
	}
	a, err := app.New(cfg.Dir, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err = a.Ready(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "node not ready:", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	a.Close()
	os.Exit(0)
}

// Cluster is a dqlite cluster whose nodes run in child processes.
type Cluster struct {
	env   []string // added to each node's environment
	dir   string
	nodes []nodeConfig
	mu    sync.Mutex
	cmds  []*exec.Cmd
	done  []chan struct{}
}

// startCluster starts n nodes, one after the other (each joins the
// first), and waits until every node is ready and the cluster answers
// SQL.
func startCluster(ctx context.Context, n int, env ...string) (*Cluster, error) {
	dir, err := os.MkdirTemp("", "dqlitetest")
	if err != nil {
		return nil, err
	}
	ip := fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(250), rand.IntN(255), 1+rand.IntN(250))
	c := &Cluster{env: env, dir: dir, cmds: make([]*exec.Cmd, n), done: make([]chan struct{}, n)}
	for i := range n {
		port, err := freePort(ip)
		if err != nil {
			c.Close()
			return nil, err
		}
		nc := nodeConfig{Dir: filepath.Join(dir, fmt.Sprintf("n%d", i)), Address: fmt.Sprintf("%s:%d", ip, port)}
		if i > 0 {
			nc.Join = []string{c.nodes[0].Address}
		}
		if err := os.MkdirAll(nc.Dir, 0o755); err != nil {
			c.Close()
			return nil, err
		}
		c.nodes = append(c.nodes, nc)
	}
	for i := range n {
		if err := c.start(ctx, i); err != nil {
			c.Close()
			return nil, err
		}
	}
	db := c.DB("startup")
	defer db.Close()
	for {
		if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS dqlitetest_ping (n INTEGER)"); err == nil {
			return c, nil
		} else if ctx.Err() != nil {
			c.Close()
			return nil, fmt.Errorf("dqlitetest: the cluster does not answer SQL: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func freePort(ip string) (int, error) {
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		return 0, fmt.Errorf("dqlitetest: no free port on %s: %w", ip, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start starts node i and waits until it says it is ready.
func (c *Cluster) start(ctx context.Context, i int) error {
	raw, _ := json.Marshal(c.nodes[i])
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), c.env...), nodeEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dqlitetest: start node %d: %w", i, err)
	}
	done := make(chan struct{})
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(ready)
			}
		}
		cmd.Wait()
		close(done)
	}()
	c.mu.Lock()
	c.cmds[i], c.done[i] = cmd, done
	c.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-done:
		return fmt.Errorf("dqlitetest: node %d exited before it was ready", i)
	case <-ctx.Done():
		return fmt.Errorf("dqlitetest: node %d not ready: %w", i, ctx.Err())
	}
}

// Addresses are the nodes' addresses.
func (c *Cluster) Addresses() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.Address)
	}
	return out
}

// DB opens the cluster's database "budget" through go-dqlite's driver, as
// a client of the cluster (one machine); the driver finds the leader.
func (c *Cluster) DB(name string) *sql.DB { return openDB(c.Addresses()) }

func openDB(addresses []string) *sql.DB {
	store := client.NewInmemNodeStore()
	var infos []client.NodeInfo
	for _, a := range addresses {
		infos = append(infos, client.NodeInfo{Address: a})
	}
	store.Set(context.Background(), infos)
	drv, err := driver.New(store, driver.WithLogFunc(silent), driver.WithConnectionTimeout(2*time.Second), driver.WithAttemptTimeout(time.Second), driver.WithConnectionBackoffCap(200*time.Millisecond))
	if err != nil {
		panic(err)
	}
	conn, err := drv.OpenConnector("budget")
	if err != nil {
		panic(err)
	}
	return sql.OpenDB(conn)
}

// Leader returns the index of the node that leads now (-1: none found).
func (c *Cluster) Leader(ctx context.Context) int {
	store := client.NewInmemNodeStore()
	var infos []client.NodeInfo
	for _, a := range c.Addresses() {
		infos = append(infos, client.NodeInfo{Address: a})
	}
	store.Set(ctx, infos)
	cli, err := client.FindLeader(ctx, store, client.WithLogFunc(silent))
	if err != nil {
		return -1
	}
	defer cli.Close()
	l, err := cli.Leader(ctx)
	if err != nil || l == nil {
		return -1
	}
	for i, n := range c.nodes {
		if n.Address == l.Address {
			return i
		}
	}
	return -1
}

// Pid is node i's process id (0: not running).
func (c *Cluster) Pid(i int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmds[i] == nil {
		return 0
	}
	return c.cmds[i].Process.Pid
}

// Kill kills node i (SIGKILL) and waits until it is gone.
func (c *Cluster) Kill(i int) {
	c.mu.Lock()
	cmd, done := c.cmds[i], c.done[i]
	c.cmds[i] = nil
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Restart starts killed node i again on its data directory.
func (c *Cluster) Restart(ctx context.Context, i int) error { return c.start(ctx, i) }

// Freeze stops node i (SIGSTOP): it keeps its sockets open and answers
// nothing, as a frozen machine. Thaw lets it run again.
func (c *Cluster) Freeze(i int) error { return syscall.Kill(c.Pid(i), syscall.SIGSTOP) }

// Thaw lets a frozen node run again (SIGCONT).
func (c *Cluster) Thaw(i int) error { return syscall.Kill(c.Pid(i), syscall.SIGCONT) }

// Close kills every node and removes their data.
func (c *Cluster) Close() {
	for i := range c.cmds {
		if pid := c.Pid(i); pid != 0 {
			syscall.Kill(pid, syscall.SIGCONT)
		}
		c.Kill(i)
	}
	os.RemoveAll(c.dir)
}

var (
	sharedOnce sync.Once
	shared     *Cluster
	sharedErr  error
)

// cluster returns the package's shared 3-node cluster, started on first
// use.
func cluster(t testing.TB) *Cluster {
	t.Helper()
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()
		shared, sharedErr = startCluster(ctx, 3)
		if sharedErr == nil {
			fmt.Fprintf(os.Stderr, "dqlitetest: 3-node cluster %v ready in %s\n", shared.Addresses(), time.Since(start).Round(time.Millisecond))
		}
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

// newCluster starts a 3-node cluster of the test's own (for faults that
// kill or freeze nodes), env added to each node's environment.
func newCluster(t *testing.T, env ...string) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := startCluster(ctx, 3, env...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}
