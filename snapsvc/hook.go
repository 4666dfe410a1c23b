package snapsvc

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// detectHook finds the hook being run. SNAPSVC_HOOK names it explicitly.
// Otherwise, inside a snap, snapd runs a hook as $SNAP/meta/hooks/NAME
// (snap/hooks/NAME for snapcraft's wrappers), and a hook often runs a
// helper program: the command lines of this process and its nearest
// ancestors are searched for such a path.
func detectHook(env func(string) string) string {
	if h := env("SNAPSVC_HOOK"); h != "" {
		return h
	}
	if env("SNAP_COOKIE") == "" && env("SNAP_CONTEXT") == "" {
		return ""
	}
	if h := hookFromArgs(os.Args); h != "" {
		return h
	}
	pid := os.Getppid()
	for depth := 0; depth < 4 && pid > 1; depth++ {
		if h := hookFromArgs(procCmdline(pid)); h != "" {
			return h
		}
		pid = procParent(pid)
	}
	return ""
}

// hookFromArgs returns NAME when an argument is a path .../hooks/NAME
// below meta/ or snap/.
func hookFromArgs(args []string) string {
	for _, a := range args {
		dir, base := filepath.Split(a)
		dir = filepath.Clean(dir)
		if base != "" && (strings.HasSuffix(dir, "/meta/hooks") || strings.HasSuffix(dir, "/snap/hooks")) {
			return base
		}
	}
	return ""
}

func procCmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// procParent returns the parent pid from /proc/PID/stat (field 4, after
// the parenthesised command name), or 0.
func procParent(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	var state string
	var ppid int
	if _, err := fmt.Sscan(s[i+1:], &state, &ppid); err != nil {
		return 0
	}
	return ppid
}
