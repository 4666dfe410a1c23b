package snapsvc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/snapsvc/snapsvc/internal/flock"
)

// Records (share.go lists them). A record is a file of a lock directory
// that one peer holds, its exclusive lock taken, and rewrites in place
// with what it publishes. A peer trusts a record only on this evidence:
//
//   - it was written in this boot: it carries the kernel's boot id, and
//     one from another boot says nothing (a lock directory under
//     $SNAP_COMMON survives a reboot, and the monotonic times in it
//     restart near zero with the next boot);
//   - its lock is held: the kernel lets go of a dead process's locks;
//   - its beat moves: its holder rewrites it, its beat counted up, every
//     beatEvery. A peer that has seen the beat stand still for
//     peerSilence, on its own monotonic clock, takes the holder for
//     stopped (SIGSTOP, Ctrl-Z, a debugger, a frozen cgroup) and deposes
//     it: it removes the file, under the snap's peers lock and once it has
//     checked again that the file is the same, held and still, and takes
//     its place. A deposed holder finds out at its next write (the path no
//     longer names its file) and writes nothing more.
//
// Each version of a record is one JSON object, a newline and its
// checksum: a reader that meets a rewrite halfway reads again.

// recordFrame is one version of a record.
type recordFrame struct {
	Boot string          `json:"boot"`
	PID  int             `json:"pid"`
	ID   uint64          `json:"id"`   // this holding's, so that a new holder's first beat never passes for its predecessor's
	Beat uint64          `json:"beat"` // counted up at every write
	Body json.RawMessage `json:"body,omitempty"`
}

// maxRecordSize bounds what is read of a record.
const maxRecordSize = 64 << 10

// encodeFrame is a frame as written: JSON, a newline, its checksum
// (written by hand: every holder writes one at every beat).
func encodeFrame(f recordFrame) []byte {
	b := make([]byte, 0, 96+len(f.Boot)+len(f.Body))
	b = append(b, `{"boot":`...)
	b = strconv.AppendQuote(b, f.Boot)
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(f.PID), 10)
	b = append(b, `,"id":`...)
	b = strconv.AppendUint(b, f.ID, 10)
	b = append(b, `,"beat":`...)
	b = strconv.AppendUint(b, f.Beat, 10)
	if len(f.Body) > 0 {
		b = append(b, `,"body":`...)
		b = append(b, f.Body...)
	}
	b = append(b, '}')
	sum := crc32.ChecksumIEEE(b)
	b = append(b, '\n')
	const hexDigits = "0123456789abcdef"
	for i := 28; i >= 0; i -= 4 {
		b = append(b, hexDigits[sum>>uint(i)&0xf])
	}
	return b
}

// decodeFrame reads a frame written by encodeFrame; false for one read
// halfway through a write, or not a frame at all (a lock file of an
// earlier release, say: empty).
func decodeFrame(b []byte) (recordFrame, bool) {
	var f recordFrame
	i := bytes.LastIndexByte(b, '\n')
	if i < 0 || len(b)-i-1 != 8 {
		return f, false
	}
	sum, err := strconv.ParseUint(string(b[i+1:]), 16, 32)
	if err != nil || uint32(sum) != crc32.ChecksumIEEE(b[:i]) || json.Unmarshal(b[:i], &f) != nil {
		return f, false
	}
	return f, true
}

// readFrame reads a record's frame with read, again while it meets a
// write halfway (a rewrite takes microseconds). ok is false when there is
// no readable frame: none written yet, or not a record.
func readFrame(read func(max int) ([]byte, error)) (f recordFrame, ok bool) {
	for range 100 {
		b, err := read(maxRecordSize)
		if err != nil || len(b) == 0 {
			return recordFrame{}, false
		}
		if f, ok := decodeFrame(b); ok {
			return f, true
		}
	}
	return recordFrame{}, false
}

// thisBoot reports whether f was written in this boot.
func (f recordFrame) thisBoot() bool { return f.Boot == bootID() }

// ---- this boot and its clock ----

var (
	bootOnce sync.Once
	bootRead string
)

// testBootID, when set, stands for the kernel's boot id (export_test.go).
var testBootID func() string

// bootID is the kernel's id of this boot (a random UUID made at each
// boot), "" where there is none to read.
func bootID() string {
	if testBootID != nil {
		return testBootID()
	}
	bootOnce.Do(func() {
		b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
		if err == nil {
			bootRead = strings.TrimSpace(string(b))
		}
	})
	return bootRead
}

