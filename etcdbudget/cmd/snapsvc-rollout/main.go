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
// Flags: --endpoints (required unless --bootstrap or $ETCDCTL_ENDPOINTS),
// --etcd-ca, --etcd-cert, --etcd-key, --etcd-user, --etcd-password (or
// $ETCDCTL_CACERT, $ETCDCTL_CERT, $ETCDCTL_KEY, $ETCDCTL_USER as USER or
// USER:PASSWORD, $ETCDCTL_PASSWORD, as etcdctl reads them; a flag wins),
// --key (one budget key for the whole restart; default: each service's
// own key, a snap name standing for every one of its services, so a
// restart of "k8s" on one machine and of "k8s.kube-apiserver" on another
// exclude each other while two different services do not),
// --max-unavailable (a count, or a percentage of the machines taking
// part, such as 25%: resolved once per rollout over the machines that
// joined within --join-period (default 10s) of the first, rounded down but
// at least 1, and pinned in etcd; default 1; every machine must use the
// same), --max (the same as a count), --window (a maintenance
// window such as "Mon-Fri 22:00-04:00 Europe/Berlin": outside it the
// command waits), --ttl (lease, default 10s), --unreachable (how long
// etcd may be unreachable before failing, default 15s), --fail-open
// (restart anyway when etcd stays unreachable), --bootstrap (no cluster
// exists yet: restart without a budget), --max-wait (bound on waiting for
// a slot), --holder (default "HOSTNAME pid PID"), --prefix, --ready-url,
// --ready-ca, --ready-cert, --ready-key, --ready-insecure,
// --ready-interval, --ready-timeout, --settle, --reload, --socket, --json,
// --timeout, --version, --help.
//
// Operator commands, with the same etcd flags:
//
//	snapsvc-rollout status KEY     who holds the key's slots (since when), who waits, in order
//	snapsvc-rollout pause KEY [--reason TEXT]
//	                               hold every machine at the front of the queue until resumed
//	snapsvc-rollout resume KEY
//
// Exit codes: 0 done and ready; 1 the restart failed, the service did not
// become ready, or the slot was lost mid-restart (check the service before
// running again); 2 usage; 3 retryable: etcd unreachable, no slot within
// --max-wait, snapd unreachable or busy; 130 interrupted.
package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"

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
	etcdUser, etcdPassword                      string
	joinPeriod                                  time.Duration
	readyURL, readyCA, readyCert, readyKey      string
	readyInsecure, jsonOut, failOpen, bootstrap bool
	reload, version                             bool
	max                                         int
	maxUnavailable, window                      string
	ttl, unreachable, maxWait, settle, timeout  time.Duration
	readyInterval, readyTimeout                 time.Duration
	names                                       []string
}

// etcdFlags are the flags every command shares.
func etcdFlags(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.endpoints, "endpoints", "", "etcd client URLs, comma-separated (default $ETCDCTL_ENDPOINTS)")
	fs.StringVar(&o.etcdCA, "etcd-ca", "", "CA bundle for etcd's certificate (default $ETCDCTL_CACERT)")
	fs.StringVar(&o.etcdCert, "etcd-cert", "", "client certificate for etcd (default $ETCDCTL_CERT)")
	fs.StringVar(&o.etcdKey, "etcd-key", "", "client key for etcd (default $ETCDCTL_KEY)")
	fs.StringVar(&o.etcdUser, "etcd-user", "", "etcd user, USER or USER:PASSWORD (default $ETCDCTL_USER)")
	fs.StringVar(&o.etcdPassword, "etcd-password", "", "etcd user's password (default $ETCDCTL_PASSWORD)")
	fs.StringVar(&o.prefix, "prefix", etcdbudget.DefaultPrefix, "etcd key prefix of the budget")
	fs.StringVar(&o.holder, "holder", "", "identity shown to other machines (default HOSTNAME pid PID)")
	fs.BoolVar(&o.jsonOut, "json", false, "JSON on stdout")
	fs.DurationVar(&o.unreachable, "unreachable", etcdbudget.DefaultUnreachable, "how long etcd may be unreachable before giving up")
}

// newFlagSet returns a flag set whose errors, and usage after an error,
// go to stderr; parseFlags sends --help to stdout.
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args GNU-style: flags may come before, between and
// after the other arguments, which it returns in order; everything after
// "--" is an argument. -h, -help or --help prints the usage on stdout and
// returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	head, tail := args, []string(nil)
	if i := slices.Index(args, "--"); i >= 0 {
		head, tail = args[:i], args[i+1:]
	}
	for _, a := range head {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout)
			fs.Usage()
			return nil, flag.ErrHelp
		}
	}
	var rest []string
	for {
		if err := fs.Parse(head); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return append(rest, tail...), nil
		}
		rest, head = append(rest, fs.Arg(0)), fs.Args()[1:]
	}
}

