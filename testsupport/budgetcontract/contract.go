// Package budgetcontract is the contract every budget.Budget
// backend must pass, whatever it coordinates through (etcd, a SQL
// database): one suite of cases run by each backend's tests against a
// Harness that builds participants on a real instance of that backend.
//
// The cases (Run, one subtest each):
//
//	fifo                 waiters are served in the order they queued
//	max-never-exceeded   never more than Max holders at once, and Max is reached
//	release-hands-over   a Release hands the slot to the next waiter at once
//	loss                 a holder cut off for good loses its slot (Lost, Err) and the next waiter gets it
//	fence-fails-once-lost  a holder whose slot another holds now cannot fence
//	fence-waits-while-paused  a holder's Fence waits while its key is paused, also
//	                     after an earlier Fence passed (the pause is read at the
//	                     moment of acting), returns once resumed, and ends with
//	                     ErrBudgetPaused when its context ends first
//	lock-delay           a holder that vanished after its Fence, before MarkReady,
//	                     holds its slot back for the lock-delay
//	no-delay-after-ready a holder that vanished after MarkReady holds nothing back
//	no-delay-never-fenced a holder that vanished before any Fence holds nothing back
//	cancellation         a cancelled Acquire returns promptly and leaves no trace
//	                     (the waiter behind it is not held back)
//	idempotent-release   Release twice is fine; a Release that failed really
//	                     retries when called again (needs a Cutter), handing
//	                     over without lock-delay
//	refusal-never-fails-open  a service that refuses for good (needs a Refuser)
//	                     is a refusal (ErrBudgetRefused) at once, and a
//	                     fail-open participant grants no slot on it
//	hung-probe           a HolderReady probe that hangs (needs a Prober) neither
//	                     stalls the queue nor loses the prober its place: the
//	                     lock-delay ends by itself, a cancelled prober returns
//	                     at once, the order holds
//	resume-lifts-only-its-pause  a Resume whose answer was lost, tried again
//	                     (needs a LossyResumer), leaves a pause set meanwhile
//	cancel-paused-cut-off  an Acquire held back by a pause, cut off from the
//	                     service (needs a Cutter), returns at once when cancelled
//	waiter-dies-at-head  the first waiter in line dies (cut off for good): the
//	                     next one takes the released slot within a TTL, and the
//	                     dead one gets nothing
//	waiters-leave-en-masse  the first 8 of 10 waiters leave at once: the released
//	                     slot goes to the 9th at once, then the 10th
//	service-clock-steps  the coordination service's wall clock is stepped +5 min,
//	                     -10 min, +5 min (needs a ClockStepper) while a holder that
//	                     fenced holds: no slot is freed, nor held back
//
// Time is the backend's: cases wait for real expiries (TTL, lock-delay),
// bounded by the harness's Config, and assert lower bounds strictly (a
// slot never comes free early) and upper bounds with Config.Slack. It is
// test support, not API.
package budgetcontract

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
)

// Options configure one participant.
type Options struct {
	// Holder names it.
	Holder string
	// Max is the key's slot count.
	Max int
	// LockDelay is its lock-delay after it vanished having acted (0:
	// none). Whole seconds.
	LockDelay time.Duration
}

// Participant is one machine taking part in a budget.
type Participant interface {
	budget.Budget
	// Vanish cuts the participant off from the coordination service for
	// good, as a crash would: nothing it holds is renewed or released
	// from now on.
	Vanish()
}

// Cutter is implemented by participants that can be cut off from the
// coordination service for a while (every request fails as
// unreachable) and reconnected. A request sent while cut off must never
// reach the service, not even late once reconnected (a network that
// only delays delivers it then): idempotent-release could not tell a
// retried Release from a failed one that landed after all.
type Cutter interface {
	Cut(off bool)
}

// Refuser is implemented by harnesses that can build a participant whose
// coordination service answers and refuses every request for good (a SQL
// database on a read-only handle or without the budget's tables, an etcd
// client the application closed), configured to fail open: it must still
// grant nothing.
type Refuser interface {
	NewRefused(t *testing.T, o Options) Participant
}

// Prober is implemented by harnesses whose participants can be given a
// probe of a vanished holder's readiness (etcdbudget's and sqlbudget's
// Config.HolderReady): ready is called with the vanished holder's name.
type Prober interface {
	NewProbing(t *testing.T, o Options, ready func(ctx context.Context, holder string) bool) Participant
}

// LossyResumer is implemented by harnesses whose operator can resume a key
// with the answer of its first write lost after the write took effect
// (the backend must try again, as it would after a connection lost at the
// wrong moment); meanwhile runs after that write and before the retry.
type LossyResumer interface {
	ResumeLosingAnswer(t *testing.T, key string, meanwhile func())
}

// ClockStepper is implemented by harnesses whose coordination service has
// a wall clock a test can step (a SQL database's julianday('now'), dqlite
// nodes under libfaketime). etcd has none that decides anything: its
// lessor times leases on the leader's monotonic clock.
type ClockStepper interface {
	// StepClock moves the service's wall clock by d, and returns once the
	// service reads the new time.
	StepClock(t *testing.T, d time.Duration)
}

