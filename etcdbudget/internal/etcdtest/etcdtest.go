// Package etcdtest runs real etcd clusters on loopback for etcdbudget's
// tests, benchmarks and demonstration: members are go.etcd.io/etcd's own
// server (embed.Etcd), either in this process (StartEmbedded) or, so that
// tests can kill -9 them, each in a child process that re-executes the
// running binary (StartProcesses, with MaybeRunMember in TestMain).
//
// Every member listens on free ports of a loopback address of its own
// cluster, keeps its data in a temporary directory, and is stopped and
// removed by Close. A child member also dies with its parent.
package etcdtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// MemberConfig is one member's part of a cluster.
type MemberConfig struct {
	Name           string `json:"name"`
	Dir            string `json:"dir"`
	PeerURL        string `json:"peer-url"`
	ClientURL      string `json:"client-url"`
	InitialCluster string `json:"initial-cluster"`
	Existing       bool   `json:"existing"` // restart of a member with data
}

func (m MemberConfig) embedConfig() (*embed.Config, error) {
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.Dir
	peer, err := url.Parse(m.PeerURL)
	if err != nil {
		return nil, err
	}
	client, err := url.Parse(m.ClientURL)
	if err != nil {
		return nil, err
	}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.InitialCluster = m.InitialCluster
	cfg.InitialClusterToken = "etcdtest"
	cfg.ClusterState = embed.ClusterStateFlagNew
	if m.Existing {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(m.Dir, "..", m.Name+".log")}
	return cfg, nil
}

// plan assigns n members' names, ports and directories under dir.
func plan(dir string, n int) ([]MemberConfig, error) {
	// A loopback address of our own (127.0.0.0/8 all reaches lo) keeps
	// the ports we pick from colliding with other tests on the machine.
	ip := fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(250), rand.IntN(255), 1+rand.IntN(250))
	var ms []MemberConfig
	var cluster []string
	for i := range n {
		pp, err := freePort(ip)
		if err != nil {
			return nil, err
		}
		cp, err := freePort(ip)
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("m%d", i)
		m := MemberConfig{Name: name, Dir: filepath.Join(dir, name),
			PeerURL: fmt.Sprintf("http://%s:%d", ip, pp), ClientURL: fmt.Sprintf("http://%s:%d", ip, cp)}
		ms = append(ms, m)
		cluster = append(cluster, name+"="+m.PeerURL)
	}
	for i := range ms {
		ms[i].InitialCluster = strings.Join(cluster, ",")
	}
	return ms, nil
}

