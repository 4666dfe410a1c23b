package flock

import (
	"context"
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