// Harness builds participants on a running backend.
type Harness interface {
	// New returns a new participant (one machine). It is closed when the
	// test ends.
	New(t *testing.T, o Options) Participant
	// Pause pauses key cluster-wide, as an operator does; Resume lifts
	// it.
	Pause(t *testing.T, key string)
	Resume(t *testing.T, key string)
}

// Config describes the harness's timing.
type Config struct {
	// TTL is the lease (row) TTL the harness gives its participants: a
	// vanished holder's slot expires at most TTL after it vanished.
	TTL time.Duration
	// Slack is how late, past its due time, this backend may let a slot
	// come free (poll intervals, expiry checks, a loaded machine).
	Slack time.Duration
	// Key returns a key no other case uses, naming one service ("snap.app":
	// a case pauses its snap); default "contract-N-M.svc".
	Key func(t *testing.T) string
}

// Run runs every case of the contract against h.
func Run(t *testing.T, h Harness, cfg Config) {
	if cfg.Key == nil {
		n := 0
		var mu sync.Mutex
		cfg.Key = func(t *testing.T) string {
			mu.Lock()
			defer mu.Unlock()
			n++
			return fmt.Sprintf("contract-%d-%d.svc", time.Now().UnixNano(), n)
		}
	}
	c := &suite{h: h, cfg: cfg}
	t.Run("fifo", c.fifo)
	t.Run("max-never-exceeded", c.maxNeverExceeded)
	t.Run("release-hands-over", c.releaseHandsOver)
	t.Run("loss", c.loss)
	t.Run("fence-fails-once-lost", c.fenceFailsOnceLost)
	t.Run("fence-waits-while-paused", func(t *testing.T) { c.fenceWaitsWhilePaused(t, false) })
	t.Run("fence-waits-while-its-snap-is-paused", func(t *testing.T) { c.fenceWaitsWhilePaused(t, true) })
	t.Run("lock-delay", c.lockDelay)
	t.Run("abandon-is-a-crash", c.abandonIsACrash)
	t.Run("no-delay-after-ready", c.noDelayAfterReady)
	t.Run("no-delay-never-fenced", c.noDelayNeverFenced)
	t.Run("cancellation", c.cancellation)
	t.Run("idempotent-release", c.idempotentRelease)
	t.Run("refusal-never-fails-open", c.refusalNeverFailsOpen)
	t.Run("hung-probe", c.hungProbe)
	t.Run("resume-lifts-only-its-pause", c.resumeLiftsOnlyItsPause)
	t.Run("cancel-paused-cut-off", c.cancelPausedCutOff)
	t.Run("waiter-dies-at-head", c.waiterDiesAtHead)
	t.Run("waiters-leave-en-masse", c.waitersLeaveEnMasse)
	t.Run("service-clock-steps", c.serviceClockSteps)
}

