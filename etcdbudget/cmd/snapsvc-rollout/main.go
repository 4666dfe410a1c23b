// Command snapsvc-rollout restarts snap services under a cluster-wide
// restart budget kept in etcd, so that the same command run on every
// machine gives a serial (or N-at-a-time) rollout: each machine waits for
// a slot, restarts, waits until the service is ready again (the readiness
// URL answers 2xx, then --settle), and only then gives the slot to the
// next machine.
//
//	snapsvc-rollout --endpoints https://10.0.0.1:2379,https://10.0.0.2:2379 \
//		--etcd-ca ca.crt --etcd-cert client.crt --etcd-key client.key \
//		--key k8s.kube-apiserver --max 1 \
//		--ready-url https://127.0.0.1:6443/readyz --ready-ca /etc/kubernetes/pki/ca.crt \
//		--settle 5s k8s.kube-apiserver
//
// Progress lines on stderr say who holds the slot and how many wait ahead;
// with --json, stdout carries one JSON object per event and a final
// {"result": ...} or {"error": ...} object.
//
// Flags: --endpoints (required unless --bootstrap), --key (default: the
// names joined with "+"), --max (default 1; every machine must use the
// same), --ttl (lease, default 10s), --unreachable (how long etcd may be
// unreachable before failing, default 15s), --fail-open (restart anyway
// when etcd stays unreachable), --bootstrap (no cluster exists yet:
// restart without a budget), --max-wait (bound on waiting for a slot),
// --holder (default "HOSTNAME pid PID"), --prefix, --ready-url,
// --ready-ca, --ready-cert, --ready-key, --ready-insecure,
// --ready-interval, --ready-timeout, --settle, --reload, --socket, --json,
// --timeout.
//
// Exit codes: 0 done and ready; 1 the restart failed, the service did not
// become ready, or the slot was lost mid-restart (check the service before
// running again); 2 usage; 3 retryable: etcd unreachable, no slot within
// --max-wait, snapd unreachable or busy; 130 interrupted.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/snapsvc/snapsvc/etcdbudget"
	"github.com/snapsvc/snapsvc/probe"
	"github.com/snapsvc/snapsvc/snapsvc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitRetryable   = 3
	exitInterrupted = 130
)

type options struct {
	endpoints, key, holder, prefix, socket      string
	etcdCA, etcdCert, etcdKey                   string
	readyURL, readyCA, readyCert, readyKey      string
	readyInsecure, jsonOut, failOpen, bootstrap bool
	reload                                      bool
	max                                         int
	ttl, unreachable, maxWait, settle, timeout  time.Duration
	readyInterval, readyTimeout                 time.Duration
	names                                       []string
}

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("snapsvc-rollout", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.endpoints, "endpoints", "", "etcd client URLs, comma-separated")
	fs.StringVar(&o.etcdCA, "etcd-ca", "", "CA bundle for etcd's certificate")
	fs.StringVar(&o.etcdCert, "etcd-cert", "", "client certificate for etcd")
	fs.StringVar(&o.etcdKey, "etcd-key", "", "client key for etcd")
	fs.StringVar(&o.key, "key", "", "budget key (default: the names joined with '+')")
	fs.IntVar(&o.max, "max", 1, "machines that may restart at once (the same on every machine)")
	fs.DurationVar(&o.ttl, "ttl", etcdbudget.DefaultTTL, "lease of the slot: a crashed machine's slot frees itself after this")
	fs.DurationVar(&o.unreachable, "unreachable", etcdbudget.DefaultUnreachable, "how long etcd may be unreachable before giving up")
	fs.BoolVar(&o.failOpen, "fail-open", false, "restart anyway, without a slot, when etcd stays unreachable")
	fs.BoolVar(&o.bootstrap, "bootstrap", false, "no cluster exists yet: restart without a budget")
	fs.DurationVar(&o.maxWait, "max-wait", 0, "give up when no slot is free within this (0: wait)")
	fs.StringVar(&o.holder, "holder", "", "identity shown to other machines (default HOSTNAME pid PID)")
	fs.StringVar(&o.prefix, "prefix", etcdbudget.DefaultPrefix, "etcd key prefix of the budget")
	fs.StringVar(&o.readyURL, "ready-url", "", "readiness URL that must answer 2xx before the slot is given back")
	fs.StringVar(&o.readyCA, "ready-ca", "", "CA bundle for the readiness URL")
	fs.StringVar(&o.readyCert, "ready-cert", "", "client certificate for the readiness URL")
	fs.StringVar(&o.readyKey, "ready-key", "", "client key for the readiness URL")
	fs.BoolVar(&o.readyInsecure, "ready-insecure", false, "do not verify the readiness URL's certificate")
	fs.DurationVar(&o.readyInterval, "ready-interval", time.Second, "pause between readiness checks")
	fs.DurationVar(&o.readyTimeout, "ready-timeout", 5*time.Minute, "how long the service may take to become ready")
	fs.DurationVar(&o.settle, "settle", 0, "keep the slot this long after the service is ready")
	fs.BoolVar(&o.reload, "reload", false, "reload services that support it instead of restarting")
	fs.StringVar(&o.socket, "socket", "", "snapd's socket (default /run/snapd.socket, or snapctl inside a snap)")
	fs.BoolVar(&o.jsonOut, "json", false, "JSON events and result on stdout")
	fs.DurationVar(&o.timeout, "timeout", 0, "bound on the whole command (0: none)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.names = fs.Args()
	switch {
	case len(o.names) == 0:
		return nil, errors.New("name at least one service, e.g. k8s.kube-apiserver")
	case o.endpoints == "" && !o.bootstrap:
		return nil, errors.New("--endpoints is required (or --bootstrap when no cluster exists yet)")
	case o.max < 1:
		return nil, fmt.Errorf("--max %d: must be at least 1", o.max)
	}
	for _, n := range o.names {
		if _, _, err := snapsvc.ValidateName(n); err != nil {
			return nil, err
		}
	}
	if o.key == "" {
		o.key = strings.Join(o.names, "+")
	}
	return o, nil
}