func freePort(ip string) (int, error) {
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		return 0, fmt.Errorf("etcdtest: no free port on %s: %w", ip, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Embedded is a cluster whose members run in this process.
type Embedded struct {
	dir     string
	members []*embed.Etcd
	cfgs    []MemberConfig
}

// StartEmbedded starts an n-member cluster in this process and waits
// until it serves.
func StartEmbedded(n int) (*Embedded, error) {
	dir, err := os.MkdirTemp("", "etcdtest")
	if err != nil {
		return nil, err
	}
	cfgs, err := plan(dir, n)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &Embedded{dir: dir, cfgs: cfgs}
	errs := make(chan error, n)
	var mu sync.Mutex
	for _, m := range cfgs {
		go func() {
			cfg, err := m.embedConfig()
			if err == nil {
				var e *embed.Etcd
				e, err = embed.StartEtcd(cfg)
				if err == nil {
					mu.Lock()
					c.members = append(c.members, e)
					mu.Unlock()
					select {
					case <-e.Server.ReadyNotify():
					case <-time.After(time.Minute):
						err = errors.New("etcdtest: member not ready within a minute")
					}
				}
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Endpoints are the members' client URLs.
func (c *Embedded) Endpoints() []string { return endpoints(c.cfgs) }

// Close stops every member and removes their data.
func (c *Embedded) Close() {
	for _, e := range c.members {
		e.Close()
	}
	os.RemoveAll(c.dir)
}

func endpoints(cfgs []MemberConfig) []string {
	var out []string
	for _, m := range cfgs {
		out = append(out, m.ClientURL)
	}
	return out
}

// Client returns an etcd client of endpoints that logs nothing.
func Client(endpoints ...string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// memberEnv carries a child member's configuration.
const memberEnv = "ETCDTEST_MEMBER"

// MaybeRunMember runs this process as a cluster member when it was started
// as one by StartProcesses, and never returns then; otherwise it returns
// at once. Call it first in TestMain.
func MaybeRunMember() {
	raw := os.Getenv(memberEnv)
	if raw == "" {
		return
	}
	var m MemberConfig
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		fmt.Fprintln(os.Stderr, "etcdtest member:", err)
		os.Exit(2)
	}
	os.Exit(runMember(m))
}

func runMember(m MemberConfig) int {
	cfg, err := m.embedConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdtest member:", err)
		return 2
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdtest member:", err)
		return 1
	}
	defer e.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	parent := os.Getppid()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-sig:
			return 0
		case err := <-e.Err():
			fmt.Fprintln(os.Stderr, "etcdtest member:", err)
			return 1
		case <-tick.C:
			if os.Getppid() != parent { // the test binary is gone
				return 0
			}
		}
	}
}

// Processes is a cluster whose members each run in a child process, so
// that they can be killed.
type Processes struct {
	dir  string
	cfgs []MemberConfig
	mu   sync.Mutex
	cmds []*exec.Cmd
	done []chan struct{}
}

// StartProcesses starts an n-member cluster, each member a child process
// re-executing this binary (whose TestMain calls MaybeRunMember), and
// waits until every member serves.
func StartProcesses(ctx context.Context, n int) (*Processes, error) {
	dir, err := os.MkdirTemp("", "etcdtest")
	if err != nil {
		return nil, err
	}
	cfgs, err := plan(dir, n)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &Processes{dir: dir, cfgs: cfgs, cmds: make([]*exec.Cmd, n), done: make([]chan struct{}, n)}
	for i := range n {
		if err := p.start(i); err != nil {
			p.Close()
			return nil, err
		}
	}
	for i := range n {
		if err := p.WaitServing(ctx, i); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

func (p *Processes) start(i int) error {
	raw, err := json.Marshal(p.cfgs[i])
	if err != nil {
		return err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memberEnv+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdtest: start member %s: %w", p.cfgs[i].Name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmds[i], p.done[i] = cmd, done
	p.mu.Unlock()
	return nil
}

// Endpoints are the members' client URLs.
func (p *Processes) Endpoints() []string { return endpoints(p.cfgs) }

// Endpoint is member i's client URL.
func (p *Processes) Endpoint(i int) string { return p.cfgs[i].ClientURL }

// Pid is member i's process id (0 when it is not running).
func (p *Processes) Pid(i int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmds[i] == nil {
		return 0
	}
	return p.cmds[i].Process.Pid
}

// Kill kills member i with SIGKILL and waits until it is gone.
func (p *Processes) Kill(i int) {
	p.mu.Lock()
	cmd, done := p.cmds[i], p.done[i]
	p.cmds[i] = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Restart starts a killed member i again on its data.
func (p *Processes) Restart(i int) error {
	p.cfgs[i].Existing = true
	return p.start(i)
}

// WaitServing waits until member i answers a status request.
func (p *Processes) WaitServing(ctx context.Context, i int) error {
	cli, err := Client(p.cfgs[i].ClientURL)
	if err != nil {
		return err
	}
	defer cli.Close()
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Status(sctx, p.cfgs[i].ClientURL)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcdtest: member %s not serving: %w", p.cfgs[i].Name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close kills every member and removes their data.
func (p *Processes) Close() {
	for i := range p.cmds {
		p.Kill(i)
	}
	os.RemoveAll(p.dir)
}