type suite struct {
	h   Harness
	cfg Config
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// result is an Acquire's outcome.
type result struct {
	slot budget.Slot
	err  error
	at   time.Time
}

// acquireAsync starts an Acquire and returns its outcome channel and a
// channel closed once the waiter has reported that it waits (it is
// queued).
func acquireAsync(ctx context.Context, p Participant, key string) (<-chan result, <-chan struct{}) {
	out := make(chan result, 1)
	queued := make(chan struct{})
	var once sync.Once
	go func() {
		s, err := p.Acquire(ctx, key, func(budget.Wait) { once.Do(func() { close(queued) }) })
		out <- result{s, err, time.Now()}
	}()
	return out, queued
}

func mustAcquire(t *testing.T, ctx context.Context, p Participant, key string) budget.Slot {
	t.Helper()
	s, err := p.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return s
}

func waitQueued(t *testing.T, ctx context.Context, queued <-chan struct{}, out <-chan result, who string) {
	t.Helper()
	select {
	case <-queued:
	case r := <-out:
		t.Fatalf("%s did not wait: slot %v, err %v", who, r.slot != nil, r.err)
	case <-ctx.Done():
		t.Fatalf("%s never reported that it waits", who)
	}
}

func get(t *testing.T, ctx context.Context, out <-chan result, who string) result {
	t.Helper()
	select {
	case r := <-out:
		if r.err != nil {
			t.Fatalf("%s: acquire failed: %v", who, r.err)
		}
		return r
	case <-ctx.Done():
		t.Fatalf("%s: no slot: %v", who, ctx.Err())
	}
	return result{}
}

func release(t *testing.T, ctx context.Context, s budget.Slot) {
	t.Helper()
	if err := s.Release(ctx); err != nil {
		t.Errorf("release %s: %v", s.Key(), err)
	}
}

func fence(ctx context.Context, s budget.Slot) (time.Duration, error) {
	f, ok := s.(budget.Fencer)
	if !ok {
		return 0, errors.New("the slot does not implement budget.Fencer")
	}
	v, err := f.Fence(ctx)
	if err != nil {
		return 0, err
	}
	d, ends := v.Duration()
	if !ends {
		return 0, errors.New("a budgeted slot's fence confirmed with no end (budget.Unbounded is for slots granted without the coordination service)")
	}
	return d, nil
}

// fifo: waiters queued one after the other are served in that order.
func (c *suite) fifo(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	first := c.h.New(t, Options{Holder: "first", Max: 1})
	s := mustAcquire(t, ctx, first, key)
	var outs []<-chan result
	for i := range 4 {
		name := fmt.Sprintf("waiter-%d", i)
		p := c.h.New(t, Options{Holder: name, Max: 1})
		out, queued := acquireAsync(ctx, p, key)
		waitQueued(t, ctx, queued, out, name)
		outs = append(outs, out)
	}
	release(t, ctx, s)
	for i, out := range outs {
		r := get(t, ctx, out, fmt.Sprintf("waiter-%d", i))
		// Nobody behind it may hold a slot meanwhile.
		for j := i + 1; j < len(outs); j++ {
			select {
			case r2 := <-outs[j]:
				t.Fatalf("waiter-%d got a slot (err %v) while waiter-%d, queued before it, holds it", j, r2.err, i)
			default:
			}
		}
		release(t, ctx, r.slot)
	}
}

// maxNeverExceeded: participants contend for Max 2; the count of holders
// (taken after Acquire and a Fence, given back before Release) never
// exceeds 2, and reaches it.
func (c *suite) maxNeverExceeded(t *testing.T) {
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	const max, n, rounds = 2, 5, 3
	var cur, peak atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, n*rounds)
	for i := range n {
		p := c.h.New(t, Options{Holder: fmt.Sprintf("m%d", i), Max: max})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				s, err := p.Acquire(ctx, key, nil)
				if err != nil {
					errs <- err
					return
				}
				if _, err := fence(ctx, s); err != nil {
					errs <- fmt.Errorf("fence: %w", err)
				}
				v := cur.Add(1)
				for {
					old := peak.Load()
					if v <= old || peak.CompareAndSwap(old, v) {
						break
					}
				}
				time.Sleep(50 * time.Millisecond) // the restart
				cur.Add(-1)
				if err := s.Release(ctx); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d participants × %d rounds at max %d: peak %d holders", n, rounds, max, peak.Load())
	if p := peak.Load(); p > max || p < max {
		t.Errorf("peak %d holders at once, want exactly %d (never more, and the second slot used)", p, max)
	}
}

// releaseHandsOver: a Release hands the slot to the waiter at once (well
// before any expiry could).
func (c *suite) releaseHandsOver(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "a", Max: 1, LockDelay: 30 * time.Second})
	b := c.h.New(t, Options{Holder: "b", Max: 1, LockDelay: 30 * time.Second})
	s := mustAcquire(t, ctx, a, key)
	if _, err := fence(ctx, s); err != nil {
		t.Fatal(err)
	}
	out, queued := acquireAsync(ctx, b, key)
	waitQueued(t, ctx, queued, out, "b")
	at := time.Now()
	release(t, ctx, s)
	r := get(t, ctx, out, "b")
	d := r.at.Sub(at)
	t.Logf("released: next holder after %s", d.Round(time.Millisecond))
	if d > c.cfg.TTL/2+c.cfg.Slack {
		t.Errorf("next holder after %s: a release must hand over at once, not at an expiry", d)
	}
	release(t, ctx, r.slot)
}

// loss: a holder cut off for good loses its slot: Lost closes and Err
// wraps ErrSlotLost within TTL (plus slack), and the next waiter gets it.
func (c *suite) loss(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "a", Max: 1})
	b := c.h.New(t, Options{Holder: "b", Max: 1})
	s := mustAcquire(t, ctx, a, key)
	out, queued := acquireAsync(ctx, b, key)
	waitQueued(t, ctx, queued, out, "b")
	at := time.Now()
	a.Vanish()
	select {
	case <-s.Lost():
	case <-time.After(c.cfg.TTL + c.cfg.Slack):
		t.Fatalf("the cut-off holder's Lost did not close within TTL %s + %s", c.cfg.TTL, c.cfg.Slack)
	}
	lost := time.Since(at)
	if err := s.Err(); !errors.Is(err, budget.ErrSlotLost) {
		t.Errorf("Err() = %v, want ErrSlotLost", err)
	}
	r := get(t, ctx, out, "b")
	t.Logf("holder cut off: lost after %s, next holder after %s", lost.Round(time.Millisecond), r.at.Sub(at).Round(time.Millisecond))
	release(t, ctx, r.slot)
}

// fenceFailsOnceLost: a holder cut off until another holds the slot can
// no longer fence.
func (c *suite) fenceFailsOnceLost(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "a", Max: 1})
	b := c.h.New(t, Options{Holder: "b", Max: 1})
	s := mustAcquire(t, ctx, a, key)
	if v, err := fence(ctx, s); err != nil || v <= 0 || v > c.cfg.TTL+time.Second {
		t.Fatalf("fence of a held slot: valid %s, %v; want (0, TTL]", v, err)
	}
	a.Vanish()
	r := get(t, ctx, func() <-chan result { out, _ := acquireAsync(ctx, b, key); return out }(), "b")
	fctx, cancel := context.WithTimeout(ctx, c.cfg.TTL+c.cfg.Slack)
	defer cancel()
	v, err := fence(fctx, s)
	t.Logf("fence of the lost slot: %v", err)
	if err == nil || !(errors.Is(err, budget.ErrSlotLost) || errors.Is(err, budget.ErrUnavailable)) {
		t.Errorf("fence while another holds the slot: valid %s, err %v; want ErrSlotLost or ErrBudgetUnavailable", v, err)
	}
	if _, err := fence(ctx, r.slot); err != nil {
		t.Errorf("the new holder's fence: %v", err)
	}
	release(t, ctx, r.slot)
}

