package snapsvc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Test hooks: what the package's own tests need to see inside it, kept
// out of the package itself (as net/http's export_test.go does).

// subscriptionsChanged is closed and replaced at every subscription change
// of the shared waits (under processWaits.mu).
var subscriptionsChanged = make(chan struct{})

func init() {
	testHookSubscriptions = func() {
		close(subscriptionsChanged)
		subscriptionsChanged = make(chan struct{})
	}
}

// awaitSubscribers blocks until n callers wait on key's shared wait, or
// ctx ends.
func (s *waitRegistry) awaitSubscribers(ctx context.Context, key string, n int) error {
	for {
		s.mu.Lock()
		refs := 0
		if w := s.waits[key]; w != nil {
			refs = len(w.joins)
		}
		changed := subscriptionsChanged
		s.mu.Unlock()
		if refs == n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%d callers share the wait, want %d: %w", refs, n, ctx.Err())
		}
	}
}

// A move the hold lifecycle does not allow is a defect: every test of the
// package fails on one (budget_lifecycle.go, testHookBadMove).
var badMoves struct {
	sync.Mutex
	seen []string
}

func init() {
	testHookBadMove = func(from, to holdState) {
		badMoves.Lock()
		defer badMoves.Unlock()
		badMoves.seen = append(badMoves.seen, from.String()+" -> "+to.String())
	}
}

// BadHoldMoves returns the moves against the lifecycle seen so far.
func BadHoldMoves() []string {
	badMoves.Lock()
	defer badMoves.Unlock()
	return slices.Clone(badMoves.seen)
}

// SetFlightReadHook makes f run whenever a restart has read the phase of
// another process's flight it may join (machineflight.go), until the test ends.
func SetFlightReadHook(t interface{ Cleanup(func()) }, f func(phase string)) {
	testHookFlightRead = f
	t.Cleanup(func() { testHookFlightRead = func(string) {} })
}

// SetFactsWriteHook makes f run before each write of a machine observer's
// facts (machinewait.go), until the test ends.
func SetFactsWriteHook(t interface{ Cleanup(func()) }, f func()) {
	testHookFactsWrite = f
	t.Cleanup(func() { testHookFactsWrite = func() {} })
}

// SetWatchCloseHook makes f run as a Client's directory watch closes its
// inotify instance (watch.go), until the test ends.
func SetWatchCloseHook(t interface{ Cleanup(func()) }, f func()) {
	testHookWatchClose = f
	t.Cleanup(func() { testHookWatchClose = func() {} })
}

// Watching reports whether a process watches snap for the machine in the
// lock directory dir: its wait record is held, and says the snap busy.
func Watching(dir, snap string) bool {
	p, err := openPeer(filepath.Join(dir, snap+waitSuffix))
	if err != nil {
		return false
	}
	defer p.close()
	fr, ok, st := p.look()
	f := factsOf(fr, ok)
	return st != peerGone && f.busy()
}

// AwaitLockDir blocks until cond holds of the lock directory dir, looked
// at again at every change of a record there, or until ctx ends.
func AwaitLockDir(ctx context.Context, dir string, cond func() bool) error {
	for {
		w := newDirWatch(dir, lockDirEvents, isRecord)
		watched := w.open()
		var mark uint64
		if watched {
			mark = w.mark()
		}
		if cond() {
			w.close()
			return nil
		}
		var err error
		if watched {
			_, err = w.waitFrom(ctx, time.Second, mark)
		} else {
			// The directory is not made yet: it is, at the first lock.
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
		w.close()
		if ctx.Err() != nil {
			return fmt.Errorf("the lock directory %s never got there: %w", dir, ctx.Err())
		}
		if err != nil && ctx.Err() == nil {
			continue
		}
	}
}

// SetBootID makes id this boot's id (records.go), until the test ends.
func SetBootID(t interface{ Cleanup(func()) }, id string) {
	testBootID = func() string { return id }
	t.Cleanup(func() { testBootID = nil })
}

// WritePreviousBoot writes, in the lock directory dir, snap's wait record
// as a process of an earlier boot left it: held by nobody, of another
// boot, its times those of a boot that ran for days (the monotonic clock
// restarts near zero at each boot), saying the snap was free last.
func WritePreviousBoot(dir, snap string) error {
	now := machineNow()
	days := int64(3 * 24 * time.Hour)
	body, _ := json.Marshal(machineFacts{Busy: now + days, Free: now + days + int64(time.Second)})
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, snap+waitSuffix), encodeFrame(recordFrame{Boot: "an-earlier-boot", PID: 1, ID: 1, Beat: 7, Body: body}), 0o600)
}

// SetLockWaitHook makes f run as an operation begins to wait for a snap's
// lock another process holds, until the test ends.
func SetLockWaitHook(t interface{ Cleanup(func()) }, f func(snap string)) {
	testHookLockWait = f
	t.Cleanup(func() { testHookLockWait = func(string) {} })
}

// SetMergeHook makes f run as a restart joins an identical restart of its
// process (true) or begins leading them (false), until the test ends.
func SetMergeHook(t interface{ Cleanup(func()) }, f func(joined bool)) {
	testHookMerge = f
	t.Cleanup(func() { testHookMerge = func(bool) {} })
}

// Flights counts the flights of snap in the lock directory dir whose
// leader holds their record.
func Flights(dir, snap string) int {
	names, _ := filepath.Glob(filepath.Join(dir, snap+".*"+flightSuffix))
	n := 0
	for _, name := range names {
		p, err := openPeer(name)
		if err != nil {
			continue
		}
		if _, _, st := p.look(); st != peerGone {
			n++
		}
		p.close()
	}
	return n
}

// WithWallClock makes the machine's wall clock, as the Client reads it at
// each of its readings, f's: a test steps it apart from the monotonic
// clock, as an NTP step does (Go's readings cannot be made to).
func WithWallClock(f func(time.Time) time.Time) Option {
	return func(s *settings) { s.wall = f }
}

// SetIntentPoint calls f at each point of an intent's life (intent.go):
// the crash tests' workers kill themselves there.
func SetIntentPoint(f func(point string)) { testIntentPoint = f }

// IntentFiles lists the intent records in dir.
func IntentFiles(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if _, ok := intentSnap(e.Name()); ok {
			out = append(out, e.Name())
		}
	}
	return out
}
