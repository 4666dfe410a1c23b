// Package etcdtest runs real etcd clusters on loopback for etcdbudget's
// tests, benchmarks and demonstration: members are go.etcd.io/etcd's own
// server (embed.Etcd), each in a child process running the etcdmember
// command (StartEmbedded, StartProcesses), so tests can kill -9 them.
//
// etcdmember is a module of its own (./etcdmember), so that etcd's server
// is not in etcdbudget's module graph: a consumer of etcdbudget does not
// download or build it. etcdtest builds it on first use with the go
// command of the running toolchain (cached by content under the user's
// cache directory), or runs the binary named by $ETCDTEST_MEMBER_BIN.
//
// Every member listens on free ports of a loopback address of its own
// cluster, keeps its data in a temporary directory, and is stopped and
// removed by Close. A child member also dies with its parent.
package etcdtest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
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
	// Client TLS (https client URL): the server's certificate and key,
	// the CA its clients' certificates must chain to, and whether a
	// client certificate is required.
	CertFile       string `json:"cert-file,omitempty"`
	KeyFile        string `json:"key-file,omitempty"`
	TrustedCAFile  string `json:"trusted-ca-file,omitempty"`
	ClientCertAuth bool   `json:"client-cert-auth,omitempty"`
}

// loopbackIP picks a loopback address of our own (127.0.0.0/8 all
// reaches lo), which keeps the ports we pick from colliding with other
// tests on the machine.
func loopbackIP() string {
	return fmt.Sprintf("127.%d.%d.%d", 1+rand.IntN(250), rand.IntN(255), 1+rand.IntN(250))
}

// Options configure StartProcessesWith.
type Options struct {
	// IP is the loopback address the members listen on (default: one
	// picked at random; see LoopbackIP). A server certificate names it.
	IP string
	// TLS, when set, serves every member's client URL over https.
	TLS *TLSFiles
	// ClientTLS is the TLS configuration etcdtest's own checks (and
	// Client) use against https members: a CA that trusts the server's
	// certificate and, with ClientCertAuth, a client certificate it
	// accepts.
	ClientTLS *tls.Config
}

// TLSFiles are a member's server certificate, key and client CA.
type TLSFiles struct {
	CertFile, KeyFile, TrustedCAFile string
	// ClientCertAuth requires clients to present a certificate signed by
	// TrustedCAFile (etcd's --client-cert-auth).
	ClientCertAuth bool
}

// plan assigns n members' names, ports and directories under dir.
func plan(dir string, n int, o Options) ([]MemberConfig, error) {
	ip := o.IP
	if ip == "" {
		ip = loopbackIP()
	}
	ports, err := freePorts(ip, 2*n)
	if err != nil {
		return nil, err
	}
	var ms []MemberConfig
	var cluster []string
	for i := range n {
		pp, cp := ports[2*i], ports[2*i+1]
		name := fmt.Sprintf("m%d", i)
		m := MemberConfig{Name: name, Dir: filepath.Join(dir, name),
			PeerURL: fmt.Sprintf("http://%s:%d", ip, pp), ClientURL: fmt.Sprintf("http://%s:%d", ip, cp)}
		if o.TLS != nil {
			m.ClientURL = fmt.Sprintf("https://%s:%d", ip, cp)
			m.CertFile, m.KeyFile, m.TrustedCAFile, m.ClientCertAuth = o.TLS.CertFile, o.TLS.KeyFile, o.TLS.TrustedCAFile, o.TLS.ClientCertAuth
		}
		ms = append(ms, m)
		cluster = append(cluster, name+"="+m.PeerURL)
	}
	for i := range ms {
		ms[i].InitialCluster = strings.Join(cluster, ",")
	}
	return ms, nil
}

