package snapsvc

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// dirWatch reports events on the files of one directory that match, such
// as the rewrites of snapd's state file (statefile.go). One per Client and
// directory, opened at the first wait that needs it and kept until
// Client.Close (closing an inotify instance takes the kernel milliseconds,
// too long to pay at every wait). Waits share it: one reads the inotify descriptor at
// a time and tells the others, so an event wakes every waiter.
type dirWatch struct {
	dir   string
	mask  uint32                 // the inotify events that count
	match func(name string) bool // the files whose events count

	omu    sync.Mutex // guards opening and closing f
	tried  bool       // open was attempted
	closed bool       // Client.Close: never open again
	f      *os.File   // nil: no watch (no such directory, no inotify, no permission)

	mu      sync.Mutex
	reading bool
	events  uint64        // rewrites seen so far
	turn    chan struct{} // closed when the reader stops (an event or not)
}

// newDirWatch watches dir for the events of mask on the files match
// accepts.
func newDirWatch(dir string, mask uint32, match func(name string) bool) *dirWatch {
	return &dirWatch{dir: dir, mask: mask, match: match, turn: make(chan struct{})}
}

// open starts watching the directory, once; it reports
// whether the watch works. Once closed (Client.Close) it never opens
// again, so a call racing Close cannot leave an inotify instance behind.
func (w *dirWatch) open() bool {
	if w == nil {
		return false
	}
	w.omu.Lock()
	defer w.omu.Unlock()
	if w.closed {
		return false
	}
	if !w.tried {
		w.tried = true
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if err != nil {
			return false
		}
		if _, err := unix.InotifyAddWatch(fd, w.dir, w.mask); err != nil {
			unix.Close(fd)
			return false
		}
		// Non-blocking, so the runtime's poller serves reads with deadlines.
		w.f = os.NewFile(uintptr(fd), "inotify:"+w.dir)
	}
	return w.f != nil
}

// testHookWatchClose is called as a watch's inotify instance is closed,
// outside every lock (export_test.go: a kernel slow to close it).
var testHookWatchClose = func() {}

// close ends the watch for good; waits reading it see it broken and poll.
// The inotify instance is closed outside the watch's locks: the kernel
// takes milliseconds to close one (tens under load), and a call that
// opens or marks the watch meanwhile must find it closed at once, not
// wait for the kernel (a stop with a 19 ms bound returned 134.6 ms past it
// while its Client closed).
func (w *dirWatch) close() {
	if w == nil {
		return
	}
	w.omu.Lock()
	w.closed = true
	f := w.f
	w.omu.Unlock()
	if f != nil {
		testHookWatchClose()
		f.Close()
	}
}

// wait blocks until a matching event (true), d passes (false)
// or ctx ends (its error). An error other than the context's means the
// watch is broken.
func (w *dirWatch) wait(ctx context.Context, d time.Duration) (bool, error) {
	return w.waitFrom(ctx, d, w.mark())
}

// mark returns how many events the watch has seen, for waitFrom. Events
// that happened before it but were not read yet (no waiter was reading
// the inotify descriptor) are counted first, so they do not pass for
// events after it.
func (w *dirWatch) mark() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.reading && w.f != nil {
		w.drainLocked()
	}
	return w.events
}

// drainLocked counts the events waiting in the inotify descriptor without
// blocking.
func (w *dirWatch) drainLocked() {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return
	}
	var buf [4096]byte
	for {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), buf[:])
			return true // never wait: EAGAIN means nothing is pending
		}); err != nil || rerr != nil || n <= 0 {
			return
		}
		if w.hasEvent(buf[:n]) {
			w.events++
		}
	}
}

// hasEvent reports whether a buffer of inotify events has one for a file
// the watch matches.
func (w *dirWatch) hasEvent(buf []byte) bool {
	// Events are struct inotify_event: wd, mask, cookie, len (four 32-bit
	// words in host order), then len bytes of NUL-padded name.
	for off := 0; off+unix.SizeofInotifyEvent <= len(buf); {
		nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
		end := off + unix.SizeofInotifyEvent + nameLen
		if end > len(buf) {
			return false
		}
		name := buf[off+unix.SizeofInotifyEvent : end]
		off = end
		if w.match(trimNUL(name)) {
			return true
		}
	}
	return false
}

// waitFrom is wait for an event after mark was taken: one that came in
// between (another waiter may have counted it) wakes it at once.
func (w *dirWatch) waitFrom(ctx context.Context, d time.Duration, seen uint64) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		w.mu.Lock()
		if w.events != seen {
			w.mu.Unlock()
			return true, nil
		}
		if !w.reading {
			w.reading = true
			w.mu.Unlock()
			woke, err := w.read(ctx, deadline)
			w.mu.Lock()
			w.reading = false
			if woke {
				w.events++
			}
			close(w.turn) // the others: an event, or their turn to read
			w.turn = make(chan struct{})
			w.mu.Unlock()
			return woke, err
		}
		turn := w.turn
		w.mu.Unlock()
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		t := time.NewTimer(left)
		select {
		case <-turn:
			t.Stop()
		case <-t.C:
			return false, nil
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		}
	}
}

// read reads the inotify descriptor until a matching event, the deadline
// or ctx's end. The deadline is set before ctx's end is watched: the
// other way round, a ctx that ended as the read began had its past
// deadline overwritten by the wait's own, and the read slept to it.
func (w *dirWatch) read(ctx context.Context, deadline time.Time) (bool, error) {
	if err := w.f.SetReadDeadline(deadline); err != nil {
		return false, err
	}
	stop := context.AfterFunc(ctx, func() { w.f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
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
		if w.hasEvent(buf[:n]) {
			return true, nil
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
