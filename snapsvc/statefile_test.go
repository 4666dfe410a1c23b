package snapsvc

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// One rewrite of the state file wakes every wait sharing the watch,
// whichever of them was reading, and a wait that times out hands the
// reading over.
func TestStateWatchWakesEveryWaiter(t *testing.T) {
	w, rewrite := testStateWatch(t)
	ctx := context.Background()
	// A short wait that times out with nothing: the next ones read.
	if woke, err := w.wait(ctx, time.Millisecond); woke || err != nil {
		t.Fatalf("nothing happened, yet %v %v", woke, err)
	}
	const n = 4
	var started, done sync.WaitGroup
	woke := make([]bool, n)
	for i := 0; i < n; i++ {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			started.Done()
			woke[i], _ = w.wait(ctx, time.Minute)
		}()
	}
	started.Wait()
	// Rewrite until every waiter has woken (one rewrite may come before
	// some of them are waiting; any later one wakes them).
	end := make(chan struct{})
	go func() { done.Wait(); close(end) }()
	for i := 0; ; i++ {
		rewrite()
		select {
		case <-end:
			for i, ok := range woke {
				if !ok {
					t.Fatalf("waiter %d timed out", i)
				}
			}
			return
		case <-time.After(10 * time.Millisecond): // the next rewrite, not a synchronisation
		}
	}
}

// A rewrite that happened before a mark, still unread in the inotify
// descriptor, does not pass for one after it; a rewrite after it does.
func TestStateWatchMarkCountsPendingRewrites(t *testing.T) {
	w, rewrite := testStateWatch(t)
	ctx := context.Background()
	rewrite() // before the mark, unread
	m := w.mark()
	if m != 1 {
		t.Fatalf("mark %d: the pending rewrite was not counted", m)
	}
	if woke, err := w.waitFrom(ctx, 20*time.Millisecond, m); woke || err != nil {
		t.Fatalf("woken by the rewrite before the mark: %v %v", woke, err)
	}
	rewrite()
	if woke, err := w.waitFrom(ctx, time.Minute, m); !woke || err != nil {
		t.Fatalf("not woken by the rewrite after the mark: %v %v", woke, err)
	}
}

// testStateWatch opens a watch on a state file in a temporary directory
// and returns it with a function that rewrites the file as snapd does (a
// temporary file renamed over it).
func testStateWatch(t *testing.T) (*dirWatch, func()) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	w := newStateWatch(path)
	if !w.open() {
		t.Skip("no inotify here")
	}
	t.Cleanup(w.close)
	return w, func() {
		tmp := filepath.Join(dir, "state.json.tmp")
		if err := os.WriteFile(tmp, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
}

// A wait whose context has ended returns at once, however long it was
// asked to wait: the end of the context must not be lost to the read
// deadline the wait sets (it was, at random, when the context ended as
// the read began: the wait then slept its whole poll interval, and a
// call returned up to 100 ms past its deadline).
func TestStateWatchEndedContextIsNotLostToTheReadDeadline(t *testing.T) {
	w, _ := testStateWatch(t)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() {
		for range 2000 {
			if _, err := w.waitFrom(ended, time.Hour, w.mark()); err == nil {
				done <- errors.New("a wait on an ended context returned no error")
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		// A wait stuck on its hour-long read deadline: the goroutine is
		// left behind with the watch (closed at cleanup ends it).
		t.Fatal("a wait on an ended context did not return within a minute: it waits out its read deadline")
	}
}