const rolloutUsage = `usage: snapsvc-rollout [flags] NAME...
       snapsvc-rollout status|pause|resume KEY [flags]

Restarts snap services under a cluster-wide restart budget kept in etcd:
each machine waits for a slot, restarts, waits until ready, then gives the
slot to the next. Exit codes: 0 done, 1 failed, 2 usage, 3 retryable,
130 interrupted.

Flags (--name value or --name=value):
`

func parse(args []string, stdout, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := newFlagSet("snapsvc-rollout", rolloutUsage, stderr)
	etcdFlags(fs, o)
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.StringVar(&o.key, "key", "", "one budget key for the whole restart (default: each service's own key; a snap name stands for all its services)")
	fs.IntVar(&o.max, "max", 1, "machines that may restart at once (the same on every machine); see --max-unavailable")
	fs.StringVar(&o.maxUnavailable, "max-unavailable", "", "machines that may restart at once: a count, or a percentage of the machines taking part (25%: rounded down, at least 1)")
	fs.StringVar(&o.window, "window", "", `maintenance window, e.g. "Mon-Fri 22:00-04:00 Europe/Berlin": outside it, wait`)
	fs.DurationVar(&o.joinPeriod, "join-period", etcdbudget.DefaultJoinPeriod, "with a percentage --max-unavailable: how long machines may join before it is resolved")
	fs.DurationVar(&o.ttl, "ttl", etcdbudget.DefaultTTL, "lease of the slot: a crashed machine's slot frees itself after this")
	fs.BoolVar(&o.failOpen, "fail-open", false, "restart anyway, without a slot, when etcd stays unreachable")
	fs.BoolVar(&o.bootstrap, "bootstrap", false, "no cluster exists yet: restart without a budget")
	fs.DurationVar(&o.maxWait, "max-wait", 0, "give up when no slot is free within this (0: wait)")
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
	fs.DurationVar(&o.timeout, "timeout", 0, "bound on the whole command (0: none)")
	names, err := parseFlags(fs, args, stdout)
	if err != nil {
		return nil, err
	}
	if o.version {
		return o, nil
	}
	fromEnv(o)
	o.names = names
	maxSet := false
	fs.Visit(func(f *flag.Flag) { maxSet = maxSet || f.Name == "max" })
	switch {
	case o.maxUnavailable != "" && maxSet:
		return nil, errors.New("give --max or --max-unavailable, not both")
	case len(o.names) == 0:
		return nil, errors.New("name at least one service, e.g. k8s.kube-apiserver")
	case o.endpoints == "" && !o.bootstrap:
		return nil, errors.New("--endpoints (or $ETCDCTL_ENDPOINTS) is required (or --bootstrap when no cluster exists yet)")
	case o.max < 1:
		return nil, fmt.Errorf("--max %d: must be at least 1", o.max)
	}
	for _, n := range o.names {
		if _, _, err := snapsvc.ValidateName(n); err != nil {
			return nil, err
		}
	}
	if o.maxUnavailable == "" {
		o.maxUnavailable = strconv.Itoa(o.max)
	}
	if _, err := etcdbudget.ParseMaxUnavailable(o.maxUnavailable); err != nil {
		return nil, fmt.Errorf("--max-unavailable: %w", err)
	}
	if o.window != "" {
		if _, err := etcdbudget.ParseWindow(o.window); err != nil {
			return nil, fmt.Errorf("--window: %w", err)
		}
	}
	if o.key != "" {
		// One form on every machine: "a+b" and "b+a" are one key.
		o.key = etcdbudget.Key(o.key)
	}
	return o, nil
}

