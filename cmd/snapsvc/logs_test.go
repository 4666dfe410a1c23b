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
	"testing"
	"time"

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
// each line as it comes in, until interrupted, which ends it with exit 0
// and nothing on stderr.
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
		if code != exitOK || stderr.String() != "" {
			t.Errorf("interrupted: exit %d, stderr %q; want 0 and nothing", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("logs -f did not end when interrupted")
	}
}
