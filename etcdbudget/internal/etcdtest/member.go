package etcdtest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// memberBinEnv names a prebuilt etcdmember binary to run instead of
// building one.
const memberBinEnv = "ETCDTEST_MEMBER_BIN"

// installed is an etcd server binary to run members with instead of
// etcdmember (UseInstalledEtcd).
var installed struct {
	sync.Mutex
	path string
}

// UseInstalledEtcd makes StartProcesses run each member with the etcd
// server at path (an installed etcd, such as Debian's etcd-server's
// /usr/bin/etcd) and its command-line flags, instead of building and
// running etcdmember: what a packaged program does, which has neither the
// etcdmember module's source nor the go command. "" goes back to
// etcdmember.
func UseInstalledEtcd(path string) {
	installed.Lock()
	installed.path = path
	installed.Unlock()
}

// installedEtcd is the etcd of UseInstalledEtcd, "" for none.
func installedEtcd() string {
	installed.Lock()
	defer installed.Unlock()
	return installed.path
}

// etcdArgs are an installed etcd's command-line flags for a member, the
// same configuration etcdmember gives embed.Config (name, data directory,
// URLs, cluster, token, TLS of the client URL).
func etcdArgs(m MemberConfig) []string {
	state := "new"
	if m.Existing {
		state = "existing"
	}
	args := []string{
		"--name", m.Name, "--data-dir", m.Dir,
		"--listen-peer-urls", m.PeerURL, "--initial-advertise-peer-urls", m.PeerURL,
		"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
		"--initial-cluster", m.InitialCluster, "--initial-cluster-token", "etcdtest",
		"--initial-cluster-state", state, "--log-level", "error",
	}
	if m.CertFile != "" {
		args = append(args, "--cert-file", m.CertFile, "--key-file", m.KeyFile)
		if m.TrustedCAFile != "" {
			args = append(args, "--trusted-ca-file", m.TrustedCAFile)
		}
		if m.ClientCertAuth {
			args = append(args, "--client-cert-auth")
		}
	}
	return args
}

var member struct {
	once sync.Once
	path string
	err  error
}

// MemberBinary returns the path of the etcdmember command that runs each
// member: $ETCDTEST_MEMBER_BIN when set, otherwise the etcdmember module
// beside this file built once per content and toolchain, with the go
// command in PATH, into the user's cache directory
// (GOWORK=off: the module is self-contained). The first build compiles
// etcd's server and takes a while; later ones reuse the binary.
func MemberBinary() (string, error) {
	member.once.Do(func() { member.path, member.err = buildMember() })
	return member.path, member.err
}

// BuildMember builds the member binary (MemberBinary) and exits the
// process when that fails. Tests call it from TestMain, before any test
// starts a cluster under a time bound: a cold build cache spends minutes
// compiling etcd's server, which must not count against a test.
func BuildMember() {
	if _, err := MemberBinary(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func buildMember() (string, error) {
	if bin := os.Getenv(memberBinEnv); bin != "" {
		return bin, nil
	}
	_, file, _, ok := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(file), "etcdmember")
	if !ok || !filepath.IsAbs(src) {
		return "", fmt.Errorf("etcdtest: cannot locate the etcdmember module's source (built with -trimpath?); build it and set $%s", memberBinEnv)
	}
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	for _, name := range []string{"go.mod", "go.sum", "main.go"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			return "", fmt.Errorf("etcdtest: etcdmember source: %w", err)
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "snapsvc-etcdtest")
	bin := filepath.Join(dir, "etcdmember-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "etcdmember-*.tmp")
	if err != nil {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	gobin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("etcdtest: building etcdmember needs the go command in PATH (or set $%s): %w", memberBinEnv, err)
	}
	cmd := exec.Command(gobin, "build", "-o", tmp.Name(), ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("etcdtest: building etcdmember in %s: %w\n%s", src, err, out)
	}
	// Rename is atomic: concurrent test binaries building the same
	// content end with one complete file.
	if err := os.Rename(tmp.Name(), bin); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("etcdtest: %w", err)
	}
	return bin, nil
}
