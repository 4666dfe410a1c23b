// Package flock takes advisory, context-aware file locks that serialise
// processes (hooks, daemons, command-line tools) working on the same snap,
// and shares small files between them in the same private directory
// (files.go).
package flock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Lock is a held file lock.
type Lock struct {
	f    *os.File
	path string
}

// Unlock releases the lock and closes the file.
func (l *Lock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	l.f = nil
	return err
}

// Acquire takes an exclusive lock on path, creating the file 0600 (and its
// directory 0700) if needed. It never follows a symlink at path, and
// refuses anything but a regular file. While another process holds the
// lock it retries with short growing pauses until ctx is done; local
// locks are cheap to test, and flock(2) cannot be interrupted by a context.
func Acquire(ctx context.Context, path string) (*Lock, error) {
	return acquire(ctx, path, syscall.LOCK_EX)
}

// AcquireShared is Acquire for a shared lock: any number of shared holders
// at once, none while an exclusive one holds it.
func AcquireShared(ctx context.Context, path string) (*Lock, error) {
	return acquire(ctx, path, syscall.LOCK_SH)
}

// TryAcquire is Acquire without waiting: it returns ok false, and no
// error, when another holder has the lock.
func TryAcquire(path string) (l *Lock, ok bool, err error) {
	f, err := openLockFile(path)
	if err != nil {
		return nil, false, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR) {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("cannot lock %s: %w", path, err)
	}
	return &Lock{f: f, path: path}, true, nil
}

func acquire(ctx context.Context, path string, how int) (*Lock, error) {
	f, err := openLockFile(path)
	if err != nil {
		return nil, err
	}
	pause := time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err == nil {
			return &Lock{f: f, path: path}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("cannot lock %s: %w", path, err)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			f.Close()
			return nil, fmt.Errorf("waiting for lock %s: %w", path, ctx.Err())
		case <-t.C:
		}
		if pause < 50*time.Millisecond {
			pause *= 2
		}
	}
}

// openLockFile opens (creating it 0600, and its directory 0700) the lock
// file at path: never through a symlink, only a regular file of this
// user's in a private directory.
//
// An existing file is opened without O_CREAT first: an open that may
// create takes the directory's lock in the kernel, which a rename or an
// unlink in the same directory holds while it waits for the file system's
// journal, and on a disk busy with fsyncs that is tens of milliseconds
// (a schedule test's call returned 140 ms past its bound, its goroutines
// in openat and renameat). A plain open of an existing file walks the
// directory without that lock.
func openLockFile(path string) (*os.File, error) {
	// The directory is checked when the file must be made: an existing
	// file of this user's (checkFile) can only be in a directory this user
	// made, or that was checked when it was (a directory another user
	// could replace would be in a parent that user can write, which the
	// check refused).
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrPermission) {
		// A directory this user may not enter: whose it is says what to
		// do (a user that is not root meeting root's lock).
		dir := filepath.Dir(path)
		var pe *PermissionError
		switch derr := checkPrivate(dir, true); {
		case errors.As(derr, &pe):
			return nil, derr
		case errors.Is(derr, fs.ErrPermission): // nor may it reach it
			return nil, &PermissionError{Path: dir, Owner: -1, UID: geteuid(), Err: err}
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		if err := ensureDir(filepath.Dir(path)); err != nil {
			return nil, err
		}
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	}
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("refusing lock file %s: it is a symlink", path)
		}
		if errors.Is(err, fs.ErrPermission) {
			return nil, &PermissionError{Path: path, Owner: -1, UID: geteuid(), Err: err}
		}
		return nil, fmt.Errorf("cannot open lock file: %w", err)
	}
	if err := checkFile(path, f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// ensureDir creates the lock directory dir 0700 if needed and refuses one
// that is not private to this user.
func ensureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return &PermissionError{Path: dir, Owner: -1, UID: geteuid(), Err: err}
		}
		return fmt.Errorf("cannot create lock directory: %w", err)
	}
	// The directory may live in a world-writable place (/run/lock): refuse
	// one that another user made or can write, or a symlink planted there.
	return checkPrivate(dir, true)
}

// checkFile refuses an open file that is not a regular file of this
// user's.
func checkFile(path string, f *os.File) error {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("cannot stat lock file %s: %w", path, err)
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return fmt.Errorf("refusing lock file %s: not a regular file", path)
	}
	return checkUID(path, int(st.Uid))
}

// checkPrivate refuses a lock directory that is a symlink, belongs to
// another user, or that group or others can write.
func checkPrivate(dir string, isDir bool) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("cannot check lock directory: %w", err)
	}
	if st.Mode()&os.ModeSymlink != 0 || (isDir && !st.IsDir()) {
		return fmt.Errorf("refusing lock directory %s: not a plain directory", dir)
	}
	if err := checkOwner(dir, st); err != nil {
		return err
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("refusing lock directory %s: writable by others (mode %v)", dir, st.Mode().Perm())
	}
	return nil
}

// checkOwner refuses a lock directory or file of another user. For a
// process that is not root that is a missing permission (the lock of
// root's processes: *PermissionError), for root a refusal to trust what
// another user made.
func checkOwner(path string, st os.FileInfo) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	return checkUID(path, int(sys.Uid))
}

// checkUID is checkOwner for a file or directory owned by uid.
func checkUID(path string, uid int) error {
	euid := geteuid()
	switch {
	case uid == euid:
		return nil
	case euid != 0:
		return &PermissionError{Path: path, Owner: uid, UID: euid}
	}
	return fmt.Errorf("refusing lock %s: owned by uid %d, not by root", path, uid)
}

// geteuid is os.Geteuid (tests replace it).
var geteuid = os.Geteuid

// PermissionError is a lock this process may not take: its directory or
// file belongs to another user and the process is not root (a lock
// directory root's processes made, such as /run/snapsvc or the one beside
// a root-owned socket), or the system refused to create them. It matches
// fs.ErrPermission; retrying cannot help, running as the lock's owner
// (sudo, for root's) can.
type PermissionError struct {
	// Path is the directory or file refused.
	Path string
	// Owner is its owner's uid, -1 when it could not be created.
	Owner int
	// UID is the effective uid of this process.
	UID int
	// Err is the system's error, when it refused (nil for an owner
	// mismatch).
	Err error
}

func (e *PermissionError) Error() string {
	if e.Owner < 0 {
		return fmt.Sprintf("permission denied: uid %d cannot create %s", e.UID, e.Path)
	}
	owner := fmt.Sprintf("uid %d", e.Owner)
	if e.Owner == 0 {
		owner = "root"
	}
	return fmt.Sprintf("permission denied: %s belongs to %s, not to uid %d", e.Path, owner, e.UID)
}

// Is matches fs.ErrPermission.
func (e *PermissionError) Is(target error) bool { return target == fs.ErrPermission }

// Unwrap returns the system's error, if any.
func (e *PermissionError) Unwrap() error { return e.Err }
