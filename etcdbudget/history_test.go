package etcdbudget_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
)

// failedAct is a failed restart of k8s.kubelet by machine.
func failedAct(machine, change string) budget.Act {
	return budget.Act{Holder: machine + " pid 1", Machine: machine, Action: "restart", Services: []string{"k8s.kubelet"},
		Change: change, Outcome: budget.OutcomeFailed, Reason: "not ready within 5m0s"}
}

func readyAct(machine, change string) budget.Act {
	a := failedAct(machine, change)
	a.Outcome, a.Reason = budget.OutcomeReady, ""
	return a
}

func record(t *testing.T, ctx context.Context, s budget.Slot, act budget.Act) *budget.Halt {
	t.Helper()
	r, ok := s.(budget.Recorder)
	if !ok {
		t.Fatalf("%T is no budget.Recorder", s)
	}
	h, err := r.Record(ctx, act)
	if err != nil {
		t.Fatalf("Record: %v", err)
	}
	return h
}

func history(t *testing.T, ctx context.Context, b *etcdbudget.Budget, key string, limit int) []budget.Record {
	t.Helper()
	recs, err := b.History(ctx, key, limit)
	if err != nil {
		t.Fatalf("History: %v", err)
	}
	return recs
}

// kinds renders records as "act:failed:node-1 halted resumed ...".
func kinds(recs []budget.Record) string {
	var out []string
	for _, r := range recs {
		s := string(r.Kind)
		if r.Act != nil {
			s += ":" + string(r.Act.Outcome) + ":" + r.Act.Machine
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

func fencer(t *testing.T, s budget.Slot) budget.Fencer {
	t.Helper()
	f, ok := s.(budget.Fencer)
	if !ok {
		t.Fatalf("%T is no budget.Fencer", s)
	}
	return f
}

// The first failure halts a key (HaltAfter's default): the halt is the
// key's pause, with the failed act's machine, change and reason, in its
// status and its history. A holder's Fence on the halted key waits,
// holding its slot; once its context ends it fails with an error that is
// both ErrPaused and ErrHalted and names the halt and the resume; once
// the key is resumed it goes on.
func TestHaltAfterOneAndFence(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	a, err := newBudget(t, cli, "node-1 pid 1", 2).Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Release(ctx)
	waits := make(chan budget.Wait, 10)
	b, err := newBudget(t, cli, "node-2 pid 1", 2).Acquire(ctx, key, func(w budget.Wait) { waits <- w })
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)

	h := record(t, ctx, a, failedAct("node-1", "42"))
	if h == nil || h.Key != key || h.Machine != "node-1" || h.Change != "42" || h.Failures != 1 || h.Reason != "not ready within 5m0s" || h.Since.IsZero() {
		t.Fatalf("halt %+v", h)
	}
	op := newBudget(t, cli, "operator", 2)
	st, err := op.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Halt == nil || st.Paused == nil || st.Paused.Halt == nil || st.Halt.Change != "42" || st.Paused.By != "node-1 pid 1" ||
		!strings.Contains(st.Paused.Reason, "halted: node-1's restart of k8s.kubelet (change 42): not ready") {
		t.Fatalf("status: halt %+v paused %+v", st.Halt, st.Paused)
	}
	if got := kinds(history(t, ctx, op, key, 0)); got != "act:failed:node-1 halted" {
		t.Fatalf("history %q", got)
	}
	keys, err := op.Keys(ctx)
	if err != nil || !containsString(keys, key) {
		t.Fatalf("Keys %q lacks the halted key: %v", keys, err)
	}

	// Fence waits, and fails when its context ends: ErrPaused and ErrHalted.
	short, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := fencer(t, b).Fence(short)
		done <- err
	}()
	w := waitFor(ctx, t, waits, "the fence told of the halt", func(w budget.Wait) bool {
		return len(w.Holders) == 1 && strings.Contains(w.Holders[0], "halted: node-1's restart")
	})
	if !strings.Contains(w.Holders[0], "resume with: snapsvc-rollout resume "+key) {
		t.Errorf("the wait does not say how to resume: %q", w.Holders[0])
	}
	cancel()
	err = <-done
	var he *etcdbudget.HaltedError
	if !errors.Is(err, budget.ErrPaused) || !errors.Is(err, budget.ErrHalted) || !errors.Is(err, context.Canceled) || !errors.As(err, &he) {
		t.Fatalf("fence on a halted key: %v; want ErrPaused, ErrHalted and the context's error", err)
	}
	for _, want := range []string{"node-1", "k8s.kubelet", "change 42", "not ready within 5m0s", "snapsvc-rollout resume " + key} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("fence error lacks %q: %v", want, err)
		}
	}

	// Resumed: the fence goes on.
	go func() {
		_, err := fencer(t, b).Fence(ctx)
		done <- err
	}()
	waitFor(ctx, t, waits, "the fence told of the halt again", func(w budget.Wait) bool {
		return len(w.Holders) == 1 && strings.Contains(w.Holders[0], "halted")
	})
	if was, err := op.ResumeWith(ctx, key, "fixed the config"); err != nil || !was {
		t.Fatalf("resume: %v %v", was, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("fence once resumed: %v", err)
	}
	recs := history(t, ctx, op, key, 0)
	if got := kinds(recs); got != "act:failed:node-1 halted resumed" {
		t.Fatalf("history %q", got)
	}
	if r := recs[2]; r.By != "operator" || r.Reason != "fixed the config" || r.Seq != 3 {
		t.Fatalf("resumed record %+v", r)
	}
	if st, err := op.Status(ctx, key); err != nil || st.Halt != nil || st.Paused != nil {
		t.Fatalf("status once resumed: %+v %v", st, err)
	}
}

