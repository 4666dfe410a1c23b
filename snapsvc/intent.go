package snapsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"math/rand/v2"

	"golang.org/x/sys/unix"

	"github.com/snapsvc/snapsvc/internal/flock"
)

// Intents (WithIntents). An operation's intent is a record of what it
// asks, made in the snap's lock directory when the call begins, before
// anything is waited for or sent, and removed once the call has an
// outcome its caller was told of. While its process lives it holds the
// record's lock; a process that dies (kill -9, an OOM kill, a reboot) lets
// go of it, and what is left is an intent nobody carried out, or nobody
// saw carried out. Replay (replay.go) finds such records and finishes
// them, once: it takes a record's lock before it does anything with it,
// and never takes one that is held, however long its holder has been
// still (a stopped process comes back and carries on).
//
// The record says, as the operation learns it, what a replay decides
// from: that a request to act is about to be sent (its send time on the
// machine's wall and monotonic clocks, and the highest change id seen by
// then: snapd's changes made after it are told from earlier ones as a
// lost answer's are, matching.go), the change snapd made, and its final
// status. The record is one fixed-size frame rewritten in place (a single
// write: a process killed during it leaves the old frame or the new),
// made durable when it is made, so that it outlives a reboot.

// intentSuffix ends the name of an intent record: SNAP.ID.intent.
const intentSuffix = ".intent"

// intentBody is what an intent record says.
type intentBody struct {
	Action  string   `json:"action"`
	Names   []string `json:"names"`
	Enable  bool     `json:"enable,omitempty"`
	Disable bool     `json:"disable,omitempty"`
	Reload  bool     `json:"reload,omitempty"`
	// At is when the intent was recorded, on the machine's boot clock
	// (CLOCK_BOOTTIME, ns: it counts a suspend, which CLOCK_MONOTONIC
	// does not), meaningful in the boot that wrote it only; Wall is the
	// machine's wall clock then (ns since the epoch), on which snapd
	// stamps its changes; Seen is the highest change id the Client had
	// seen by then (snapd numbers its changes in order).
	At   int64 `json:"at"`
	Wall int64 `json:"wall"`
	Seen int64 `json:"seen,omitempty"`
	// Sent is the last request to act, written just before it was sent.
	Sent *intentSent `json:"sent,omitempty"`
	// Change is snapd's change for the request, once known.
	Change string `json:"change,omitempty"`
	// Outcome is the change's final status, once known: the record
	// goes next.
	Outcome string `json:"outcome,omitempty"`
	// Act is the restart budget's act id of the operation's hold
	// (budget.Act.ID), so that a replay records the same act once.
	Act string `json:"act,omitempty"`
}

// intentSent is when a request to act was sent, as a replay in another
// process needs it (sent, matching.go).
type intentSent struct {
	Wall    int64 `json:"wall"` // the machine's wall clock, ns since the epoch
	Mono    int64 `json:"mono"` // the machine's boot clock (bootNow), ns
	Seen    int64 `json:"seen"`
	Counted bool  `json:"counted,omitempty"`
}

// request is the operation the intent asks for.
func (b intentBody) set(o *request) {
	o.enable, o.disable, o.reload = b.Enable, b.Disable, b.Reload
}

// intentFrameSize is the size every frame of an intent record is written
// at (its JSON padded), a multiple of it where the body needs more.
const intentFrameSize = 1024

// intentRecord is an intent this process holds.
type intentRecord struct {
	mu    sync.Mutex
	lock  *flock.Lock
	frame recordFrame
	size  int
	body  intentBody
	ended bool
}

// testIntentPoint, when set, is called at each point of an intent's life
// (export_test.go: the crash tests stop the process there).
var testIntentPoint func(point string)

func intentPoint(point string) {
	if testIntentPoint != nil {
		testIntentPoint(point)
	}
}

