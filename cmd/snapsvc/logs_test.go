package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
)

// logsFake is a fake serving <root>/run/snapd.socket with the k8s snap,
// kubelet restarted and lines of its own and of k8sd in the journal.
func logsFake(t *testing.T) (*fake.Server, string) {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "run"), 0o755); err != nil {
		t.Fatal(err)
	}
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithDir(filepath.Join(root, "run")), fake.WithSnaps(k8sSnap(0)))
	if code, _, errOut := runWithSocket(safetyNet(t), srv.SocketPath(), false, "restart", "k8s.kubelet", "k8s.k8sd"); code != exitOK {
		t.Fatalf("restart: %s", errOut)
	}
	for i, msg := range []string{"one", "two <&> \"quoted\" ünï", "three", "", "five\twith a tab"} {
		app := "kubelet"
		if i%2 == 1 {
			app = "k8sd"
		}
		if err := srv.AppendLog("k8s", app, msg); err != nil {
			t.Fatal(err)
		}
	}
	return srv, root
}

// TestLogsMatchDebianSnap runs Debian's snap logs and snapsvc logs on the
// same fake (SNAPPY_GLOBAL_ROOT) with the same arguments, and wants the
// same stdout, byte for byte, and stderr and the exit status where snapsvc
// does not differ on purpose (usage errors exit 2 with a hint; not found
// exits 4). SNAPSVC_SNAP_CLIENT names Debian's snap binary (apt-get
// download snapd; dpkg-deb -x: usr/bin/snap); without it the test is
// skipped. The real-snapd suite compares the two on real snapd.
func TestLogsMatchDebianSnap(t *testing.T) {
	snapBin := os.Getenv("SNAPSVC_SNAP_CLIENT")
	if snapBin == "" {
		t.Skip("SNAPSVC_SNAP_CLIENT (Debian's snap binary) is not set")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	srv, root := logsFake(t)
	env := []string{"PATH=/usr/bin:/bin", "SNAP_REEXEC=0", "SNAPPY_GLOBAL_ROOT=" + root, "HOME=" + t.TempDir(), "LANG=C.UTF-8"}
	command := func(ctx context.Context, tz, name string, args ...string) *exec.Cmd {
		c := exec.CommandContext(ctx, snapBin, append([]string{"logs"}, args...)...)
		if name == "snapsvc" {
			// The test binary is the snapsvc command when called so
			// (TestMain).
			c = exec.CommandContext(ctx, self, append([]string{"logs"}, args...)...)
			c.Args[0] = "snapsvc"
		}
		c.Env = append(env, "TZ="+tz)
		return c
	}
	for _, tz := range []string{"UTC", "Asia/Kolkata"} {
		for _, args := range [][]string{
			{"k8s"}, {"k8s.kubelet"}, {"-n=2", "k8s"}, {"-n", "all", "k8s"}, {"-n=0x3", "k8s"}, {"--abs-time", "k8s.k8sd"},
			{"k8s.kubelet", "k8s.k8sd"}, {"-n=0", "k8s"}, {"nosuch"}, {"k8s.nosuch"}, {"-n=-2", "k8s"}, {"-n=x", "k8s"},
		} {
			var out [2]string
			var errs [2]string
			var codes [2]int
			for i, name := range []string{"snap", "snapsvc"} {
				c := command(safetyNet(t), tz, name, args...)
				var stdout, stderr bytes.Buffer
				c.Stdout, c.Stderr = &stdout, &stderr
				err := c.Run()
				var ee *exec.ExitError
				if err != nil && !errors.As(err, &ee) {
					t.Fatalf("%s logs %q: %v", name, args, err)
				}
				out[i], errs[i], codes[i] = stdout.String(), stderr.String(), c.ProcessState.ExitCode()
			}
			if out[0] != out[1] {
				t.Errorf("TZ=%s logs %q: stdout differs:\nsnap:\n%s\nsnapsvc:\n%s", tz, args, out[0], out[1])
			}
			wantCode, wantErr := codes[0], errs[0]
			switch {
			case codes[0] == 1 && strings.Contains(errs[0], "invalid argument for flag"):
				wantCode, wantErr = exitUsage, errs[0]+"Run 'snapsvc logs --help' for usage.\n"
			case codes[0] == 1 && strings.Contains(errs[0], "not found") || strings.Contains(errs[0], "has no service"):
				wantCode = exitNotFound
			}
			if codes[1] != wantCode || errs[1] != wantErr {
				t.Errorf("TZ=%s logs %q: snapsvc exit %d %q; snap exit %d %q", tz, args, codes[1], errs[1], codes[0], errs[0])
			}
		}
	}

	// -f: both print the last lines, then a line added afterwards.
	ctx, cancel := context.WithCancel(safetyNet(t))
	defer cancel()
	var lines [2]chan string
	var cmds [2]*exec.Cmd
	for i, name := range []string{"snap", "snapsvc"} {
		cmds[i] = command(ctx, "UTC", name, "-f", "-n=1", "k8s")
		stdout, err := cmds[i].StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
		lines[i] = make(chan string, 10)
		go func(ch chan<- string, r io.Reader) {
			sc := bufio.NewScanner(r)
			for sc.Scan() {
				ch <- sc.Text()
			}
			close(ch)
		}(lines[i], stdout)
	}
	var got [2][]string
	for i := range lines {
		got[i] = append(got[i], <-lines[i]) // the last line so far: both follow now
	}
	if err := srv.AppendLog("k8s", "kubelet", "followed"); err != nil {
		t.Fatal(err)
	}
	for i := range lines {
		got[i] = append(got[i], <-lines[i])
	}
	cancel()
	for i := range cmds {
		cmds[i].Wait()
	}
	if strings.Join(got[0], "\n") != strings.Join(got[1], "\n") || !strings.Contains(got[1][1], " k8s.kubelet[") || !strings.HasSuffix(got[1][1], "]: followed") {
		t.Errorf("-f: snap printed\n%s\nsnapsvc printed\n%s", strings.Join(got[0], "\n"), strings.Join(got[1], "\n"))
	}
}

// TestLogsFollow checks logs -f in this process: the last lines, then
// each line as it comes in, until interrupted, which ends it with exit 130
// (every interrupted command's) and nothing on stderr.
func TestLogsFollow(t *testing.T) {
	srv, _ := logsFake(t)
	ctx, cancel := context.WithCancel(safetyNet(t))
	defer cancel()
	pr, pw := io.Pipe()
	var stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"logs", "-f", "-n", "1", "k8s.kubelet"}, env{stdout: pw, stderr: &stderr, getenv: socketEnv(srv.SocketPath())})
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	next := func() string {
		if !sc.Scan() {
			t.Fatalf("logs -f ended: %v; stderr %q", sc.Err(), stderr.String())
		}
		return sc.Text()
	}
	if line := next(); !strings.HasSuffix(line, "]: five\twith a tab") {
		t.Fatalf("first line %q, want the last one", line)
	}
	for _, msg := range []string{"six", "seven"} {
		if err := srv.AppendLog("k8s", "kubelet", msg); err != nil {
			t.Fatal(err)
		}
		if line := next(); !strings.HasSuffix(line, "]: "+msg) {
			t.Fatalf("followed line %q, want %q", line, msg)
		}
	}
	cancel()
	go io.Copy(io.Discard, pr)
	select {
	case code := <-done:
		if code != exitInterrupted || stderr.String() != "" {
			t.Errorf("interrupted: exit %d, stderr %q; want 130 and nothing", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("logs -f did not end when interrupted")
	}
}

// shellStatus is the status a shell reports for a process that ended:
// its exit code, or 128+N for one a signal N killed.
func shellStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// TestLogsFollowSignals sends SIGINT and SIGTERM to the snapsvc binary
// following logs (logs -f): it ends with 130 and 143 and says nothing, as
// Debian's snap logs -f does, which the signal kills (a shell shows 130
// and 143), when SNAPSVC_SNAP_CLIENT names it (v0.2.0's logs -f exited 0).
// watch ID on a held change ends so too, naming the change (snap 2.57.6's
// watch ignores SIGINT, and SIGTERM kills it: 143).
func TestLogsFollowSignals(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the fake's own cleanup
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	srv, root := logsFake(t)
	held := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s", WithSnapNames: true})
	defer held.Finish()
	bins := map[string]string{"snapsvc": self}
	if snapBin := os.Getenv("SNAPSVC_SNAP_CLIENT"); snapBin != "" {
		bins["snap"] = snapBin
	}
	// start runs NAME ARGS... and returns once it has printed its first
	// line, on stdout for logs (the last line so far), on stderr for
	// watch (-v: that it waits), so that it is following or waiting, its
	// signal handling in place; stderr returns all it printed there once
	// it has ended.
	start := func(name string, args ...string) (c *exec.Cmd, stderr func() string) {
		t.Helper()
		c = exec.CommandContext(safetyNet(t), bins[name], args...)
		c.Args[0] = name // the test binary is snapsvc when called so (TestMain)
		c.Env = []string{"PATH=/usr/bin:/bin", "SNAP_REEXEC=0", "SNAPPY_GLOBAL_ROOT=" + root, "HOME=" + t.TempDir(), "TZ=UTC"}
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		var errOut bytes.Buffer
		first := bufio.NewReader(r)
		if args[0] == "logs" {
			c.Stdout, c.Stderr = w, &errOut
		} else {
			c.Stderr = w
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		w.Close()
		line, err := first.ReadString('\n')
		if err != nil {
			t.Fatalf("%s %q printed nothing: %v", name, args, err)
		}
		rest := make(chan string, 1)
		go func() {
			b, _ := io.ReadAll(first)
			r.Close()
			rest <- string(b)
		}()
		return c, func() string {
			if args[0] == "logs" {
				<-rest
				return errOut.String()
			}
			return line + <-rest
		}
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		want := 128 + int(sig)
		for name := range bins {
			c, stderr := start(name, "logs", "-f", "-n=1", "k8s")
			c.Process.Signal(sig)
			c.Wait()
			if got, errOut := shellStatus(c.ProcessState), stderr(); got != want || errOut != "" {
				t.Errorf("%s logs -f, %v: status %d, stderr %q; want %d and nothing", name, sig, got, errOut, want)
			}
		}
		c, stderr := start("snapsvc", "-v", "watch", held.ID())
		c.Process.Signal(sig)
		c.Wait()
		words := map[syscall.Signal]string{syscall.SIGINT: "interrupted", syscall.SIGTERM: "terminated (SIGTERM)"}[sig]
		if got, errOut := shellStatus(c.ProcessState), stderr(); got != want || !strings.Contains(errOut, "error: "+words+" while waiting for change "+held.ID()+"\n") {
			t.Errorf("snapsvc watch, %v: status %d, stderr %q; want %d", sig, got, errOut, want)
		}
	}
}