// testMachineClockOffset is added to the machine's clock (export_test.go:
// a boot that has run longer).
var testMachineClockOffset time.Duration

// machineNow reads the machine's monotonic clock, in ns: one clock for
// every process of this boot, never stepped. Times in records are on it,
// and mean something only in the boot that wrote them.
func machineNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now().UnixNano() // not on Linux: never reached there
	}
	return ts.Nano() + int64(testMachineClockOffset)
}

// machineTime converts a time of the machine's monotonic clock to the
// client's (real) clock.
func machineTime(ns int64) time.Time { return time.Now().Add(-time.Duration(machineNow() - ns)) }

// machineClock converts a time of the client's (real) clock to the
// machine's monotonic clock.
func machineClock(t time.Time) int64 { return machineNow() - int64(time.Since(t)) }

// ---- the holder's side ----

// errDeposed says a record's holder was deposed: the path no longer names
// its file.
var errDeposed = errors.New("deposed: another process took this record's place, judging its holder stopped")

// heldRecord is a record this process holds.
type heldRecord struct {
	lock *flock.Lock

	mu      sync.Mutex
	frame   recordFrame
	deposed bool
	ended   bool
}

// holdRecord makes l's file a record this process holds, its body (JSON)
// written at once, and beats it until end.
func holdRecord(l *flock.Lock, body []byte) (*heldRecord, error) {
	r := &heldRecord{lock: l, frame: recordFrame{Boot: bootID(), PID: os.Getpid(), ID: rand.Uint64(), Body: body}}
	r.mu.Lock()
	err := r.writeLocked()
	r.mu.Unlock()
	if err != nil {
		_ = l.Unlock()
		return nil, err
	}
	beats.add(r)
	return r, nil
}

// createRecord makes the record path, held by this process from its
// first byte (flock.Create): it fails, matching fs.ErrExist, where path
// exists.
func createRecord(path string, body any) (*heldRecord, error) {
	r := &heldRecord{frame: recordFrame{Boot: bootID(), PID: os.Getpid(), ID: rand.Uint64()}}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	r.frame.Body = b
	if r.lock, err = flock.Create(path, encodeFrame(r.frame)); err != nil {
		return nil, err
	}
	beats.add(r)
	return r, nil
}

// publish rewrites the record with body. It fails with errDeposed once
// the holder was deposed, and writes nothing more then.
func (r *heldRecord) publish(body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frame.Body = b
	return r.writeLocked()
}

// beat rewrites the record as it is, its beat counted up.
func (r *heldRecord) beat() {
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = r.writeLocked()
}

// writeLocked writes the record's frame, its beat counted up (r.mu held).
func (r *heldRecord) writeLocked() error {
	switch {
	case r.ended:
		return nil
	case r.deposed:
		return errDeposed
	case !r.lock.Same():
		r.deposed = true
		return errDeposed
	}
	r.frame.Beat++
	return r.lock.Rewrite(encodeFrame(r.frame))
}

// isDeposed reports whether the holder was deposed, as far as its last
// write could tell.
func (r *heldRecord) isDeposed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.deposed
}

// end stops beating the record and lets go of it, its last version final
// written first (nil: as it is), so that a peer that sees it let go of
// reads it. remove says its file goes too (a wait's or a flight's, whose
// readers hold it open); a snap's lock file stays. The removal, a change
// of the directory that may wait for the file system's journal, runs in
// the background (bg) under the snap's peers lock (peers), and only while
// the path still names this record's file: a peer may have replaced it
// once it was let go of. A deposed holder's file is only closed.
func (r *heldRecord) end(bg *background, peers string, final any, remove bool) {
	beats.remove(r)
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		return
	}
	if final != nil {
		if b, err := json.Marshal(final); err == nil {
			r.frame.Body = b
			_ = r.writeLocked()
		}
	}
	r.ended = true
	deposed := r.deposed
	r.mu.Unlock()
	if !remove || deposed {
		_ = r.lock.Unlock()
		return
	}
	_ = r.lock.Release()
	work := func(ctx context.Context) {
		l, err := flock.Acquire(ctx, peers)
		if err != nil {
			_ = r.lock.Close() // left to whoever comes next: a record let go of is removed by its taker
			return
		}
		defer l.Unlock()
		_ = r.lock.RemoveIfSame()
	}
	if !bg.do(interruptGrace, work) {
		work(context.Background())
	}
}