// fenceWaitsWhilePaused: the pause is read at the moment of acting. With
// bySnap the pause is of the key's snap ("x" for "x.svc": an operator
// pausing a snap pauses each of its services' keys, budget.PauseScopes).
func (c *suite) fenceWaitsWhilePaused(t *testing.T, bySnap bool) {
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	pauseKey := key
	if bySnap {
		snap, _, ok := strings.Cut(key, ".")
		if !ok {
			t.Fatalf("key %q names no snap's service (snap.app)", key)
		}
		pauseKey = snap
	}
	a := c.h.New(t, Options{Holder: "a", Max: 1})
	s := mustAcquire(t, ctx, a, key)
	if _, err := fence(ctx, s); err != nil {
		t.Fatalf("first fence: %v", err)
	}
	c.h.Pause(t, pauseKey)
	paused := true
	defer func() {
		if paused {
			c.h.Resume(t, pauseKey)
		}
	}()
	// Its context ends while paused: ErrBudgetPaused, nothing recorded.
	short, cancel := context.WithTimeout(ctx, c.cfg.TTL/2)
	_, err := fence(short, s)
	cancel()
	if !errors.Is(err, budget.ErrPaused) {
		t.Errorf("fence while paused until its context ended: %v, want ErrBudgetPaused", err)
	}
	type fenced struct {
		valid time.Duration
		err   error
		at    time.Time
	}
	done := make(chan fenced, 1)
	go func() {
		v, err := fence(ctx, s)
		done <- fenced{v, err, time.Now()}
	}()
	select {
	case r := <-done:
		t.Fatalf("fence returned while the key is paused (err %v)", r.err)
	case <-time.After(c.cfg.TTL): // longer than a renewal: it holds the slot meanwhile
	}
	at := time.Now()
	c.h.Resume(t, pauseKey)
	paused = false
	select {
	case r := <-done:
		if r.err != nil || r.valid <= 0 {
			t.Fatalf("fence after resume: valid %s, %v", r.valid, r.err)
		}
		t.Logf("fence returned %s after the resume (valid %s)", r.at.Sub(at).Round(time.Millisecond), r.valid.Round(time.Millisecond))
	case <-time.After(c.cfg.TTL + c.cfg.Slack):
		t.Fatal("fence still waiting after the resume")
	}
	select {
	case <-s.Lost():
		t.Errorf("the slot was lost while paused: %v", s.Err())
	default:
	}
	release(t, ctx, s)
}

// vanishAfter runs a holder through steps (fence, mark ready), makes it
// vanish, and returns how long after that a waiter got the slot.
func (c *suite) vanishAfter(t *testing.T, lockDelay time.Duration, doFence, markReady bool) time.Duration {
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "vanishing", Max: 1, LockDelay: lockDelay})
	b := c.h.New(t, Options{Holder: "next", Max: 1, LockDelay: lockDelay})
	s := mustAcquire(t, ctx, a, key)
	if doFence {
		if _, err := fence(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if markReady {
		r, ok := s.(budget.Readier)
		if !ok {
			t.Fatal("the slot does not implement budget.Readier")
		}
		if err := r.MarkReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	out, queued := acquireAsync(ctx, b, key)
	waitQueued(t, ctx, queued, out, "next")
	at := time.Now()
	a.Vanish()
	r := get(t, ctx, out, "next")
	release(t, ctx, r.slot)
	return r.at.Sub(at)
}

// lockDelay: a holder that vanished between its Fence and its MarkReady
// holds its slot back for the lock-delay after its expiry.
func (c *suite) lockDelay(t *testing.T) {
	const delay = 3 * time.Second
	d := c.vanishAfter(t, delay, true, false)
	t.Logf("vanished after its fence: next holder after %s (TTL %s, lock-delay %s)", d.Round(time.Millisecond), c.cfg.TTL, delay)
	// Its row/lease expires between 2/3 TTL (renewed every TTL/3) and
	// TTL after it vanished; the delay runs from the expiry.
	if lo, hi := delay+c.cfg.TTL/2, delay+c.cfg.TTL+c.cfg.Slack; d < lo || d > hi {
		t.Errorf("next holder after %s, want within [%s, %s]", d, lo, hi)
	}
}

// abandonIsACrash: a holder that abandons its slot between its Fence and
// its MarkReady (budget.Abandoner: snapsvc's Close or MaxHold while its
// change may still run) holds it back as one that vanished would, the
// lock-delay included, and a Release after it hands nothing over sooner.
func (c *suite) abandonIsACrash(t *testing.T) {
	const delay = 3 * time.Second
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "abandoning", Max: 1, LockDelay: delay})
	b := c.h.New(t, Options{Holder: "next", Max: 1, LockDelay: delay})
	s := mustAcquire(t, ctx, a, key)
	ab, ok := s.(budget.Abandoner)
	if !ok {
		t.Fatal("the slot does not implement budget.Abandoner")
	}
	if _, err := fence(ctx, s); err != nil {
		t.Fatal(err)
	}
	out, queued := acquireAsync(ctx, b, key)
	waitQueued(t, ctx, queued, out, "next")
	at := time.Now()
	ab.Abandon()
	if err := s.Release(ctx); err != nil {
		t.Fatalf("Release after Abandon: %v, want nil (nothing to do)", err)
	}
	r := get(t, ctx, out, "next")
	release(t, ctx, r.slot)
	d := r.at.Sub(at)
	t.Logf("abandoned after its fence: next holder after %s (TTL %s, lock-delay %s)", d.Round(time.Millisecond), c.cfg.TTL, delay)
	if lo, hi := delay+c.cfg.TTL/2, delay+c.cfg.TTL+c.cfg.Slack; d < lo || d > hi {
		t.Errorf("next holder after %s, want within [%s, %s], as after a crash", d, lo, hi)
	}
}

