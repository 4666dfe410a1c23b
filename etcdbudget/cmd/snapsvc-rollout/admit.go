package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// admitTimeout bounds each admission check (within the call's bounds).
const admitTimeout = 30 * time.Second

// admitWaitDelay bounds how long an admission command's output is waited
// for once its context ended and its process group was killed (a process
// that left the group may still hold the output pipes).
const admitWaitDelay = time.Second

// admission is the admission check of --admit-command and --admit-url
// (both asked, the command first, when both are given), nil without them.
func admission(o *options) (func(context.Context, snapsvc.Admission) error, error) {
	var checks []func(context.Context, snapsvc.Admission) error
	if o.admitCommand != "" {
		checks = append(checks, func(ctx context.Context, a snapsvc.Admission) error { return admitCommand(ctx, o.admitCommand, a) })
	}
	if o.admitURL != "" {
		hc, err := admitClient(o)
		if err != nil {
			return nil, err
		}
		checks = append(checks, func(ctx context.Context, a snapsvc.Admission) error { return admitURL(ctx, hc, o.admitURL) })
	}
	if len(checks) == 0 {
		return nil, nil
	}
	return func(ctx context.Context, a snapsvc.Admission) error {
		for _, c := range checks {
			if err := c(ctx, a); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// admitCommand runs cmd with sh -c: exit 0 admits; otherwise its first
// line of output (stdout, else stderr) is why not. It is told what is
// asked in SNAPSVC_ACTION, SNAPSVC_SERVICES and SNAPSVC_KEYS (space-
// separated) and SNAPSVC_REFUSALS. It runs in a process group of its own,
// killed whole when ctx (or admitTimeout) ends, and its output is waited
// for at most admitWaitDelay after that: no child of the shell keeps the
// check running beyond its bounds.
func admitCommand(ctx context.Context, cmd string, a snapsvc.Admission) error {
	ctx, cancel := context.WithTimeout(ctx, admitTimeout)
	defer cancel()
	c := exec.CommandContext(ctx, "sh", "-c", cmd)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error {
		// The group's id is the shell's pid (Setpgid).
		if err := syscall.Kill(-c.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		return nil
	}
	c.WaitDelay = admitWaitDelay
	c.Env = append(os.Environ(), "SNAPSVC_ACTION="+a.Action, "SNAPSVC_SERVICES="+strings.Join(a.Services, " "),
		"SNAPSVC_KEYS="+strings.Join(a.Keys, " "), fmt.Sprintf("SNAPSVC_REFUSALS=%d", a.Refusals))
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	if err == nil {
		return nil
	}
	why := firstLine(stdout.Bytes())
	if why == "" {
		why = firstLine(stderr.Bytes())
	}
	if why == "" {
		why = err.Error()
	}
	return fmt.Errorf("--admit-command: %s", why)
}

// admitClient is the HTTP client of --admit-url, with --admit-ca and
// --admit-insecure.
func admitClient(o *options) (*http.Client, error) {
	cfg := &tls.Config{InsecureSkipVerify: o.admitInsecure} //nolint:gosec // the operator asked for it
	if o.admitCA != "" {
		pem, err := os.ReadFile(o.admitCA)
		if err != nil {
			return nil, fmt.Errorf("--admit-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--admit-ca: no certificate found in CA file %s", o.admitCA)
		}
		cfg.RootCAs = pool
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return &http.Client{Transport: tr}, nil
}

// admitURL asks url with a GET: 2xx admits; otherwise the status and the
// first line of the body say why not.
func admitURL(ctx context.Context, hc *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, admitTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("--admit-url: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("--admit-url: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	why := resp.Status
	if l := firstLine(body); l != "" {
		why += ": " + l
	}
	return errors.New("--admit-url " + url + ": " + why)
}

// firstLine is the first non-empty line of b, trimmed.
func firstLine(b []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			return l
		}
	}
	return ""
}