// beats beats the records this process holds, every beatEvery, on one
// goroutine that runs while there is any (scoped to the records: it ends
// with the last one).
var beats beater

type beater struct {
	mu   sync.Mutex
	recs map[*heldRecord]struct{}
	stop chan struct{} // closed when the last record ends; nil while no goroutine runs
}

func (b *beater) add(r *heldRecord) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.recs == nil {
		b.recs = map[*heldRecord]struct{}{}
	}
	b.recs[r] = struct{}{}
	if b.stop == nil {
		b.stop = make(chan struct{})
		// scoped: ends when the last record this process holds ends (remove).
		go b.run(b.stop)
	}
}

func (b *beater) remove(r *heldRecord) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.recs[r]; !ok {
		return
	}
	delete(b.recs, r)
	if len(b.recs) == 0 && b.stop != nil {
		close(b.stop)
		b.stop = nil
	}
}

func (b *beater) run(stop chan struct{}) {
	t := time.NewTicker(beatEvery)
	defer t.Stop()
	var recs []*heldRecord
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		b.mu.Lock()
		recs = recs[:0]
		for r := range b.recs {
			recs = append(recs, r)
		}
		b.mu.Unlock()
		for _, r := range recs {
			r.beat()
		}
	}
}

// ---- a peer's side ----

// beatWatch judges, from the frames a peer reads, whether their holder
// still beats: on the reader's own monotonic clock, never on a time the
// holder wrote.
type beatWatch struct {
	id, beat uint64
	movedAt  time.Time // when the beat last moved (or was first seen)
}

// silent reports whether f's holder has not beaten for peerSilence, as
// far as the frames read through w tell; a holding not seen before starts
// its count now.
func (w *beatWatch) silent(f recordFrame) bool {
	now := time.Now()
	if w.movedAt.IsZero() || f.ID != w.id || f.Beat != w.beat {
		w.id, w.beat, w.movedAt = f.ID, f.Beat, now
		return false
	}
	return now.Sub(w.movedAt) >= peerSilence
}

// peerRecord is a record another peer holds, held open to read it and to
// tell when its holder lets go.
type peerRecord struct {
	path string
	h    *flock.Held
	bw   beatWatch
}

// openPeer opens the record at path; a missing one matches
// fs.ErrNotExist.
func openPeer(path string) (*peerRecord, error) {
	h, err := flock.Open(path)
	if err != nil {
		return nil, err
	}
	return &peerRecord{path: path, h: h}, nil
}

// peerState is what a peer makes of a record.
type peerState int

const (
	peerLive   peerState = iota // held by a holder that beats
	peerGone                    // let go of (its holder ended, or died), or of another boot
	peerSilent                  // held, but not beaten for peerSilence: its holder is stopped
)

// look reads the record: its frame (ok false: none readable, or of
// another boot: then it says nothing) and what the peer makes of its
// holder.
func (p *peerRecord) look() (f recordFrame, ok bool, st peerState) {
	f, ok = readFrame(p.h.Read)
	if ok && !f.thisBoot() {
		return recordFrame{}, false, peerGone
	}
	if free, err := p.h.Released(); err != nil || free {
		// Read again: the last version may have come just before.
		if g, gok := readFrame(p.h.Read); gok && g.thisBoot() {
			f, ok = g, true
		}
		return f, ok, peerGone
	}
	if ok && p.bw.silent(f) {
		return f, ok, peerSilent
	}
	return f, ok, peerLive
}

// body decodes f's body into v; false when there is none.
func (f recordFrame) body(v any) bool {
	return len(f.Body) > 0 && json.Unmarshal(f.Body, v) == nil
}

// close closes the record.
func (p *peerRecord) close() { p.h.Close() }

// depose removes the record of a holder p saw silent, so that this
// process can take its place: under the snap's peers lock (peers), once
// it checked again that path still names p's file, held, its beat where
// it stood. It reports whether path is free now.
func (p *peerRecord) depose(ctx context.Context, peers string) (bool, error) {
	l, err := flock.Acquire(ctx, peers)
	if err != nil {
		return false, err
	}
	defer l.Unlock()
	if free, err := p.h.Released(); err != nil || free {
		return true, err // let go of meanwhile: whoever comes next removes it
	}
	if f, ok := readFrame(p.h.Read); !ok || f.ID != p.bw.id || f.Beat != p.bw.beat {
		return false, nil // it beat after all
	}
	return flock.RemoveIfSame(p.path, p.h)
}