// noDelayAfterReady: a holder that vanished after MarkReady holds nothing
// back past its expiry.
func (c *suite) noDelayAfterReady(t *testing.T) {
	const delay = 20 * time.Second
	d := c.vanishAfter(t, delay, true, true)
	t.Logf("vanished after MarkReady: next holder after %s (TTL %s, lock-delay %s)", d.Round(time.Millisecond), c.cfg.TTL, delay)
	if d > c.cfg.TTL+c.cfg.Slack {
		t.Errorf("next holder after %s, want at the expiry (TTL %s + %s), without the %s lock-delay", d, c.cfg.TTL, c.cfg.Slack, delay)
	}
}

// noDelayNeverFenced: a holder that vanished before any Fence never acted.
func (c *suite) noDelayNeverFenced(t *testing.T) {
	const delay = 20 * time.Second
	d := c.vanishAfter(t, delay, false, false)
	t.Logf("vanished before any fence: next holder after %s (TTL %s, lock-delay %s)", d.Round(time.Millisecond), c.cfg.TTL, delay)
	if d > c.cfg.TTL+c.cfg.Slack {
		t.Errorf("next holder after %s, want at the expiry (TTL %s + %s), without the %s lock-delay", d, c.cfg.TTL, c.cfg.Slack, delay)
	}
}

// cancellation: a cancelled Acquire returns promptly with the context's
// error, and the waiter queued behind it is not held back by it.
func (c *suite) cancellation(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "a", Max: 1})
	b := c.h.New(t, Options{Holder: "cancelled", Max: 1})
	d := c.h.New(t, Options{Holder: "behind", Max: 1})
	s := mustAcquire(t, ctx, a, key)
	bctx, cancel := context.WithCancel(ctx)
	bout, bq := acquireAsync(bctx, b, key)
	waitQueued(t, ctx, bq, bout, "cancelled")
	dout, dq := acquireAsync(ctx, d, key)
	waitQueued(t, ctx, dq, dout, "behind")
	at := time.Now()
	cancel()
	select {
	case r := <-bout:
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("cancelled Acquire: slot %v, err %v; want context.Canceled", r.slot != nil, r.err)
		}
		if d := r.at.Sub(at); d > time.Second {
			t.Errorf("cancelled Acquire returned after %s", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("cancelled Acquire did not return")
	}
	rel := time.Now()
	release(t, ctx, s)
	r := get(t, ctx, dout, "behind")
	t.Logf("after a cancelled waiter: next holder %s after the release", r.at.Sub(rel).Round(time.Millisecond))
	if d := r.at.Sub(rel); d > c.cfg.TTL/2+c.cfg.Slack {
		t.Errorf("the waiter behind a cancelled one got the slot %s after the release: the cancelled waiter left a trace", d)
	}
	release(t, ctx, r.slot)
}

// idempotentRelease: Release twice is fine; a failed Release retried
// hands over at once.
func (c *suite) idempotentRelease(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "a", Max: 1, LockDelay: 30 * time.Second})
	s := mustAcquire(t, ctx, a, key)
	release(t, ctx, s)
	release(t, ctx, s)
	cut, ok := a.(Cutter)
	if !ok {
		t.Skip("the harness cannot cut a participant off: the retried release is not checked")
	}
	s = mustAcquire(t, ctx, a, key)
	if _, err := fence(ctx, s); err != nil {
		t.Fatal(err)
	}
	b := c.h.New(t, Options{Holder: "b", Max: 1, LockDelay: 30 * time.Second})
	out, queued := acquireAsync(ctx, b, key)
	waitQueued(t, ctx, queued, out, "b")
	cut.Cut(true)
	rctx, cancel := context.WithTimeout(ctx, c.cfg.TTL/4)
	err := s.Release(rctx)
	cancel()
	cut.Cut(false)
	if err == nil {
		t.Fatal("release while cut off succeeded")
	}
	at := time.Now()
	if err := s.Release(ctx); err != nil {
		t.Fatalf("retried release: %v", err)
	}
	r := get(t, ctx, out, "b")
	t.Logf("release failed, retried: next holder %s after the retry", r.at.Sub(at).Round(time.Millisecond))
	if d := r.at.Sub(at); d > c.cfg.TTL/2+c.cfg.Slack {
		t.Errorf("next holder %s after the retried release: the retry did not release", d)
	}
	release(t, ctx, r.slot)
}

