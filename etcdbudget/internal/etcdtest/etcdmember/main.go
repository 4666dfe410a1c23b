// Command etcdmember runs one member of an etcdtest cluster: go.etcd.io's
// own etcd server (embed.Etcd) configured from the JSON in
// $ETCDTEST_MEMBER. etcdtest builds and starts it; it is a module of its
// own so that etcd's server stays out of etcdbudget's module graph.
//
// It runs until SIGTERM or SIGINT, until the server fails, or until its
// parent (the test binary) is gone.
package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// memberConfig is etcdtest.MemberConfig, the JSON contract between them.
type memberConfig struct {
	Name           string `json:"name"`
	Dir            string `json:"dir"`
	PeerURL        string `json:"peer-url"`
	ClientURL      string `json:"client-url"`
	InitialCluster string `json:"initial-cluster"`
	Existing       bool   `json:"existing"`
	CertFile       string `json:"cert-file,omitempty"`
	KeyFile        string `json:"key-file,omitempty"`
	TrustedCAFile  string `json:"trusted-ca-file,omitempty"`
	ClientCertAuth bool   `json:"client-cert-auth,omitempty"`
}

func (m memberConfig) embedConfig() (*embed.Config, error) {
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
	if m.CertFile != "" {
		// etcd's --cert-file, --key-file, --trusted-ca-file and
		// --client-cert-auth: the client URL serves TLS; with client
		// certificate auth, a user is the certificate's common name
		// when auth is enabled.
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: m.CertFile, KeyFile: m.KeyFile, TrustedCAFile: m.TrustedCAFile, ClientCertAuth: m.ClientCertAuth}
		cfg.ClientAutoTLS = false
	}
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(m.Dir, "..", m.Name+".log")}
	return cfg, nil
}

func main() {
	var m memberConfig
	if err := json.Unmarshal([]byte(os.Getenv("ETCDTEST_MEMBER")), &m); err != nil {
		fmt.Fprintln(os.Stderr, "etcdmember: $ETCDTEST_MEMBER:", err)
		os.Exit(2)
	}
	os.Exit(run(m))
}

func run(m memberConfig) int {
	cfg, err := m.embedConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdmember:", err)
		return 2
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdmember:", err)
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
			fmt.Fprintln(os.Stderr, "etcdmember:", err)
			return 1
		case <-tick.C:
			if os.Getppid() != parent { // the test binary is gone
				return 0
			}
		}
	}
}