// recordIntent makes the intent record of request o in the lock
// directory of its first snap.
func (c *Client) recordIntent(o request) (*intentRecord, error) {
	snap := o.t.snaps[0]
	dir := c.lockDirs.of(snap)
	if dir == "" {
		return nil, nil
	}
	body := intentBody{Action: o.action, Names: o.t.names, Enable: o.enable, Disable: o.disable, Reload: o.reload,
		At: bootNow(), Wall: c.view.clock.wallAt(time.Now()).UnixNano(), Seen: c.view.maxID.Load()}
	intentPoint("before-record")
	for {
		path := filepath.Join(dir, snap+"."+strconv.FormatUint(rand.Uint64(), 16)+intentSuffix)
		r, err := createIntent(path, body)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cannot record the intent to %s %s: %w", o.action, o.t, err)
		}
		intentPoint("recorded")
		return r, nil
	}
}

// createIntent makes the record path with body, held by this process,
// durable before it returns.
func createIntent(path string, body intentBody) (*intentRecord, error) {
	r := &intentRecord{body: body, frame: recordFrame{Boot: bootID(), PID: os.Getpid(), ID: rand.Uint64()}}
	b, err := r.encode()
	if err != nil {
		return nil, err
	}
	r.size = len(b)
	if r.lock, err = flock.Create(path, b); err != nil {
		return nil, err
	}
	if err := r.lock.Sync(); err != nil {
		_ = r.lock.Remove()
		return nil, err
	}
	return r, nil
}

// encode is the record's frame, padded to its size (the first: to a
// multiple of intentFrameSize with room to grow).
func (r *intentRecord) encode() ([]byte, error) {
	b, err := json.Marshal(r.body)
	if err != nil {
		return nil, err
	}
	r.frame.Body = b
	r.frame.Beat++
	f := encodeFrame(r.frame)
	size := r.size
	if size == 0 {
		size = (len(f) + 512 + intentFrameSize - 1) / intentFrameSize * intentFrameSize
	}
	if len(f) > size {
		return nil, fmt.Errorf("intent record of %d bytes outgrew its %d", len(f), size)
	}
	// Leading spaces, which the JSON decoder skips, under the checksum.
	body := f[:len(f)-9] // the JSON, without its newline and checksum
	padded := make([]byte, 0, size)
	for range size - len(f) {
		padded = append(padded, ' ')
	}
	padded = append(padded, body...)
	sum := crc32.ChecksumIEEE(padded)
	return fmt.Appendf(padded, "\n%08x", sum), nil
}

// update changes the record's body with f and writes it.
func (r *intentRecord) update(f func(b *intentBody)) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return nil
	}
	f(&r.body)
	b, err := r.encode()
	if err == nil {
		err = r.lock.Rewrite(b)
	}
	if err != nil {
		return fmt.Errorf("cannot update the intent record %s: %w", r.lock.Path(), err)
	}
	return nil
}

// sending writes that a request to act, stamped s, is about to be sent
// (act: the budget's act id, if any): a replay looks for its change
// before it sends anything again.
func (r *intentRecord) sending(s sent, wall time.Time, act string) error {
	if r == nil {
		return nil
	}
	err := r.update(func(b *intentBody) {
		b.Sent = &intentSent{Wall: wall.UnixNano(), Mono: bootNow(), Seen: s.seen, Counted: s.counted}
		if act != "" {
			b.Act = act
		}
	})
	intentPoint("sending")
	return err
}

// nothingSent writes that the last request to act made no change (snapd
// refused it for a conflict, or it never left): a replay sends without
// looking for one, which it could not always do (snapctl without
// snap-refresh-observe lists no change).
func (r *intentRecord) nothingSent() {
	if r == nil {
		return
	}
	_ = r.update(func(b *intentBody) { b.Sent = nil })
}

// accepted writes snapd's change for the request.
func (r *intentRecord) accepted(id string) {
	if r == nil || id == "" {
		return
	}
	_ = r.update(func(b *intentBody) { b.Change = id })
	intentPoint("accepted")
}