// refusalNeverFailsOpen: a participant configured to fail open, whose
// service refuses for good, gets an error wrapping ErrBudgetRefused (not
// ErrBudgetUnavailable) that names the key, at once, and no slot.
func (c *suite) refusalNeverFailsOpen(t *testing.T) {
	r, ok := c.h.(Refuser)
	if !ok {
		t.Skip("the harness cannot build a participant whose service refuses for good")
	}
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	p := r.NewRefused(t, Options{Holder: "refused", Max: 1})
	start := time.Now()
	s, err := p.Acquire(ctx, key, nil)
	took := time.Since(start)
	t.Logf("refused after %s: %v", took.Round(time.Millisecond), err)
	if s != nil {
		t.Fatalf("a slot was granted (%s) by a service that refuses for good", s.Holder())
	}
	if !errors.Is(err, budget.ErrRefused) || errors.Is(err, budget.ErrUnavailable) {
		t.Fatalf("Acquire: %v; want ErrBudgetRefused, not ErrBudgetUnavailable (a fail-open budget grants on that)", err)
	}
	if !strings.Contains(err.Error(), key) {
		t.Errorf("error %q does not name the key %s", err, key)
	}
	if took > c.cfg.Slack {
		t.Errorf("refused after %s: a permanent answer is not retried", took)
	}
}

// hungProbe: the first waiter behind a vanished holder (that fenced and
// never marked ready) probes it with a HolderReady that never returns.
// The probe runs beside the wait: cancelled, that waiter returns at once;
// the next one in line, probing the same way, keeps its place and takes
// the slot when the lock-delay ends by itself, before the waiter behind
// it.
func (c *suite) hungProbe(t *testing.T) {
	pr, ok := c.h.(Prober)
	if !ok {
		t.Skip("the harness cannot give a participant a HolderReady probe")
	}
	const delay = 3 * time.Second
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	unblock := make(chan struct{})
	// Cleanups run last first: the probes return before the harness's
	// participants are closed.
	t.Cleanup(func() { close(unblock) })
	asked := make(chan string, 100)
	hang := func(_ context.Context, holder string) bool {
		asked <- holder
		<-unblock // ignores its context: the worst a probe can do
		return false
	}
	a := c.h.New(t, Options{Holder: "vanishing", Max: 1, LockDelay: delay})
	first := pr.NewProbing(t, Options{Holder: "first", Max: 1, LockDelay: delay}, hang)
	second := pr.NewProbing(t, Options{Holder: "second", Max: 1, LockDelay: delay}, hang)
	third := c.h.New(t, Options{Holder: "third", Max: 1, LockDelay: delay})
	s := mustAcquire(t, ctx, a, key)
	if _, err := fence(ctx, s); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fout, fq := acquireAsync(fctx, first, key)
	waitQueued(t, ctx, fq, fout, "first")
	sout, sq := acquireAsync(ctx, second, key)
	waitQueued(t, ctx, sq, sout, "second")
	tout, tq := acquireAsync(ctx, third, key)
	waitQueued(t, ctx, tq, tout, "third")
	vanished := time.Now()
	a.Vanish()
	select {
	case h := <-asked:
		if h != "vanishing" {
			t.Errorf("the probe was asked about %q, want the vanished holder", h)
		}
	case r := <-fout:
		t.Fatalf("the first waiter returned (err %v) before probing the vanished holder", r.err)
	case <-ctx.Done():
		t.Fatal("the first waiter never probed the vanished holder")
	}
	at := time.Now()
	cancel()
	select {
	case r := <-fout:
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("cancelled while its probe hangs: slot %v, err %v; want context.Canceled", r.slot != nil, r.err)
		}
		if d := r.at.Sub(at); d > time.Second {
			t.Errorf("cancelled while its probe hangs: returned after %s", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiter whose probe hangs did not return when cancelled")
	}
	var r result
	select {
	case r = <-sout:
		if r.err != nil {
			t.Fatalf("second: %v", r.err)
		}
	case r3 := <-tout:
		t.Fatalf("third got the slot (err %v) before second, queued ahead of it, whose probe hangs", r3.err)
	case <-time.After(c.cfg.TTL + delay + 2*c.cfg.Slack):
		t.Fatalf("second, whose probe hangs, has no slot %s after the holder vanished (TTL %s + lock-delay %s)", time.Since(vanished), c.cfg.TTL, delay)
	}
	d := r.at.Sub(vanished)
	t.Logf("probes hanging: the next waiter took the slot %s after the holder vanished (TTL %s, lock-delay %s)", d.Round(time.Millisecond), c.cfg.TTL, delay)
	if d < delay {
		t.Errorf("slot taken %s after the holder vanished, within its lock-delay %s", d, delay)
	}
	select {
	case r3 := <-tout:
		t.Fatalf("third got a slot (err %v) while second holds it", r3.err)
	default:
	}
	release(t, ctx, r.slot)
	release(t, ctx, get(t, ctx, tout, "third").slot)
}

// resumeLiftsOnlyItsPause: an operator's Resume whose first answer is
// lost is tried again; meanwhile someone else paused the key anew. The
// retry must not lift that pause: a holder's fence still waits.
func (c *suite) resumeLiftsOnlyItsPause(t *testing.T) {
	lr, ok := c.h.(LossyResumer)
	if !ok {
		t.Skip("the harness cannot lose an operator's answer")
	}
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "a", Max: 1})
	s := mustAcquire(t, ctx, a, key)
	c.h.Pause(t, key)
	repaused := false
	lr.ResumeLosingAnswer(t, key, func() {
		c.h.Pause(t, key) // someone else, right after the first resume took effect
		repaused = true
	})
	if !repaused {
		t.Fatal("the harness never ran meanwhile: no answer was lost")
	}
	short, cancel := context.WithTimeout(ctx, c.cfg.TTL/2)
	_, err := fence(short, s)
	cancel()
	if !errors.Is(err, budget.ErrPaused) {
		t.Errorf("fence after a resume retried over a newer pause: %v; want ErrBudgetPaused (the newer pause must stand)", err)
	}
	c.h.Resume(t, key)
	if _, err := fence(ctx, s); err != nil {
		t.Errorf("fence once resumed: %v", err)
	}
	release(t, ctx, s)
}