// fromEnv fills what the etcd flags left unset from etcdctl's
// environment variables.
func fromEnv(o *options) {
	for _, v := range []struct {
		dst *string
		env string
	}{
		{&o.endpoints, "ETCDCTL_ENDPOINTS"}, {&o.etcdCA, "ETCDCTL_CACERT"}, {&o.etcdCert, "ETCDCTL_CERT"},
		{&o.etcdKey, "ETCDCTL_KEY"}, {&o.etcdUser, "ETCDCTL_USER"}, {&o.etcdPassword, "ETCDCTL_PASSWORD"},
	} {
		if *v.dst == "" {
			*v.dst = os.Getenv(v.env)
		}
	}
	if user, pass, ok := strings.Cut(o.etcdUser, ":"); ok && o.etcdPassword == "" {
		o.etcdUser, o.etcdPassword = user, pass // etcdctl's --user USER:PASSWORD
	}
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
		if ev.Held > 0 {
			m["held"] = ev.Held.String()
		}
		if ev.Attempt > 0 {
			m["attempt"] = ev.Attempt
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
		fmt.Fprintf(p.stderr, "%s waiting for %s: %s\n", ts, ev.Key, etcdbudget.DescribeWait(ev.Wait))
	case "acquired":
		fmt.Fprintf(p.stderr, "%s acquired %s as %s after %s; restarting\n", ts, ev.Key, ev.Holder, ev.Waited.Round(time.Millisecond))
	case "ready":
		fmt.Fprintf(p.stderr, "%s %s ready\n", ts, ev.Key)
	case "released":
		fmt.Fprintf(p.stderr, "%s released %s after holding it %s\n", ts, ev.Key, ev.Held.Round(time.Millisecond))
	case "release-failed":
		fmt.Fprintf(p.stderr, "%s could not release %s (attempt %d; retrying, else its lease expires): %v\n", ts, ev.Key, ev.Attempt, ev.Err)
	case "fence-failed":
		fmt.Fprintf(p.stderr, "%s cannot confirm %s is still ours; not restarting: %v\n", ts, ev.Key, ev.Err)
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
	if len(args) > 0 {
		switch args[0] {
		case "status", "pause", "resume":
			return runControl(ctx, args[0], args[1:], stdout, stderr)
		case "version":
			args = []string{"--version"}
		}
	}
	o, err := parse(args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "snapsvc-rollout:", err)
		return exitUsage
	}
	if o.version {
		fmt.Fprintln(stdout, "snapsvc-rollout", version())
		return exitOK
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
			return clientExit(err)
		}
		defer cli.Close()
		mu, _ := etcdbudget.ParseMaxUnavailable(o.maxUnavailable) // checked by parse
		ctl := etcdbudget.Controls{MaxUnavailable: mu, JoinPeriod: o.joinPeriod}
		if o.window != "" {
			ctl.Window, _ = etcdbudget.ParseWindow(o.window)
		}
		b, err := etcdbudget.NewControlled(etcdbudget.Config{Client: cli, Prefix: o.prefix, TTL: o.ttl,
			Holder: o.holder, Unreachable: o.unreachable, FailOpen: o.failOpen}, ctl)
		if err != nil {
			fmt.Fprintln(stderr, "snapsvc-rollout:", err)
			return exitUsage
		}
		defer b.Close()
		bopts := snapsvc.BudgetOptions{
			Settle:   o.settle,
			MaxWait:  o.maxWait,
			Progress: p.event,
			Probe:    probe.Options{Interval: o.readyInterval, MaxWait: o.readyTimeout},
		}
		if o.key != "" {
			bopts.Key = func(string) string { return o.key }
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

// clientExit is the exit code of a failure to build the etcd client:
// retryable when etcd could not be reached, usage otherwise (a refusal:
// certificates, credentials).
func clientExit(err error) int {
	if errors.Is(err, snapsvc.ErrBudgetUnavailable) {
		return exitRetryable
	}
	return exitUsage
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

// etcdClient builds the etcd client from the etcd flags (and
// environment). A client certificate outside its validity is refused
// here, naming the file; a client that cannot be built names each
// endpoint and why it failed (etcdbudget.NewClient).
func etcdClient(o *options) (*clientv3.Client, error) {
	// gRPC keep-alive drops a connection to a member that hangs.
	cfg := etcdbudget.ClientConfig(strings.Split(o.endpoints, ","))
	cfg.Username, cfg.Password = o.etcdUser, o.etcdPassword
	if o.etcdCA != "" || o.etcdCert != "" {
		if o.etcdCert != "" {
			if err := certValid(o.etcdCert, time.Now()); err != nil {
				return nil, err
			}
		}
		tlsCfg, err := transport.TLSInfo{TrustedCAFile: o.etcdCA, CertFile: o.etcdCert, KeyFile: o.etcdKey}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tlsCfg
	}
	return etcdbudget.NewClient(cfg)
}

// certValid checks that the first certificate in file is valid at now.
func certValid(file string, now time.Time) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("etcd TLS: %w", err)
	}
	block, _ := pem.Decode(raw)
	if block == nil {
		return fmt.Errorf("etcd TLS: %s: no PEM certificate", file)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return fmt.Errorf("etcd TLS: %s: %w", file, err)
	}
	switch {
	case now.After(cert.NotAfter):
		return fmt.Errorf("%w: etcd TLS: client certificate %s (%s) expired at %s", snapsvc.ErrBudgetRefused, file, cert.Subject.CommonName, cert.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(cert.NotBefore):
		return fmt.Errorf("%w: etcd TLS: client certificate %s (%s) is not valid before %s", snapsvc.ErrBudgetRefused, file, cert.Subject.CommonName, cert.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}
