package flock

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAcquireCreatesPrivateFileAndExcludes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	path := filepath.Join(dir, "k8s.lock")
	l, err := Acquire(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("lock file mode %v, %v", st.Mode(), err)
	}
	if dst, _ := os.Stat(dir); dst.Mode().Perm() != 0o700 {
		t.Errorf("lock dir mode %v", dst.Mode())
	}
	// A second holder (another open file description, as another process
	// would have) waits until the context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := Acquire(ctx, path); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("second Acquire: %v, want a context error", err)
	}
	if err := l.Unlock(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(context.Background(), path)
	if err != nil {
		t.Fatalf("after unlock: %v", err)
	}
	l2.Unlock()
}

func TestAcquireRefusesSymlinkAndNonRegular(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "k8s.lock")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(context.Background(), link); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("symlink: %v", err)
	}
	sub := filepath.Join(dir, "adir")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(context.Background(), sub); err == nil {
		t.Error("a directory was accepted as a lock file")
	}
}

func TestAcquireRefusesUnsafeDirectory(t *testing.T) {
	base := t.TempDir()
	// A symlinked directory, as another user could plant in /run/lock.
	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "snapsvc")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(context.Background(), filepath.Join(link, "k8s.lock")); err == nil || !strings.Contains(err.Error(), "not a plain directory") {
		t.Errorf("symlinked directory: %v", err)
	}
	// A directory others can write.
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(context.Background(), filepath.Join(open, "k8s.lock")); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Errorf("world-writable directory: %v", err)
	}
}

// Issue 36: a user who is not root met "refusing lock ... owned by uid 0,
// not 65534" for a lock directory root's processes made. That is a
// missing permission, said as one (*PermissionError, fs.ErrPermission);
// root still refuses, as untrusted, a directory another user made.
func TestAcquireNamesAMissingPermission(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	owner := os.Geteuid()
	defer func(f func() int) { geteuid = f }(geteuid)
	geteuid = func() int { return owner + 1 }
	_, err := Acquire(context.Background(), filepath.Join(dir, "k8s.lock"))
	var pe *PermissionError
	if !errors.As(err, &pe) || !errors.Is(err, fs.ErrPermission) || pe.Path != dir || pe.Owner != owner || pe.UID != owner+1 ||
		!strings.HasPrefix(err.Error(), "permission denied: "+dir+" belongs to ") {
		t.Fatalf("another user's lock directory: %v, want a *PermissionError", err)
	}
	if owner == 0 && !strings.Contains(err.Error(), "belongs to root, not to uid 1") {
		t.Errorf("root's directory: %q, want it named root's", err)
	}
	if owner != 0 {
		return // only root can hand a directory to another user
	}
	geteuid = os.Geteuid
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(context.Background(), filepath.Join(dir, "k8s.lock"))
	if err == nil || errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "owned by uid 65534, not by root") {
		t.Errorf("root, another user's directory: %v, want a refusal that is no permission problem", err)
	}
}
