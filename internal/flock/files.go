package flock

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
)

// Small files that processes of one machine share beside their locks:
// what one of them publishes for the others to read (WriteFile, ReadFile),
// and a file whose lock says its writer is alive (Create, Open). They live
// in the lock directory, so the same rules hold: a private directory of
// this user's, regular files 0600 of this user's, never a symlink.

// tmpSeq numbers this process's temporary files.
var tmpSeq atomic.Uint64

// tempFile creates an empty temporary file in dir, 0600, for a file named
// base: a name no other process or call uses.
func tempFile(dir, base string) (*os.File, string, error) {
	name := filepath.Join(dir, "."+base+".tmp-"+strconv.Itoa(os.Getpid())+"-"+strconv.FormatUint(tmpSeq.Add(1), 10))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("cannot create a file in the lock directory: %w", err)
	}
	return f, name, nil
}

// WriteFile replaces the content of path, in the lock directory, with
// data atomically: data goes to a temporary file that is then renamed over
// path, so a reader sees the old content or the new, never a part of
// either.
func WriteFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := ensureDir(dir); err != nil {
		return err
	}
	f, tmp, err := tempFile(dir, filepath.Base(path))
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
		return fmt.Errorf("cannot write %s: %w", path, werr)
	}
	return nil
}

// ReadFile returns the content of path, in the lock directory, up to max
// bytes, never through a symlink and only from a regular file of this
// user's. A missing file matches fs.ErrNotExist.
func ReadFile(path string, max int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := checkFile(path, f); err != nil {
		return nil, err
	}
	return io.ReadAll(io.LimitReader(f, int64(max)))
}

// Create makes the file path, in the lock directory, with data as its
// content and an exclusive lock on it held by the returned Lock, at once:
// nobody ever sees the file empty or unlocked while its creator lives
// (written and locked under a temporary name, then linked to path). It
// fails with an error matching fs.ErrExist when path exists.
func Create(path string, data []byte) (*Lock, error) {
	dir := filepath.Dir(path)
	if err := ensureDir(dir); err != nil {
		return nil, err
	}
	f, tmp, err := tempFile(dir, filepath.Base(path))
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot write %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot lock %s: %w", path, err)
	}
	if err := os.Link(tmp, path); err != nil {
		f.Close()
		if errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("%s: %w", path, fs.ErrExist)
		}
		return nil, fmt.Errorf("cannot create %s: %w", path, err)
	}
	return &Lock{f: f, path: path}, nil
}

// Rewrite replaces the content of the file of a lock made by Create, in
// place: its readers hold it open, so it keeps its inode. A reader must
// not read while it is rewritten (both sides hold another lock meanwhile).
func (l *Lock) Rewrite(data []byte) error {
	if _, err := l.f.WriteAt(data, 0); err != nil {
		return fmt.Errorf("cannot write %s: %w", l.path, err)
	}
	if err := l.f.Truncate(int64(len(data))); err != nil {
		return fmt.Errorf("cannot write %s: %w", l.path, err)
	}
	return nil
}

// Remove unlinks the file of a lock made by Create, then releases the lock
// (readers that hold the file open still read it). The caller must know
// that path is still this lock's file.
func (l *Lock) Remove() error {
	err := os.Remove(l.path)
	if uerr := l.Unlock(); err == nil {
		err = uerr
	}
	return err
}

// Held is a file that another process made with Create, opened to read
// what it writes and to tell when it let go of its lock.
type Held struct {
	f    *os.File
	path string
}

// Open opens path, made by Create, to read it, never through a symlink
// and only a regular file of this user's. A missing file matches
// fs.ErrNotExist.
func Open(path string) (*Held, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := checkFile(path, f); err != nil {
		f.Close()
		return nil, err
	}
	return &Held{f: f, path: path}, nil
}

// Read returns the file's content, up to max bytes, even once it was
// removed.
func (h *Held) Read(max int) ([]byte, error) { return readAt(h.f, h.path, max) }