// cancelPausedCutOff: an Acquire that took its slot but waits on a pause,
// cut off from the service, returns promptly once its context ends (it
// does not wait for the service to give the slot back), and the slot is
// free again within TTL once the participant is back.
func (c *suite) cancelPausedCutOff(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	p := c.h.New(t, Options{Holder: "paused", Max: 1})
	cut, ok := p.(Cutter)
	if !ok {
		t.Skip("the harness cannot cut a participant off")
	}
	c.h.Pause(t, key)
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out, queued := acquireAsync(pctx, p, key)
	waitQueued(t, ctx, queued, out, "paused") // the only report: the pause
	cut.Cut(true)
	at := time.Now()
	cancel()
	select {
	case r := <-out:
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("cancelled while paused and cut off: slot %v, err %v; want context.Canceled", r.slot != nil, r.err)
		}
		if d := r.at.Sub(at); d > time.Second {
			t.Errorf("cancelled while paused and cut off: returned after %s", d)
		}
	case <-time.After(c.cfg.TTL + c.cfg.Slack):
		t.Fatal("cancelled while paused and cut off: Acquire did not return")
	}
	cut.Cut(false)
	c.h.Resume(t, key)
	next := c.h.New(t, Options{Holder: "next", Max: 1})
	start := time.Now()
	s := get(t, ctx, func() <-chan result { o, _ := acquireAsync(ctx, next, key); return o }(), "next")
	t.Logf("the cancelled participant's slot was free again %s later", s.at.Sub(start).Round(time.Millisecond))
	if d := s.at.Sub(start); d > c.cfg.TTL+c.cfg.Slack {
		t.Errorf("the next participant waited %s: the cancelled one left its slot beyond its TTL", d)
	}
	release(t, ctx, s.slot)
}

// waiterDiesAtHead: the first waiter in line dies (cut off for good, as a
// crash: whatever it left in the service stays until it expires). Once
// the holder releases, the next waiter takes the slot within a TTL (the
// dead one's expiry at the latest), and the dead one never gets it.
func (c *suite) waiterDiesAtHead(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "a", Max: 1})
	dead := c.h.New(t, Options{Holder: "dead", Max: 1})
	next := c.h.New(t, Options{Holder: "next", Max: 1})
	s := mustAcquire(t, ctx, a, key)
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dout, dq := acquireAsync(dctx, dead, key)
	waitQueued(t, ctx, dq, dout, "dead")
	nout, nq := acquireAsync(ctx, next, key)
	waitQueued(t, ctx, nq, nout, "next")
	dead.Vanish()
	at := time.Now()
	release(t, ctx, s)
	deadline := time.After(c.cfg.TTL + 2*c.cfg.Slack)
	for {
		select {
		case r := <-nout:
			if r.err != nil {
				t.Fatalf("next: %v", r.err)
			}
			d := r.at.Sub(at)
			t.Logf("the first waiter died: the next took the released slot %s later (TTL %s)", d.Round(time.Millisecond), c.cfg.TTL)
			if d > c.cfg.TTL+c.cfg.Slack {
				t.Errorf("the next waiter took the slot %s after the release, beyond the dead waiter's TTL %s (+%s)", d, c.cfg.TTL, c.cfg.Slack)
			}
			select {
			case rd := <-dout:
				if rd.slot != nil {
					t.Errorf("the dead waiter was granted the slot too")
				}
			default:
			}
			release(t, ctx, r.slot)
			return
		case rd := <-dout:
			// Cut off, it may learn that it lost its place: never a slot.
			if rd.slot != nil {
				t.Fatalf("the dead waiter was granted the slot")
			}
			dout = nil
		case <-deadline:
			t.Fatalf("the slot released behind a dead waiter was not taken within %s", c.cfg.TTL+2*c.cfg.Slack)
		}
	}
}

