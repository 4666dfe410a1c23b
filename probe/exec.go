package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Exec succeeds when a command exits with status 0, like the
// "until CMD; do sleep 3; done" loops of service wrappers. The command is
// killed when the check's context ends (its timeout).
type Exec struct {
	// Command is the program and its arguments; Command[0] is looked up
	// in PATH.
	Command []string
	// Env, if not nil, is the command's whole environment.
	Env []string
	// Dir is the working directory ("" for the current one).
	Dir string
}

// maxOutput bounds how much of a failing command's output goes into the
// error.
const maxOutput = 512

// Check runs the command.
func (p Exec) Check(ctx context.Context) error {
	if len(p.Command) == 0 {
		return errors.New("no command to run")
	}
	cmd := exec.CommandContext(ctx, p.Command[0], p.Command[1:]...)
	cmd.Env, cmd.Dir = p.Env, p.Dir
	// Run it in its own process group and kill the whole group when the
	// check ends early: a wrapper script's children (curl, nc, sleep)
	// must not outlive the check.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Once killed, do not wait long for anything that holds its output.
	cmd.WaitDelay = 100 * time.Millisecond
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if text := strings.TrimSpace(out.String()); text != "" {
			if len(text) > maxOutput {
				text = text[:maxOutput] + "..."
			}
			return fmt.Errorf("%w; output: %q", err, text)
		}
		return err
	}
	return nil
}

// String returns "exec CMD ARGS...".
func (p Exec) String() string { return "exec " + strings.Join(p.Command, " ") }
