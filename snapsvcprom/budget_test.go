package snapsvcprom_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/snapsvcprom"
)

// exercise gives every metric of m a series: an operation of each outcome
// kind and each budget event kind.
func exercise(m *snapsvcprom.Metrics) {
	names := []string{"k8s.kubelet"}
	for _, ev := range []snapsvc.Event{
		{Kind: snapsvc.EventStarted, Op: "restart", Names: names},
		{Kind: snapsvc.EventConflict, Op: "restart", Names: names},
		{Kind: snapsvc.EventAnswerLost, Op: "restart", Names: names},
		{Kind: snapsvc.EventUnreachable, Op: "restart", Names: names},
		{Kind: snapsvc.EventDone, Op: "restart", Names: names, Elapsed: time.Second},
	} {
		m.Observe(ev)
	}
	for _, ev := range []snapsvc.BudgetEvent{
		{Kind: snapsvc.BudgetWaiting, Key: "k", Wait: snapsvc.BudgetWait{Key: "k", Ahead: 2}},
		{Kind: snapsvc.BudgetAcquired, Key: "k", Holder: "h", Waited: time.Second},
		{Kind: snapsvc.BudgetFenceFailed, Key: "k", Holder: "h", Err: errors.New("x")},
		{Kind: snapsvc.BudgetReleaseFailed, Key: "k", Holder: "h", Attempt: 1, Err: errors.New("x")},
		{Kind: snapsvc.BudgetReleased, Key: "k", Holder: "h", Held: time.Second, Attempt: 2},
		{Kind: snapsvc.BudgetLost, Key: "k", Holder: "h2", Err: snapsvc.ErrSlotLost},
	} {
		m.ObserveBudget(ev)
	}
}

// TestLint checks every metric, with every option, against promlint
// (client_golang's testutil): names, units, suffixes, help.
func TestLint(t *testing.T) {
	for name, opts := range map[string][]snapsvcprom.Option{
		"default":                  nil,
		"const labels, snap label": {snapsvcprom.WithConstLabels(prometheus.Labels{"client": "k8sd"}), snapsvcprom.WithSnapLabel()},
	} {
		m := snapsvcprom.New(opts...)
		exercise(m)
		problems, err := testutil.CollectAndLint(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s: %s", name, p.Metric, p.Text)
		}
		if n := testutil.CollectAndCount(m); n != 15 {
			t.Errorf("%s: %d series, want one of each of the 15 metrics", name, n)
		}
	}
}

