package probe_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/probe"
)

// A timed-out exec probe kills the whole process group: a wrapper script's
// children (curl, nc, sleep...) do not outlive the check.
func TestExecTimeoutKillsWholeProcessGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := probe.Exec{Command: []string{"sh", "-c", "sleep 1000 & echo $! > " + pidFile + "; wait"}}
	start := time.Now()
	err := probe.Once(context.Background(), p, 300*time.Millisecond, nil)
	var cte *probe.CheckTimeoutError
	if !errors.As(err, &cte) {
		t.Fatalf("err = %v, want a check timeout", err)
	}
	b, rerr := os.ReadFile(pidFile)
	if rerr != nil {
		t.Fatal(rerr)
	}
	pid := strings.TrimSpace(string(b))
	// SIGKILL is asynchronous: give the kernel a moment to end the
	// process (a zombie awaiting its reaper counts as ended).
	deadline := time.Now().Add(2 * time.Second)
	for running(pid) {
		if time.Now().After(deadline) {
			n, _ := strconv.Atoi(pid)
			syscall.Kill(n, syscall.SIGKILL) // clean up
			t.Fatalf("child %s of the timed-out probe still runs (check returned after %v)", pid, time.Since(start).Round(time.Millisecond))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// running reports whether process pid exists and is not a zombie.
func running(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}