// freePorts returns n distinct free ports on ip: every listener stays open
// until all are picked, so the kernel cannot hand one port out twice (a
// listener closed at once may get the next bind(":0") the same port, and
// two members of one cluster would then fight for it).
func freePorts(ip string, n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: no free port on %s: %w", ip, err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Embedded is a cluster started by StartEmbedded. Its members run in
// child processes (they ran in the test's own process before etcd's server
// left etcdbudget's module graph); the API is unchanged.
type Embedded struct {
	p *Processes
}

// StartEmbedded starts an n-member cluster and waits until it serves
// (at most 2 minutes, counted once the member binary is built).
func StartEmbedded(n int) (*Embedded, error) {
	if _, err := MemberBinary(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p, err := StartProcesses(ctx, n)
	if err != nil {
		return nil, err
	}
	return &Embedded{p: p}, nil
}

// Endpoints are the members' client URLs.
func (c *Embedded) Endpoints() []string { return c.p.Endpoints() }

// Close stops every member and removes their data.
func (c *Embedded) Close() { c.p.Close() }

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

// MaybeRunMember returns at once. Members used to be this test binary
// re-executed; they are now the etcdmember command. It stays so that
// existing TestMain functions compile.
func MaybeRunMember() {}

// Processes is a cluster whose members each run in a child process, so
// that they can be killed.
type Processes struct {
	dir  string
	tls  *tls.Config // for https members
	cfgs []MemberConfig
	mu   sync.Mutex
	cmds []*exec.Cmd
	done []chan struct{}
}

// StartProcesses starts an n-member cluster, each member a child process
// running etcdmember (see MemberBinary), and waits until every member
// serves. Build the member binary first (MemberBinary, from TestMain) so
// that ctx bounds the start only: a cold build cache takes minutes.
func StartProcesses(ctx context.Context, n int) (*Processes, error) {
	return StartProcessesWith(ctx, n, Options{})
}

// StartProcessesWith is StartProcesses with options (TLS).
func StartProcessesWith(ctx context.Context, n int, o Options) (*Processes, error) {
	dir, err := os.MkdirTemp("", "etcdtest")
	if err != nil {
		return nil, err
	}
	cfgs, err := plan(dir, n, o)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if installedEtcd() == "" {
		if _, err := MemberBinary(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	p := &Processes{dir: dir, tls: o.ClientTLS, cfgs: cfgs, cmds: make([]*exec.Cmd, n), done: make([]chan struct{}, n)}
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
	var cmd *exec.Cmd
	if etcd := installedEtcd(); etcd != "" {
		cmd = exec.Command(etcd, etcdArgs(p.cfgs[i])...)
		cmd.Env = os.Environ()
		if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
			// etcd refuses to start on other architectures unless told.
			cmd.Env = append(cmd.Env, "ETCD_UNSUPPORTED_ARCH="+runtime.GOARCH)
		}
	} else {
		bin, err := MemberBinary()
		if err != nil {
			return err
		}
		cmd = exec.Command(bin)
		cmd.Env = append(os.Environ(), memberEnv+"="+string(raw))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// The member's own output, for WaitServing to quote should it exit.
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	logf, err := os.Create(p.logPath(i))
	if err != nil {
		return fmt.Errorf("etcdtest: member %s log: %w", p.cfgs[i].Name, err)
	}
	defer logf.Close() // the child has its own descriptor
	cmd.Stdout, cmd.Stderr = logf, logf
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

// logPath is where member i's standard output and error go (etcd's own
// log, at level error, is <name>.log beside it: etcdmember).
func (p *Processes) logPath(i int) string {
	return filepath.Join(p.dir, p.cfgs[i].Name+".out")
}

// exitedError says that member i exited before it served, with the end of
// its output and of etcd's log.
func (p *Processes) exitedError(i int, state *os.ProcessState) error {
	tail := func(path string) string {
		b, _ := os.ReadFile(path)
		const most = 2000
		if len(b) > most {
			b = b[len(b)-most:]
		}
		return string(b)
	}
	name := p.cfgs[i].Name
	return fmt.Errorf("etcdtest: member %s exited (%v) before it served; its last output:\n%s\netcd's log:\n%s",
		name, state, tail(p.logPath(i)), tail(filepath.Join(p.dir, name+".log")))
}

// WaitServing waits until member i answers a status request; it fails at
// once, quoting the member's output, should the member exit first.
func (p *Processes) WaitServing(ctx context.Context, i int) error {
	p.mu.Lock()
	cmd, done := p.cmds[i], p.done[i]
	p.mu.Unlock()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{p.cfgs[i].ClientURL}, DialTimeout: 5 * time.Second, TLS: p.tls, Logger: zap.NewNop()})
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
		case <-done:
			return p.exitedError(i, cmd.ProcessState)
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