func jsonMarshal(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// With HaltAfter 2, a ready act between two failures ends the run: no
// halt; two failures in a row halt. A resume starts the count again, and
// abandoned acts neither count nor end a run.
func TestHaltAfterTwo(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	b := newBudget(t, cli, "node-1 pid 1", 1, func(c *etcdbudget.Config) { c.HaltAfter = 2 })
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	abandoned := readyAct("node-1", "3")
	abandoned.Outcome = budget.OutcomeAbandoned
	for i, step := range []struct {
		act  budget.Act
		halt bool
	}{
		{failedAct("node-1", "1"), false},
		{readyAct("node-2", "2"), false},
		{failedAct("node-3", "3"), false},
		{abandoned, false},
		{failedAct("node-4", "4"), true},
	} {
		if h := record(t, ctx, s, step.act); (h != nil) != step.halt {
			t.Fatalf("step %d (%s by %s): halt %+v, want halted %v", i, step.act.Outcome, step.act.Machine, h, step.halt)
		}
	}
	h := record(t, ctx, s, failedAct("node-5", "5"))
	if h == nil || h.Machine != "node-4" || h.Failures != 2 {
		t.Fatalf("a failure on a halted key returns its halt: %+v", h)
	}
	if _, err := b.Resume(ctx, key); err != nil {
		t.Fatal(err)
	}
	if h := record(t, ctx, s, failedAct("node-6", "6")); h != nil {
		t.Fatalf("one failure after a resume halted (HaltAfter 2): %+v", h)
	}
	want := "act:failed:node-1 act:ready:node-2 act:failed:node-3 act:abandoned:node-1 act:failed:node-4 halted act:failed:node-5 resumed act:failed:node-6"
	if got := kinds(history(t, ctx, b, key, 0)); got != want {
		t.Fatalf("history\n%s\nwant\n%s", got, want)
	}
}

// A key paused by an operator is halted all the same when a failure
// reaches HaltAfter: its pause record keeps the operator's By and Reason
// and gains the Halt; a negative HaltAfter never halts.
func TestHaltOverPauseOrNegative(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	b := newBudget(t, cli, "node-1 pid 1", 1)
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	if _, err := b.Pause(ctx, key, "maintenance"); err != nil {
		t.Fatal(err)
	}
	if h := record(t, ctx, s, failedAct("node-1", "1")); h == nil || h.Change != "1" {
		t.Fatalf("not halted over an operator's pause: %+v", h)
	}
	st, err := b.Status(ctx, key)
	if err != nil || st.Halt == nil || st.Halt.Change != "1" || st.Paused == nil || st.Paused.Reason != "maintenance" || st.Paused.By != "node-1 pid 1" {
		t.Fatalf("status: %+v %v", st, err)
	}
	if got := kinds(history(t, ctx, b, key, 0)); got != "paused act:failed:node-1 halted" {
		t.Fatalf("history %q", got)
	}
	if _, err := b.Resume(ctx, key); err != nil {
		t.Fatal(err)
	}
	never := newBudget(t, cli, "node-2 pid 1", 1, func(c *etcdbudget.Config) { c.HaltAfter = -1 })
	key2 := uniqueKey(t) + "-never"
	s2, err := never.Acquire(ctx, key2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Release(ctx)
	for i := range 3 {
		if h := record(t, ctx, s2, failedAct("node-2", fmt.Sprint(i))); h != nil {
			t.Fatalf("HaltAfter -1 halted: %+v", h)
		}
	}
	if recs := history(t, ctx, never, key2, 0); len(recs) != 3 {
		t.Fatalf("history %q", kinds(recs))
	}
}

// Two failed Records of one key at once, HaltAfter 2: exactly one halt,
// and the history holds both acts exactly once.
func TestConcurrentRecordsHaltOnce(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	key := uniqueKey(t)
	var slots []budget.Slot
	for _, n := range []string{"node-1", "node-2"} {
		// A client each: two machines.
		b := newBudget(t, client(t, p.Endpoints()...), n+" pid 1", 2, func(c *etcdbudget.Config) { c.HaltAfter = 2 })
		s, err := b.Acquire(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release(ctx)
		slots = append(slots, s)
	}
	start := make(chan struct{})
	halts := make([]*budget.Halt, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, s := range slots {
		wg.Go(func() {
			<-start
			halts[i], errs[i] = s.(budget.Recorder).Record(ctx, failedAct(fmt.Sprintf("node-%d", i+1), fmt.Sprint(i+1)))
		})
	}
	close(start)
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	// The first written counts one failure, the second halts.
	if (halts[0] == nil) == (halts[1] == nil) {
		t.Fatalf("halts %+v %+v: want exactly one", halts[0], halts[1])
	}
	recs := history(t, ctx, newBudget(t, client(t, p.Endpoints()...), "operator", 2), key, 0)
	got := kinds(recs)
	if got != "act:failed:node-1 act:failed:node-2 halted" && got != "act:failed:node-2 act:failed:node-1 halted" {
		t.Fatalf("history %q: want both acts once, then one halt", got)
	}
	if recs[2].Halt.Machine != recs[1].Act.Machine || recs[2].Halt.Failures != 2 {
		t.Fatalf("the halt %+v is not the second failure's (%+v)", recs[2].Halt, recs[1].Act)
	}
}

// lossyClient is an etcd client whose first KV transaction or deletion
// sent while armed reaches etcd, takes effect, and has its answer replaced
// by "unavailable", as a connection lost at that moment would: the budget
// tries again. meanwhile (if set) runs in between.
func lossyClient(t *testing.T, endpoints []string, armed *atomic.Bool, meanwhile func()) *clientv3.Client {
	t.Helper()
	var once sync.Once
	lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err != nil || !armed.Load() || !(strings.HasSuffix(method, "KV/Txn") || strings.HasSuffix(method, "KV/DeleteRange")) {
			return err
		}
		lost := false
		once.Do(func() {
			lost = true
			if meanwhile != nil {
				meanwhile()
			}
		})
		if lost {
			return status.Error(codes.Unavailable, "test: the answer was lost")
		}
		return nil
	}
	cfg := etcdbudget.ClientConfig(endpoints)
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(lose))
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A Record whose answer was lost, tried again, appends its act once (and
// halts once).
func TestRecordRetriedAppendsOnce(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	key := uniqueKey(t)
	var armed atomic.Bool
	cli := lossyClient(t, p.Endpoints(), &armed, nil)
	b := newBudget(t, cli, "node-1 pid 1", 1)
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	armed.Store(true)
	h := record(t, ctx, s, failedAct("node-1", "7"))
	armed.Store(false)
	if h == nil || h.Change != "7" {
		t.Fatalf("halt %+v", h)
	}
	if got := kinds(history(t, ctx, b, key, 0)); got != "act:failed:node-1 halted" {
		t.Fatalf("history %q: want the act once", got)
	}
}

// A Resume whose answer was lost, tried again, does not lift a halt that
// a failure wrote meanwhile (after the first attempt lifted the first
// halt).
func TestLostResumeKeepsLaterHalt(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	b := newBudget(t, cli, "node-1 pid 1", 1)
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	if h := record(t, ctx, s, failedAct("node-1", "1")); h == nil {
		t.Fatal("no halt")
	}
	var armed atomic.Bool
	armed.Store(true)
	rehalted := false
	lossy := lossyClient(t, p.Endpoints(), &armed, func() {
		rehalted = record(t, ctx, s, failedAct("node-2", "2")) != nil
	})
	if was, err := newBudget(t, lossy, "operator", 1).Resume(ctx, key); err != nil || !was {
		t.Fatalf("resume: %v %v", was, err)
	}
	if !rehalted {
		t.Fatal("the failure meanwhile did not halt the key: the first resume did not take effect")
	}
	st, err := b.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Halt == nil || st.Halt.Change != "2" {
		t.Fatalf("the retried resume lifted the later halt: %+v", st.Halt)
	}
	if got := kinds(history(t, ctx, b, key, 0)); got != "act:failed:node-1 halted resumed act:failed:node-2 halted" {
		t.Fatalf("history %q", got)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := fencer(t, s).Fence(short); !errors.Is(err, budget.ErrHalted) {
		t.Fatalf("fence on the later halt: %v", err)
	}
	if _, err := b.Resume(ctx, key); err != nil {
		t.Fatal(err)
	}
}

// beforeTxnClient is an etcd client that runs f once, before its first KV
// transaction sent while armed is sent.
func beforeTxnClient(t *testing.T, endpoints []string, armed *atomic.Bool, f func()) *clientv3.Client {
	t.Helper()
	var once sync.Once
	before := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if armed.Load() && strings.HasSuffix(method, "KV/Txn") {
			once.Do(f)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cfg := etcdbudget.ClientConfig(endpoints)
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(before))
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// An operator pauses a key, a failure reaches HaltAfter (1), and the
// operator resumes: a resume that read the pause before the failure
// turned it into the halt lifts nothing (the key stays halted, the
// failure counted); a resume after the halt lifts it.
func TestPauseThenFailureHalts(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	b := newBudget(t, cli, "node-1 pid 1", 1)
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	if _, err := newBudget(t, cli, "operator", 1).Pause(ctx, key, "maintenance"); err != nil {
		t.Fatal(err)
	}
	// The resume reads the pause; the failure halts the key before the
	// resume's transaction is sent.
	var armed atomic.Bool
	armed.Store(true)
	var h *budget.Halt
	racing := beforeTxnClient(t, p.Endpoints(), &armed, func() { h = record(t, ctx, s, failedAct("node-1", "1")) })
	if _, err := newBudget(t, racing, "operator", 1).Resume(ctx, key); err != nil {
		t.Fatal(err)
	}
	if h == nil || h.Change != "1" || h.Failures != 1 {
		t.Fatalf("the failure over the pause did not halt the key: %+v", h)
	}
	st, err := b.Status(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Halt == nil || st.Halt.Change != "1" || st.Paused == nil || st.Paused.By != "operator" || st.Paused.Reason != "maintenance" {
		t.Fatalf("the resume that read the pause lifted the halt, or the pause lost its operator: %+v %+v", st.Paused, st.Halt)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := fencer(t, s).Fence(short); !errors.Is(err, budget.ErrHalted) {
		t.Fatalf("fence on the halt: %v", err)
	}
	if got := kinds(history(t, ctx, b, key, 0)); got != "paused act:failed:node-1 halted" {
		t.Fatalf("history %q", got)
	}
	// A resume that reads the halt lifts it.
	if was, err := newBudget(t, cli, "operator", 1).Resume(ctx, key); err != nil || !was {
		t.Fatalf("resume: %v %v", was, err)
	}
	if st, err := b.Status(ctx, key); err != nil || st.Paused != nil || st.Halt != nil {
		t.Fatalf("after the resume: %+v %v", st, err)
	}
	if got := kinds(history(t, ctx, b, key, 0)); got != "paused act:failed:node-1 halted resumed" {
		t.Fatalf("history %q", got)
	}
}

// An act ID already recorded for a key is recorded once and counted once,
// even when retention (HistoryLimit 1) removed its record: a Record whose
// answer was lost while another writer appended, and a second Record of
// the same ID after another act.
func TestRecordIDOnceDespiteRetention(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	key := uniqueKey(t)
	limit1 := func(c *etcdbudget.Config) { c.HistoryLimit, c.HaltAfter = 1, 3 }
	other := newBudget(t, client(t, p.Endpoints()...), "node-2 pid 1", 2, limit1)
	s2, err := other.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Release(ctx)
	var armed atomic.Bool
	lossy := lossyClient(t, p.Endpoints(), &armed, func() {
		record(t, ctx, s2, failedAct("node-2", "2")) // retention removes node-1's record
	})
	b := newBudget(t, lossy, "node-1 pid 1", 2, limit1)
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	a := failedAct("node-1", "1")
	a.ID = "act-1"
	armed.Store(true)
	if h := record(t, ctx, s, a); h != nil {
		t.Fatalf("halted at 2 failures of 3: %+v", h)
	}
	armed.Store(false)
	recs := history(t, ctx, other, key, 0)
	if len(recs) != 1 || recs[0].Act == nil || recs[0].Act.Change != "2" {
		t.Fatalf("history %q: want node-2's act alone (HistoryLimit 1)", kinds(recs))
	}
	// The same ID again, after another act: nothing appended, nothing
	// counted (a third failure would halt).
	if h := record(t, ctx, s, a); h != nil {
		t.Fatalf("the repeated act counted again and halted: %+v", h)
	}
	if recs := history(t, ctx, other, key, 0); len(recs) != 1 || recs[0].Act == nil || recs[0].Act.Change != "2" {
		t.Fatalf("history %q: the repeated act was appended", kinds(recs))
	}
	// A new act is the third failure: it halts, counting 3.
	if h := record(t, ctx, s, failedAct("node-1", "3")); h == nil || h.Failures != 3 || h.Change != "3" {
		t.Fatalf("third failure: halt %+v", h)
	}
}

// Retention keeps HistoryLimit records, the newest; History's limit
// returns the last ones, oldest first; HistoryAge removes old records.
func TestHistoryRetentionAndLimit(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	b := newBudget(t, cli, "node-1 pid 1", 1, func(c *etcdbudget.Config) { c.HistoryLimit, c.HaltAfter = 3, -1 })
	s, err := b.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	for i := 1; i <= 5; i++ {
		record(t, ctx, s, readyAct("node-1", fmt.Sprint(i)))
	}
	seqs := func(recs []budget.Record) string {
		var out []string
		for _, r := range recs {
			out = append(out, fmt.Sprintf("%d:%s", r.Seq, r.Act.Change))
		}
		return strings.Join(out, " ")
	}
	if got := seqs(history(t, ctx, b, key, 0)); got != "3:3 4:4 5:5" {
		t.Fatalf("kept %q, want the last 3", got)
	}
	if got := seqs(history(t, ctx, b, key, 2)); got != "4:4 5:5" {
		t.Fatalf("History limit 2: %q", got)
	}
	if got := seqs(history(t, ctx, b, key, 10)); got != "3:3 4:4 5:5" {
		t.Fatalf("History limit 10: %q", got)
	}
	if recs := history(t, ctx, b, uniqueKey(t)+"-none", 0); len(recs) != 0 {
		t.Fatalf("history of a key never used: %+v", recs)
	}

	// An age bound: each append removes the records older than it.
	aged := newBudget(t, cli, "node-1 pid 1", 1, func(c *etcdbudget.Config) { c.HistoryAge, c.HaltAfter = time.Nanosecond, -1 })
	key2 := uniqueKey(t) + "-aged"
	s2, err := aged.Acquire(ctx, key2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Release(ctx)
	for i := 1; i <= 3; i++ {
		record(t, ctx, s2, readyAct("node-1", fmt.Sprint(i)))
	}
	if got := seqs(history(t, ctx, aged, key2, 0)); got != "3:3" {
		t.Fatalf("with an age bound of 1ns, kept %q, want the last only", got)
	}
}

// A Controlled budget counts and reports recorded acts and halts.
func TestControlledRecordEvents(t *testing.T) {
	p := cluster(t)
	checkLeaks(t)
	ctx := ctxT(t, time.Minute)
	cli := client(t, p.Endpoints()...)
	key := uniqueKey(t)
	var mu sync.Mutex
	var events []etcdbudget.Event
	c, err := etcdbudget.NewControlled(etcdbudget.Config{Client: cli, Holder: "node-1 pid 1", TTL: 3 * time.Second, Unreachable: 2 * time.Second},
		etcdbudget.Controls{OnEvent: func(ev etcdbudget.Event) {
			mu.Lock()
			events = append(events, ev)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Acquire(ctx, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release(ctx)
	record(t, ctx, s, readyAct("node-1", "1"))
	if h := record(t, ctx, s, failedAct("node-1", "2")); h == nil {
		t.Fatal("no halt")
	}
	if m := c.Metrics(); m.Records != 2 || m.Halts != 1 || m.RecordFailures != 0 {
		t.Fatalf("metrics %+v", m)
	}
	mu.Lock()
	var got []string
	for _, ev := range events {
		got = append(got, ev.Kind)
		if ev.Kind == "halted" && (ev.Halt == nil || ev.Halt.Change != "2" || ev.Act == nil) {
			t.Errorf("halted event %+v", ev)
		}
	}
	mu.Unlock()
	if s := strings.Join(got, " "); s != "acquired recorded recorded halted" {
		t.Fatalf("events %q", s)
	}
	if _, err := c.Budget().Resume(ctx, key); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkHistory10000 reads the whole history of a key that holds
// 10,000 records (HistoryLimit 10000), written as Record writes them.
func BenchmarkHistory10000(b *testing.B) {
	p := cluster(b)
	ctx := ctxT(b, 5*time.Minute)
	cli := client(b, p.Endpoints()...)
	key := fmt.Sprintf("bench-history-%d", time.Now().UnixNano())
	bud := newBudget(b, cli, "bench", 1, func(c *etcdbudget.Config) { c.HistoryLimit = 10000 })
	const n = 10000
	now := time.Now().UTC()
	act := failedAct("node-1", "1234")
	act.Key, act.Waited, act.Held = key, 3*time.Second, 40*time.Second
	act.Spawn, act.Ready = now.Add(-time.Minute), now.Add(-50*time.Second)
	for i := 0; i < n; i += 100 {
		var ops []clientv3.Op
		for seq := i + 1; seq <= i+100; seq++ {
			act.Change = fmt.Sprint(seq)
			val, _ := jsonMarshal(budget.Record{Seq: int64(seq), Time: now, Kind: budget.RecordAct, Act: &act})
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%s#history/%020d", etcdbudget.DefaultPrefix, key, seq), val))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, etcdbudget.DefaultPrefix+key+"#history-head", fmt.Sprintf(`{"seq":%d,"failures":0}`, n)); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		recs, err := bud.History(ctx, key, 0)
		if err != nil {
			b.Fatal(err)
		}
		if len(recs) != n || recs[0].Seq != 1 || recs[n-1].Seq != n {
			b.Fatalf("%d records", len(recs))
		}
	}
}

func TestHaltSummaryNamesTheAct(t *testing.T) {
	h := budget.Halt{Key: "k8s", Machine: "node-1", Services: []string{"k8s"}, Change: "7", Reason: "not ready"}
	if got := etcdbudget.HaltSummary(h); got != "node-1's restart of k8s (change 7): not ready" {
		t.Errorf("a halt of no recorded action: %q", got)
	}
	h.Action = "refresh"
	if got := etcdbudget.HaltSummary(h); got != "node-1's refresh of k8s (change 7): not ready" {
		t.Errorf("a refresh's halt: %q", got)
	}
}