// end ends the intent for the outcome its caller is told of: an outcome,
// or a failure whose retry is the caller's, removes it; a call that ended
// with its context (the process shutting down, say) or without knowing
// what its request did leaves it to a replay.
func (r *intentRecord) end(ctx context.Context, res *Result, err error) {
	if r == nil {
		return
	}
	if err != nil && (ctx.Err() != nil || errors.Is(err, ErrOutcomeUnknown)) {
		r.keep()
		return
	}
	r.finish(res, err)
}

// finish writes the outcome its caller is told of (res, or err's failed
// change), then removes the record.
func (r *intentRecord) finish(res *Result, err error) {
	if res != nil {
		_ = r.update(func(b *intentBody) {
			if res.ChangeID != "" {
				b.Change = res.ChangeID
			}
			b.Outcome = res.Status
			if b.Outcome == "" {
				b.Outcome = "Queued"
			}
		})
	} else {
		var ce *ChangeError
		if errors.As(err, &ce) {
			_ = r.update(func(b *intentBody) { b.Change, b.Outcome = ce.ID, ce.Status })
		}
	}
	intentPoint("outcome")
	r.clear()
	intentPoint("cleared")
}

// clear removes the record and lets go of it. Only the holder of a
// record's lock removes it (its maker, or the replay that took it), and a
// taker checks that the path still names the file it locked
// (flock.Claim), so no other lock is needed: none that a stopped peer
// could hold up.
func (r *intentRecord) clear() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return
	}
	r.ended = true
	_ = r.lock.RemoveIfSame() // closes it, letting go
}

// rebase makes the record this boot's from its next write.
func (r *intentRecord) rebase() {
	r.mu.Lock()
	r.frame.Boot = bootID()
	r.mu.Unlock()
}

// keep lets go of the record, left for a replay.
func (r *intentRecord) keep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ended {
		return
	}
	r.ended = true
	_ = r.lock.Unlock()
}

// WithIntents makes every Start, Stop and Restart durable across the
// death of its process: each records its intent in the snap's lock
// directory before it waits for or sends anything, and removes it once its
// caller has the outcome. A process killed meanwhile (kill -9, an OOM
// kill, a reboot) leaves the intent, and the next Client built with this
// option replays it when it is made (Startup reports what that did; the
// Client's own operations wait for it, so that an older intent never
// undoes a newer call), as Replay does: once on the machine, from snapd's records, never sending a
// request whose change snapd already made. A call that ends with its
// context (a daemon shutting down), or without knowing what its request
// did (ErrOutcomeUnknown), leaves its intent too. An asynchronous
// operation's intent ends once snapd accepts it: snapd's change is then
// snapd's own record, carried out whatever happens to the process.
//
// Intents live in the lock directory, so they need one: New fails with
// WithoutFileLock. The default for a snap is $SNAP_COMMON/.snapsvc-lock,
// which outlives a reboot (/run/snapsvc, the default for a snap not
// installed, does not). EnsureRunning and EnsureStopped record theirs
// too, for the operation they send.
func WithIntents() Option { return func(s *settings) { s.intents = true } }

// recordIntent records op's intent (WithIntents; not for a replay, which
// holds the intent it replays).
func (op *operation) recordIntent() error {
	switch {
	case !op.c.intents || op.replay != nil:
		return nil
	case op.o.action != "start" && op.o.action != "stop" && op.o.action != "restart":
		return nil // a refresh: snapd's refresh change is its record (docs/intents.md)
	}
	r, err := op.c.recordIntent(op.o)
	if err != nil {
		return op.c.opError(op.o, "", 0, err)
	}
	op.intent = r
	return nil
}

// handedOver ends the intent of an asynchronous operation snapd accepted:
// its change is snapd's record from now on.
func (r *intentRecord) handedOver() {
	if r == nil {
		return
	}
	intentPoint("outcome")
	r.clear()
	intentPoint("cleared")
}

// bootNow reads the machine's boot clock, in ns: CLOCK_BOOTTIME, one
// clock for every process of this boot that, unlike CLOCK_MONOTONIC,
// counts a suspend, so that a suspend between a send and a replay does not
// pass for a step of the wall clock.
func bootNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return machineNow()
	}
	return ts.Nano() + int64(testMachineClockOffset)
}
