package etcdtest

import (
	"fmt"
	"syscall"
)

// Pause freezes process pid with SIGSTOP: it keeps its sockets open but
// answers nothing, as a frozen machine or a black-holed network (no RST)
// would.
func Pause(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("etcdtest: SIGSTOP %d: %w", pid, err)
	}
	return nil
}

// Resume lets a paused process pid run again (SIGCONT).
func Resume(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		return fmt.Errorf("etcdtest: SIGCONT %d: %w", pid, err)
	}
	return nil
}

// Pause freezes member i (SIGSTOP): it hangs with its connections open,
// while the other members keep a quorum. Close and Kill still end it.
func (p *Processes) Pause(i int) error {
	pid := p.Pid(i)
	if pid == 0 {
		return fmt.Errorf("etcdtest: member %s is not running", p.cfgs[i].Name)
	}
	return Pause(pid)
}

// Resume lets a paused member i run again.
func (p *Processes) Resume(i int) error {
	pid := p.Pid(i)
	if pid == 0 {
		return fmt.Errorf("etcdtest: member %s is not running", p.cfgs[i].Name)
	}
	return Resume(pid)
}
