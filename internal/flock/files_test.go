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

func TestTryAcquireAndShared(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks", "k8s.observe")
	l, ok, err := TryAcquire(path)
	if err != nil || !ok {
		t.Fatalf("TryAcquire of a free lock: %v %v", ok, err)
	}
	// Another open file description, as another process has.
	if l2, ok, err := TryAcquire(path); err != nil || ok {
		l2.Unlock()
		t.Fatalf("TryAcquire of a held lock: %v %v, want not ok", ok, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := AcquireShared(ctx, path); err == nil {
		t.Fatal("a shared lock was granted beside an exclusive one")
	}
	l.Unlock()
	s1, err := AcquireShared(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := AcquireShared(context.Background(), path)
	if err != nil {
		t.Fatalf("two shared holders: %v", err)
	}
	if l3, ok, _ := TryAcquire(path); ok {
		l3.Unlock()
		t.Fatal("an exclusive lock was granted beside shared ones")
	}
	s1.Unlock()
	s2.Unlock()
}

func TestWriteFileReplacesAtomically(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "locks")
	path := filepath.Join(dir, "k8s.facts")
	if _, err := ReadFile(path, 100); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	for _, s := range []string{"first", "second, longer", "3"} {
		if err := WriteFile(path, []byte(s)); err != nil {
			t.Fatal(err)
		}
		got, err := ReadFile(path, 100)
		if err != nil || string(got) != s {
			t.Fatalf("read %q %v, want %q", got, err, s)
		}
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", st.Mode())
	}
	if got, _ := ReadFile(path, 0); len(got) != 0 {
		t.Errorf("max 0 read %q", got)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("the directory holds %d entries, want the file alone (no temporary left)", len(ents))
	}
	// Never through a symlink.
	link := filepath.Join(dir, "link.facts")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(link, 100); err == nil {
		t.Error("read through a symlink")
	}
}

func TestCreateIsLockedAndExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "locks", "k8s.abc.flight")
	l, err := Create(path, []byte("open"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Create(path, []byte("other")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second Create: %v, want fs.ErrExist", err)
	}
	h, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if b, _ := h.Read(100); string(b) != "open" {
		t.Errorf("read %q", b)
	}
	if free, err := h.Released(); err != nil || free {
		t.Fatalf("Released while held: %v %v", free, err)
	}
	if free, _ := RemoveReleased(path); free {
		t.Fatal("RemoveReleased removed a held file")
	}
	if err := l.Rewrite([]byte("done")); err != nil {
		t.Fatal(err)
	}
	if b, _ := h.Read(100); string(b) != "done" {
		t.Errorf("after Rewrite read %q", b)
	}
	if !h.Same() {
		t.Error("Same: the path no longer names the file")
	}
	if err := l.Remove(); err != nil {
		t.Fatal(err)
	}
	// The reader still reads what was written, and sees the lock let go.
	if b, _ := h.Read(100); string(b) != "done" {
		t.Errorf("after Remove read %q", b)
	}
	if free, err := h.Released(); err != nil || !free {
		t.Fatalf("Released after Remove: %v %v", free, err)
	}
	if h.Same() {
		t.Error("Same after Remove")
	}
	if free, err := RemoveReleased(path); err != nil || !free {
		t.Fatalf("RemoveReleased of nothing: %v %v", free, err)
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

// A maker that let go without removing its file (a process killed) leaves
// it to the next one.
func TestRemoveReleasedTakesAnAbandonedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k8s.abc.flight")
	l, err := Create(path, []byte("sent"))
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock() // as the kernel does for a process killed
	if free, err := RemoveReleased(path); err != nil || !free {
		t.Fatalf("RemoveReleased: %v %v", free, err)
	}
	l2, err := Create(path, []byte("open"))
	if err != nil {
		t.Fatalf("Create after the abandoned file was removed: %v", err)
	}
	l2.Remove()
}