// waitersLeaveEnMasse: 10 waiters queue, then the first 8 leave at once
// (their contexts end, as a common deadline ends the first arrivals'
// waits first). The holder's release hands the slot to the 9th at once
// (as a release does: well before any expiry), then the 10th.
func (c *suite) waitersLeaveEnMasse(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "a", Max: 1})
	s := mustAcquire(t, ctx, a, key)
	var cancels []context.CancelFunc
	var outs []<-chan result
	for i := range 10 {
		name := fmt.Sprintf("waiter-%d", i)
		p := c.h.New(t, Options{Holder: name, Max: 1})
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		out, queued := acquireAsync(wctx, p, key)
		waitQueued(t, ctx, queued, out, name)
		cancels, outs = append(cancels, cancel), append(outs, out)
	}
	for _, cancel := range cancels[:8] {
		cancel()
	}
	for i, out := range outs[:8] {
		if r := <-out; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("waiter-%d, leaving: slot %v, %v", i, r.slot != nil, r.err)
		}
	}
	at := time.Now()
	release(t, ctx, s)
	r := get(t, ctx, outs[8], "waiter-8")
	d := r.at.Sub(at)
	t.Logf("8 of 10 waiters left at once: the 9th took the released slot %s later", d.Round(time.Millisecond))
	if d > c.cfg.TTL/2+c.cfg.Slack {
		t.Errorf("the 9th waiter took the slot %s after the release: the 8 that left held it back", d)
	}
	select {
	case r10 := <-outs[9]:
		t.Fatalf("waiter-9 got a slot (err %v) while waiter-8, queued before it, holds it", r10.err)
	default:
	}
	release(t, ctx, r.slot)
	release(t, ctx, get(t, ctx, outs[9], "waiter-9").slot)
}

// serviceClockSteps: the coordination service's wall clock is stepped
// +5 min, then -10 min (5 min behind), then +5 min back, while a holder
// that fenced holds the slot and another participant waits. In each
// step's window (three TTLs) a participant that arrives gets no slot, the
// waiter keeps waiting, and the holder keeps its slot; the release then
// hands over at once.
func (c *suite) serviceClockSteps(t *testing.T) {
	cs, ok := c.h.(ClockStepper)
	if !ok {
		t.Skip("the harness's coordination service has no wall clock to step (etcd's leases are timed on its leader's monotonic clock)")
	}
	ctx := ctxT(t, 2*time.Minute)
	key := c.cfg.Key(t)
	a := c.h.New(t, Options{Holder: "a", Max: 1, LockDelay: 30 * time.Second})
	b := c.h.New(t, Options{Holder: "b", Max: 1, LockDelay: 30 * time.Second})
	s := mustAcquire(t, ctx, a, key)
	if _, err := fence(ctx, s); err != nil {
		t.Fatal(err)
	}
	out, queued := acquireAsync(ctx, b, key)
	waitQueued(t, ctx, queued, out, "b")
	net := time.Duration(0)
	defer func() { cs.StepClock(t, -net) }()
	for i, step := range []time.Duration{5 * time.Minute, -10 * time.Minute, 5 * time.Minute} {
		cs.StepClock(t, step)
		net += step
		stepped := time.Now()
		late := c.h.New(t, Options{Holder: fmt.Sprintf("late-%d", i), Max: 1, LockDelay: 30 * time.Second})
		lctx, cancel := context.WithTimeout(ctx, 3*c.cfg.TTL)
		lout, _ := acquireAsync(lctx, late, key)
		select {
		case r := <-out:
			cancel()
			t.Fatalf("b's wait ended (slot %v, err %v) %s after the service's clock stepped %s, while a holds the slot", r.slot != nil, r.err, time.Since(stepped).Round(time.Millisecond), step)
		case <-s.Lost():
			cancel()
			t.Fatalf("a lost its slot %s after the service's clock stepped %s: %v", time.Since(stepped).Round(time.Millisecond), step, s.Err())
		case r := <-lout:
			cancel()
			if r.slot != nil {
				t.Fatalf("a participant arriving after the service's clock stepped %s took the slot %s after the step, while a holds it", step, time.Since(stepped).Round(time.Millisecond))
			}
			if !errors.Is(r.err, context.DeadlineExceeded) {
				t.Fatalf("a participant arriving after a step of %s: %v", step, r.err)
			}
		}
		t.Logf("service clock stepped %s: a holds, b waits (3 TTLs watched)", step)
	}
	at := time.Now()
	release(t, ctx, s)
	r := get(t, ctx, out, "b")
	t.Logf("released: b took the slot %s later", r.at.Sub(at).Round(time.Millisecond))
	if d := r.at.Sub(at); d > c.cfg.TTL/2+c.cfg.Slack {
		t.Errorf("b took the slot %s after the release: the steps held it back", d)
	}
	release(t, ctx, r.slot)
}
