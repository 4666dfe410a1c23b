package snapsvc

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// A record made under a temporary name and linked (a wait's, a flight's)
// is rewritten through the descriptor it was made with, and the kernel
// names those writes by the temporary name: a watch of the lock directory
// must wake at them, or a follower misses its watcher's facts and a joiner
// its leader's outcome until something else happens in the directory (a
// joiner waited its whole poll, 2 runs in 60 of eight processes under
// load).
func TestLockDirWatchWakesAtARecordsRewrite(t *testing.T) {
	dir := t.TempDir()
	w := newDirWatch(dir, lockDirEvents, isRecord)
	defer w.close()
	bg := newBackground()
	defer bg.close()
	if !w.open() {
		t.Fatal("cannot watch the lock directory")
	}
	for _, name := range []string{"k8s" + waitSuffix, "k8s.0123456789abcdef" + flightSuffix} {
		r, err := createRecord(filepath.Join(dir, name), map[string]string{"phase": "open"})
		if err != nil {
			t.Fatal(err)
		}
		mark := w.mark()
		if err := r.publish(map[string]string{"phase": "done"}); err != nil {
			t.Fatal(err)
		}
		woke, err := w.waitFrom(context.Background(), 5*time.Second, mark)
		r.end(bg, filepath.Join(dir, "k8s"+peersSuffix), nil, true)
		if err != nil || !woke {
			t.Errorf("%s rewritten: the watch woke %v (%v), want at once", name, woke, err)
		}
	}
}

// isRecord knows the records by name, and by the temporary names they
// were made under.
func TestIsRecord(t *testing.T) {
	for name, want := range map[string]bool{
		"k8s.lock": true, "k8s.wait": true, "k8s.0a1b.flight": true,
		".k8s.wait.tmp-123-4": true, ".k8s.0a1b.flight.tmp-9-10": true,
		"k8s.peers": false, ".k8s.peers.tmp-1-1": false, ".hidden": false, "k8s.facts": false,
	} {
		if got := isRecord(name); got != want {
			t.Errorf("isRecord(%q) = %v, want %v", name, got, want)
		}
	}
}