// TestCompatible checks that, without options, the operation metrics keep
// the names and labels of v0.1 (dashboards keep working).
func TestCompatible(t *testing.T) {
	m := snapsvcprom.New()
	exercise(m)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP snapsvc_answers_lost_total Requests to act whose answer from snapd was lost or garbled.
# TYPE snapsvc_answers_lost_total counter
snapsvc_answers_lost_total{action="restart"} 1
# HELP snapsvc_conflicts_total snapd change conflicts met by operations (each waited out or retried).
# TYPE snapsvc_conflicts_total counter
snapsvc_conflicts_total{action="restart"} 1
# HELP snapsvc_operations_in_flight Service operations started and not ended.
# TYPE snapsvc_operations_in_flight gauge
snapsvc_operations_in_flight{action="restart"} 0
# HELP snapsvc_operations_total Service operations (start, stop, restart) ended, by action and outcome.
# TYPE snapsvc_operations_total counter
snapsvc_operations_total{action="restart",outcome="done"} 1
# HELP snapsvc_snapd_unreachable_total Runs of snapd being unreachable met by operations and reads.
# TYPE snapsvc_snapd_unreachable_total counter
snapsvc_snapd_unreachable_total{action="restart"} 1
`), "snapsvc_answers_lost_total", "snapsvc_conflicts_total", "snapsvc_operations_in_flight", "snapsvc_operations_total", "snapsvc_snapd_unreachable_total")
	if err != nil {
		t.Error(err)
	}
}

// TestSnapLabel checks the snap label: the snaps of the operation's names,
// sorted, once each.
func TestSnapLabel(t *testing.T) {
	m := snapsvcprom.New(snapsvcprom.WithSnapLabel())
	m.Observe(snapsvc.Event{Kind: snapsvc.EventConflict, Op: "restart", Names: []string{"k8s.kubelet", "etcd", "k8s.containerd"}})
	m.Observe(snapsvc.Event{Kind: snapsvc.EventUnreachable, Op: "read"})
	err := testutil.CollectAndCompare(m, strings.NewReader(`
# HELP snapsvc_conflicts_total snapd change conflicts met by operations (each waited out or retried).
# TYPE snapsvc_conflicts_total counter
snapsvc_conflicts_total{action="restart",snap="etcd,k8s"} 1
# HELP snapsvc_snapd_unreachable_total Runs of snapd being unreachable met by operations and reads.
# TYPE snapsvc_snapd_unreachable_total counter
snapsvc_snapd_unreachable_total{action="read",snap=""} 1
`), "snapsvc_conflicts_total", "snapsvc_snapd_unreachable_total")
	if err != nil {
		t.Error(err)
	}
}

// TestBudgetEvents drives the budget metrics event by event: a wait and
// its end (by a slot, or by the operation failing without one), a slot
// held until given back or lost (once, whatever follows), a slot whose
// every release attempt failed, fence failures.
func TestBudgetEvents(t *testing.T) {
	m := snapsvcprom.New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	// value is the metric's value for key (a histogram's count), -1 when
	// it has no such series.
	value := func(metric, key string) float64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() != "snapsvc_"+metric {
				continue
			}
			for _, mt := range f.Metric {
				for _, l := range mt.Label {
					if l.GetName() != "key" || l.GetValue() != key {
						continue
					}
					switch {
					case mt.Gauge != nil:
						return mt.Gauge.GetValue()
					case mt.Counter != nil:
						return mt.Counter.GetValue()
					case mt.Histogram != nil:
						return float64(mt.Histogram.GetSampleCount())
					}
				}
			}
		}
		return -1
	}
	expect := func(step string, want map[string]float64, key string) {
		t.Helper()
		for metric, w := range want {
			if got := value(metric, key); got != w {
				t.Errorf("%s: %s{key=%q} = %v, want %v", step, metric, key, got, w)
			}
		}
	}

	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetWaiting, Key: "a", Wait: snapsvc.BudgetWait{Ahead: 3}})
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetWaiting, Key: "a", Wait: snapsvc.BudgetWait{Ahead: 1}})
	expect("waiting", map[string]float64{"budget_waiting": 1, "budget_waiters_ahead": 1, "budget_slots_held": -1}, "a")
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetAcquired, Key: "a", Holder: "n1", Waited: 2 * time.Second})
	expect("acquired", map[string]float64{"budget_waiting": 0, "budget_waiters_ahead": 0, "budget_slots_held": 1, "budget_acquired_total": 1, "budget_wait_seconds": 1}, "a")
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetFenceFailed, Key: "a", Holder: "n1"})
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetLost, Key: "a", Holder: "n1", Err: snapsvc.ErrSlotLost})
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetReleased, Key: "a", Holder: "n1", Held: time.Second})
	expect("lost, then released", map[string]float64{"budget_slots_held": 0, "budget_slots_lost_total": 1, "budget_fence_failures_total": 1, "budget_hold_seconds": -1}, "a")

	// A wait that ends without a slot: the operation's failure ends it.
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetWaiting, Key: "b"})
	m.Observe(snapsvc.Event{Kind: snapsvc.EventStarted, Op: "restart"})
	m.Observe(snapsvc.Event{Kind: snapsvc.EventFailed, Op: "restart", Err: &snapsvc.OpError{Op: "restart", Err: &snapsvc.BudgetError{Key: "b", Err: snapsvc.ErrBudgetWait}}})
	expect("wait failed", map[string]float64{"budget_waiting": 0, "budget_acquired_total": -1}, "b")

	// Held until given back; after the final failed attempt (the fifth,
	// or one Close kept from being made) no longer held (the budget
	// expires it).
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetAcquired, Key: "c", Holder: "n1"})
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetAcquired, Key: "c", Holder: "n2"})
	expect("two holders", map[string]float64{"budget_slots_held": 2}, "c")
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetReleased, Key: "c", Holder: "n2", Held: time.Second})
	for attempt := 1; attempt <= 5; attempt++ {
		m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetReleaseFailed, Key: "c", Holder: "n1", Attempt: attempt, Final: attempt == 5})
		want := 1.0
		if attempt == 5 {
			want = 0
		}
		expect("release failed", map[string]float64{"budget_slots_held": want, "budget_release_failures_total": float64(attempt), "budget_hold_seconds": 1}, "c")
	}
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetAcquired, Key: "d", Holder: "n1"})
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetReleaseFailed, Key: "d", Holder: "n1", Attempt: 1})
	expect("release failed, retried", map[string]float64{"budget_slots_held": 1}, "d")
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetReleaseFailed, Key: "d", Holder: "n1", Attempt: 2, Final: true})
	expect("retries ended by Close", map[string]float64{"budget_slots_held": 0, "budget_release_failures_total": 2}, "d")

	// A bad restart: refused twice by the admission check, then acted,
	// failed and halted its key.
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetAdmissionRefused, Key: "e", Holder: "n1"})
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetAdmissionRefused, Key: "e", Holder: "n1"})
	failed := &snapsvc.BudgetAct{Key: "e", Outcome: budget.OutcomeFailed}
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetRecorded, Key: "e", Holder: "n1", Act: failed})
	m.ObserveBudget(snapsvc.BudgetEvent{Kind: snapsvc.BudgetHalted, Key: "e", Holder: "n1", Act: failed, Halt: &snapsvc.BudgetHalt{Key: "e"}})
	expect("halted", map[string]float64{"budget_admission_refusals_total": 2, "budget_acts_total": 1, "budget_halts_total": 1}, "e")
}