// printer writes progress lines to stderr, or JSON events to stdout.
type printer struct {
	mu     sync.Mutex
	json   bool
	stdout io.Writer
	stderr io.Writer
}

func (p *printer) event(ev snapsvc.BudgetEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		m := map[string]any{"time": ev.Time.UTC().Format(time.RFC3339Nano), "event": ev.Kind, "key": ev.Key}
		if ev.Holder != "" {
			m["holder"] = ev.Holder
		}
		if ev.Kind == "waiting" {
			m["holders"], m["ahead"], m["max"] = ev.Wait.Holders, ev.Wait.Ahead, ev.Wait.Max
		}
		if ev.Waited > 0 {
			m["waited"] = ev.Waited.String()
		}
		if ev.Err != nil {
			m["error"] = ev.Err.Error()
		}
		json.NewEncoder(p.stdout).Encode(m)
		return
	}
	ts := ev.Time.Format("15:04:05.000")
	switch ev.Kind {
	case "waiting":
		fmt.Fprintf(p.stderr, "%s waiting for %s: held by %s, %d ahead of us (max %d)\n", ts, ev.Key, strings.Join(ev.Wait.Holders, ", "), ev.Wait.Ahead, ev.Wait.Max)
	case "acquired":
		fmt.Fprintf(p.stderr, "%s acquired %s as %s after %s; restarting\n", ts, ev.Key, ev.Holder, ev.Waited.Round(time.Millisecond))
	case "ready":
		fmt.Fprintf(p.stderr, "%s %s ready\n", ts, ev.Key)
	case "released":
		fmt.Fprintf(p.stderr, "%s released %s\n", ts, ev.Key)
	case "lost":
		fmt.Fprintf(p.stderr, "%s LOST %s: %v\n", ts, ev.Key, ev.Err)
	}
}

func (p *printer) done(res *snapsvc.Result, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		if err != nil {
			var opErr *snapsvc.OpError
			retryable := errors.As(err, &opErr) && opErr.Retryable()
			json.NewEncoder(p.stdout).Encode(map[string]any{"error": map[string]any{"message": err.Error(), "retryable": retryable}})
			return
		}
		json.NewEncoder(p.stdout).Encode(map[string]any{"result": map[string]any{"change": res.ChangeID, "status": res.Status, "attempts": res.Attempts}})
		return
	}
	if err != nil {
		fmt.Fprintln(p.stderr, "error:", err)
		return
	}
	fmt.Fprintf(p.stderr, "done: change %s %s\n", res.ChangeID, res.Status)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "snapsvc-rollout:", err)
		return exitUsage
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	p := &printer{json: o.jsonOut, stdout: stdout, stderr: stderr}
	var copts []snapsvc.Option
	if o.socket != "" {
		copts = append(copts, snapsvc.WithSocket(o.socket))
	}
	if !o.bootstrap {
		cli, err := etcdClient(o)
		if err != nil {
			fmt.Fprintln(stderr, "snapsvc-rollout:", err)
			return exitUsage
		}
		defer cli.Close()
		b, err := etcdbudget.New(etcdbudget.Config{Client: cli, Prefix: o.prefix, Max: o.max, TTL: o.ttl,
			Holder: o.holder, Unreachable: o.unreachable, FailOpen: o.failOpen})
		if err != nil {
			fmt.Fprintln(stderr, "snapsvc-rollout:", err)
			return exitUsage
		}
		bopts := snapsvc.BudgetOptions{
			Key:      func(string) string { return o.key },
			Settle:   o.settle,
			MaxWait:  o.maxWait,
			Progress: p.event,
			Probe:    probe.Options{Interval: o.readyInterval, MaxWait: o.readyTimeout},
		}
		if o.readyURL != "" {
			ready := &probe.HTTP{URL: o.readyURL, CAFile: o.readyCA, CertFile: o.readyCert, KeyFile: o.readyKey, InsecureSkipVerify: o.readyInsecure}
			bopts.Ready = func(string) probe.Probe { return ready }
		}
		copts = append(copts, snapsvc.WithRestartBudget(b, bopts))
	}
	c, err := snapsvc.New(copts...)
	if err != nil {
		fmt.Fprintln(stderr, "snapsvc-rollout:", err)
		return exitUsage
	}
	defer c.Close()
	res, err := c.Restart(ctx, o.names, snapsvc.RestartOptions{Reload: o.reload})
	p.done(res, err)
	return exitCode(ctx, err)
}

func exitCode(ctx context.Context, err error) int {
	var opErr *snapsvc.OpError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		return exitInterrupted
	case errors.As(err, &opErr) && opErr.Retryable():
		return exitRetryable
	}
	return exitFailed
}

func etcdClient(o *options) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: strings.Split(o.endpoints, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if o.etcdCA != "" || o.etcdCert != "" {
		tlsCfg, err := transport.TLSInfo{TrustedCAFile: o.etcdCA, CertFile: o.etcdCert, KeyFile: o.etcdKey}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tlsCfg
	}
	return clientv3.New(cfg)
}
