package snapsvc

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultStateFile is where snapd keeps its state (dirs.SnapStateFile).
// snapd rewrites it, atomically, each time its state changes — a task
// starting or ending, a change becoming ready — before anyone can read
// the new state (overlord/state/state.go: Unlock checkpoints).
const DefaultStateFile = "/var/lib/snapd/state.json"

// WithStateFile names snapd's state file, which a wait for changes watches
// (inotify on its directory) where snapd has no notices API (before 2.62):
// a rewrite wakes the wait to read the changes at once, instead of after a
// poll interval. The file is never read; watching its directory needs no
// more than search permission on it (/var/lib/snapd is world-readable; a
// strictly confined snap cannot see it, and then polls). The default is
// DefaultStateFile with the default socket, none otherwise; "" disables
// the watch. fake.WithStateFile makes the fake keep one.
func WithStateFile(path string) Option {
	return func(s *settings) { s.stateFile, s.stateFileSet = path, true }
}

// stateWatch reports rewrites of snapd's state file.
type stateWatch struct {
	f    *os.File
	name string
}

// watchState starts watching path's directory, or returns nil when it
// cannot (no such directory, no inotify, no permission).
func watchState(path string) *stateWatch {
	if path == "" {
		return nil
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	// A rename over the file (snapd's atomic write) or a write in place.
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE); err != nil {
		unix.Close(fd)
		return nil
	}
	// Non-blocking, so the runtime's poller serves reads with deadlines.
	return &stateWatch{f: os.NewFile(uintptr(fd), "inotify:"+path), name: filepath.Base(path)}
}

func (w *stateWatch) close() {
	if w != nil {
		w.f.Close()
	}
}

// wait blocks until the state file is rewritten (true), d passes (false)
// or ctx ends (its error).
func (w *stateWatch) wait(ctx context.Context, d time.Duration) (bool, error) {
	stop := context.AfterFunc(ctx, func() { w.f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := w.f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return false, nil
	}
	var buf [4096]byte
	for {
		n, err := w.f.Read(buf[:])
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return false, nil
			}
			return false, err
		}
		// Events are struct inotify_event: wd, mask, cookie, len (four
		// 32-bit words in host order), then len bytes of NUL-padded name.
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			end := off + unix.SizeofInotifyEvent + nameLen
			if end > n {
				break
			}
			name := buf[off+unix.SizeofInotifyEvent : end]
			off = end
			if trimNUL(name) == w.name {
				return true, nil
			}
		}
	}
}

func trimNUL(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