// Released reports whether nobody holds an exclusive lock on the file any
// more: its maker let go, or died.
func (h *Held) Released() (bool, error) {
	err := syscall.Flock(int(h.f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	switch {
	case err == nil:
		_ = syscall.Flock(int(h.f.Fd()), syscall.LOCK_UN)
		return true, nil
	case errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR):
		return false, nil
	}
	return false, fmt.Errorf("cannot test the lock of %s: %w", h.path, err)
}

// Same reports whether path still names the file h holds open.
func (h *Held) Same() bool { return sameFile(h.f, h.path) }

// Close closes the file.
func (h *Held) Close() error { return h.f.Close() }

// RemoveReleased removes the file path made by Create if its maker let go
// of it or died, and reports whether path is free now (removed, or there
// was none). Callers serialise their makers and removers of path with
// another lock, so path cannot change meanwhile.
func RemoveReleased(path string) (bool, error) {
	h, err := Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer h.Close()
	free, err := h.Released()
	if err != nil || !free {
		return false, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	return true, nil
}

// Same reports whether path still names the file of the lock: it was not
// removed or replaced since it was taken (another process may remove the
// file of a lock whose holder it judged gone, and make its own).
func (l *Lock) Same() bool { return l != nil && sameFile(l.f, l.path) }

// Path returns the path the lock was taken on.
func (l *Lock) Path() string { return l.path }

// Release lets go of the lock and keeps its file open, so that Same and
// RemoveIfSame still tell whether the path names it; Close closes it.
func (l *Lock) Release() error { return syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN) }

// RemoveIfSame removes the lock's path if it still names the lock's file
// (its caller serialises the makers and removers of path with another
// lock), then closes the file, letting go of the lock if still held.
func (l *Lock) RemoveIfSame() error {
	var err error
	if l.Same() {
		if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			err = rerr
		}
	}
	if cerr := l.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close closes the lock's file, which lets go of the lock.
func (l *Lock) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// A Contender holds a lock file open to take its lock once it is free,
// trying as often as its caller likes without opening and closing the
// file at each try: a watch on the lock directory sees a close of a file
// open for writing as a release, and would wake every contender at every
// try.
type Contender struct {
	f    *os.File
	path string
}

// Contend opens the lock file at path (created 0600 if needed, its
// directory 0700; never through a symlink) to take its lock with Try.
func Contend(path string) (*Contender, error) {
	f, err := openLockFile(path)
	if err != nil {
		return nil, err
	}
	return &Contender{f: f, path: path}, nil
}

// Try takes the lock if nobody holds it: ok false, and no error, when
// someone does. Once it returns a Lock the Contender is spent (the Lock
// owns the file); the caller should check Same, since the file may have
// been removed or replaced after the Contender opened it.
func (c *Contender) Try() (l *Lock, ok bool, err error) {
	if err := syscall.Flock(int(c.f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("cannot lock %s: %w", c.path, err)
	}
	l = &Lock{f: c.f, path: c.path}
	c.f = nil
	return l, true, nil
}

// Read returns the content of the lock file, up to max bytes: what its
// holder wrote there (Rewrite).
func (c *Contender) Read(max int) ([]byte, error) { return readAt(c.f, c.path, max) }

// Same reports whether path still names the file the Contender holds
// open.
func (c *Contender) Same() bool { return sameFile(c.f, c.path) }

// Close closes the file (a spent Contender: nothing to do).
func (c *Contender) Close() error {
	if c.f == nil {
		return nil
	}
	err := c.f.Close()
	c.f = nil
	return err
}

// RemoveIfSame removes path if it still names the file h holds open, and
// reports whether path no longer names that file (removed now, or
// already). Callers serialise their makers and removers of path with
// another lock, so path cannot change meanwhile.
func RemoveIfSame(path string, h *Held) (bool, error) {
	if !h.Same() {
		return true, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	return true, nil
}

// readAt reads f's content from its start, up to max bytes, with one read
// sized by the file (records are small and read often).
func readAt(f *os.File, path string, max int) ([]byte, error) {
	n := 512
	var st syscall.Stat_t
	if syscall.Fstat(int(f.Fd()), &st) == nil && st.Size > 0 {
		n = int(st.Size) + 1 // one more: a rewrite that grew meanwhile is seen as such
	}
	n = min(n, max)
	for {
		buf := make([]byte, n)
		got, err := f.ReadAt(buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("cannot read %s: %w", path, err)
		}
		if got < n || n == max {
			return buf[:got], nil
		}
		n = min(2*n, max) // it grew: read again
	}
}

// sameFile reports whether path names the file f.
func sameFile(f *os.File, path string) bool {
	if f == nil {
		return false
	}
	var st, pst syscall.Stat_t
	if syscall.Fstat(int(f.Fd()), &st) != nil || syscall.Lstat(path, &pst) != nil {
		return false
	}
	return st.Dev == pst.Dev && st.Ino == pst.Ino
}

// Sync makes the file of a lock made by Create durable: its content, and
// its name in the directory (a record that must outlive a reboot or a
// power cut).
func (l *Lock) Sync() error {
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("cannot sync %s: %w", l.path, err)
	}
	d, err := os.Open(filepath.Dir(l.path))
	if err != nil {
		return fmt.Errorf("cannot sync the directory of %s: %w", l.path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cannot sync the directory of %s: %w", l.path, err)
	}
	return nil
}

// Claim takes the lock of path, made by Create, if nobody holds it: the
// file of a maker that let go of it, or died. ok is false, with no error,
// when it is held, or when path was removed or replaced meanwhile (so
// that two claimers of one file never both hold it while it is named by
// path). A missing path matches fs.ErrNotExist. It never creates path.
func Claim(path string) (l *Lock, ok bool, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, err
	}
	if err := checkFile(path, f); err != nil {
		f.Close()
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("cannot lock %s: %w", path, err)
	}
	if !sameFile(f, path) { // removed by an earlier claimer once it was done with it
		f.Close()
		return nil, false, nil
	}
	return &Lock{f: f, path: path}, true, nil
}

// Read returns the content of the lock's file, up to max bytes.
func (l *Lock) Read(max int) ([]byte, error) { return readAt(l.f, l.path, max) }
