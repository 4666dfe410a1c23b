// Package snapsvcprom exports snapsvc's operations and restart budgets as
// Prometheus metrics. It is a separate module so that only programs that
// import it depend on the Prometheus client; the snapsvc module does not.
//
// A controller makes one Metrics, registers it with its registry (for
// controller-runtime, metrics.Registry) and passes its Observe to every
// snapsvc client it builds, and its ObserveBudget to the client's restart
// budget:
//
//	m := snapsvcprom.New(snapsvcprom.WithConstLabels(prometheus.Labels{"client": "k8sd"}))
//	registry.MustRegister(m)
//	c, err := snapsvc.New(snapsvc.WithObserver(m.Observe),
//		snapsvc.WithRestartBudget(budget, snapsvc.BudgetOptions{Progress: m.ObserveBudget}))
//
// The metrics, all prefixed snapsvc_ (or the namespace given to New):
//
//	operations_total{action,outcome}            operations ended, by outcome
//	operation_duration_seconds{action,outcome}  their duration: conflicts waited out and the change included
//	operations_in_flight{action}                operations started and not ended
//	conflicts_total{action}                     snapd change conflicts met (each waited out or retried)
//	answers_lost_total{action}                  requests to act whose answer was lost (the change was looked for)
//	snapd_unreachable_total{action}             runs of snapd being unreachable (each outage once per operation or read)
//
// and, for restart budgets (snapsvc.BudgetOptions.Progress), by budget key:
//
//	budget_waiting{key}                  1 while an operation waits for a slot of key, else 0
//	budget_waiters_ahead{key}            while it waits: how many are served before it
//	budget_slots_held{key}               slots of key held now (taken, not yet given back or lost)
//	budget_acquired_total{key}           slots taken
//	budget_wait_seconds{key}             how long each slot taken was waited for
//	budget_hold_seconds{key}             how long each slot given back was held
//	budget_slots_lost_total{key}         slots lost while held (their session expired)
//	budget_release_failures_total{key}   failed attempts to give a slot back
//	budget_fence_failures_total{key}     fences that could not confirm a slot (the request was not sent)
//	budget_acts_total{key,outcome}       budgeted acts recorded in the budget's history, by outcome
//	                                     ("ready", "failed", "abandoned")
//	budget_halts_total{key}              failed acts that halted their key (no machine restarts it
//	                                     until an operator resumes it): alert on any increase
//	budget_admission_refusals_total{key} refusals of the admission check (BudgetOptions.Admit)
//
// outcome is "done", or why the operation failed: "change-failed" (the
// change ended in error), "not-found", "invalid" (bad names), "gave-up"
// (conflicts or an unreachable snapd outlasted the policy),
// "outcome-unknown" (snapd may have acted), "canceled" (the context
// ended) or "error".
//
// To tell clients apart, WithConstLabels puts the same labels on every
// metric (one Metrics per client, each registered, or each with its own
// registry); WithSnapLabel adds a snap label to the operation metrics (the
// snaps an operation acts on, joined with commas).
package snapsvcprom

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// Metrics is a prometheus.Collector fed by snapsvc's observer events and
// restart-budget events. Its methods are safe for concurrent use.
type Metrics struct {
	snapLabel bool

	ops         *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	inFlight    *prometheus.GaugeVec
	conflicts   *prometheus.CounterVec
	lost        *prometheus.CounterVec
	unreachable *prometheus.CounterVec

	budgetWaiting  *prometheus.GaugeVec
	budgetAhead    *prometheus.GaugeVec
	budgetHeld     *prometheus.GaugeVec
	budgetAcquired *prometheus.CounterVec
	budgetWait     *prometheus.HistogramVec
	budgetHold     *prometheus.HistogramVec
	budgetLost     *prometheus.CounterVec
	releaseFailed  *prometheus.CounterVec
	fenceFailed    *prometheus.CounterVec
	acts           *prometheus.CounterVec
	halts          *prometheus.CounterVec
	admitRefused   *prometheus.CounterVec

	mu      sync.Mutex
	waiting map[string]bool            // keys an operation waits for
	held    map[string]map[string]bool // key -> holders holding a slot of it
}

// Option configures New.
type Option func(*options)

type options struct {
	namespace     string
	buckets       []float64
	budgetBuckets []float64
	constLabels   prometheus.Labels
	snapLabel     bool
}

// WithNamespace sets the metrics' prefix (default "snapsvc").
func WithNamespace(ns string) Option { return func(o *options) { o.namespace = ns } }

// WithBuckets sets the duration histogram's buckets, in seconds (default
// DefaultBuckets).
func WithBuckets(b []float64) Option { return func(o *options) { o.buckets = b } }

// WithBudgetBuckets sets the buckets of the budget's wait and hold
// histograms, in seconds (default DefaultBudgetBuckets).
func WithBudgetBuckets(b []float64) Option { return func(o *options) { o.budgetBuckets = b } }

// WithConstLabels puts labels on every metric, to tell apart the clients
// (or programs) that export them, e.g. {"client": "k8sd"}. Two Metrics
// registered with the same registry need different values.
func WithConstLabels(l prometheus.Labels) Option {
	return func(o *options) { o.constLabels = l }
}

// WithSnapLabel adds a snap label to the operation metrics (all but the
// budget's): the snaps the operation acts on, sorted and joined with
// commas ("" for reads that name none). Off by default, so that the
// series of an existing dashboard keep their labels.
func WithSnapLabel() Option { return func(o *options) { o.snapLabel = true } }

// DefaultBuckets span a service command that takes tens of milliseconds
// to one that waited minutes for a refresh or a configure hook (the
// library's default budget is 5 minutes).
var DefaultBuckets = []float64{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// DefaultBudgetBuckets span a free slot taken at once to a rollout that
// waits behind a whole cluster's restarts, each with its readiness check
// and settle time (up to an hour).
var DefaultBudgetBuckets = []float64{0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// New makes the metrics; register them with a prometheus.Registerer.
func New(opts ...Option) *Metrics {
	o := options{namespace: "snapsvc", buckets: DefaultBuckets, budgetBuckets: DefaultBudgetBuckets}
	for _, f := range opts {
		f(&o)
	}
	op := func(labels ...string) []string {
		if o.snapLabel {
			labels = append(labels, "snap")
		}
		return labels
	}
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.namespace, Name: name, Help: help, ConstLabels: o.constLabels}, labels)
	}
	gauge := func(name, help string, labels []string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: o.namespace, Name: name, Help: help, ConstLabels: o.constLabels}, labels)
	}
	histogram := func(name, help string, buckets []float64, labels []string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: o.namespace, Name: name, Help: help, ConstLabels: o.constLabels, Buckets: buckets}, labels)
	}
	key := []string{"key"}
	return &Metrics{
		snapLabel:   o.snapLabel,
		ops:         counter("operations_total", "Service operations (start, stop, restart) ended, by action and outcome.", op("action", "outcome")),
		duration:    histogram("operation_duration_seconds", "Duration of service operations, conflicts waited out and the change included.", o.buckets, op("action", "outcome")),
		inFlight:    gauge("operations_in_flight", "Service operations started and not ended.", op("action")),
		conflicts:   counter("conflicts_total", "snapd change conflicts met by operations (each waited out or retried).", op("action")),
		lost:        counter("answers_lost_total", "Requests to act whose answer from snapd was lost or garbled.", op("action")),
		unreachable: counter("snapd_unreachable_total", "Runs of snapd being unreachable met by operations and reads.", op("action")),

		budgetWaiting:  gauge("budget_waiting", "1 while an operation waits for a restart budget slot of the key, else 0.", key),
		budgetAhead:    gauge("budget_waiters_ahead", "While an operation waits for a slot of the key: how many waiters are served before it.", key),
		budgetHeld:     gauge("budget_slots_held", "Restart budget slots of the key held now: taken and not yet given back or lost.", key),
		budgetAcquired: counter("budget_acquired_total", "Restart budget slots taken.", key),
		budgetWait:     histogram("budget_wait_seconds", "How long each restart budget slot taken was waited for.", o.budgetBuckets, key),
		budgetHold:     histogram("budget_hold_seconds", "How long each restart budget slot given back was held.", o.budgetBuckets, key),
		budgetLost:     counter("budget_slots_lost_total", "Restart budget slots lost while held (their session expired): another machine may have held them at the same time.", key),
		releaseFailed:  counter("budget_release_failures_total", "Failed attempts to give a restart budget slot back (tried again up to 5 times, then left to expire).", key),
		fenceFailed:    counter("budget_fence_failures_total", "Fences that could not confirm a restart budget slot right before a request; the request was not sent.", key),
		acts:           counter("budget_acts_total", "Budgeted acts recorded in the budget's history, by outcome (ready, failed, abandoned).", []string{"key", "outcome"}),
		halts:          counter("budget_halts_total", "Failed acts that halted their budget key: no machine restarts it until an operator resumes it.", key),
		admitRefused:   counter("budget_admission_refusals_total", "Refusals of the admission check (BudgetOptions.Admit); the slot stays held and the check is asked again.", key),

		waiting: map[string]bool{},
		held:    map[string]map[string]bool{},
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.ops, m.duration, m.inFlight, m.conflicts, m.lost, m.unreachable,
		m.budgetWaiting, m.budgetAhead, m.budgetHeld, m.budgetAcquired, m.budgetWait, m.budgetHold, m.budgetLost, m.releaseFailed, m.fenceFailed,
		m.acts, m.halts, m.admitRefused}
}

// Observe counts one event; pass it to snapsvc.WithObserver (Chain joins
// it with another observer). It returns at once.
func (m *Metrics) Observe(ev snapsvc.Event) {
	labels := func(values ...string) []string {
		if m.snapLabel {
			values = append(values, snapsOf(ev.Names))
		}
		return values
	}
	switch ev.Kind {
	case snapsvc.EventStarted:
		m.inFlight.WithLabelValues(labels(ev.Op)...).Inc()
	case snapsvc.EventDone, snapsvc.EventFailed:
		outcome := Outcome(ev)
		m.inFlight.WithLabelValues(labels(ev.Op)...).Dec()
		m.ops.WithLabelValues(labels(ev.Op, outcome)...).Inc()
		m.duration.WithLabelValues(labels(ev.Op, outcome)...).Observe(ev.Elapsed.Seconds())
		// An operation that failed without its slot ended its wait; the
		// budget says nothing more of it.
		var be *snapsvc.BudgetError
		if errors.As(ev.Err, &be) {
			m.endWait(be.Key)
		}
	case snapsvc.EventConflict:
		m.conflicts.WithLabelValues(labels(ev.Op)...).Inc()
	case snapsvc.EventAnswerLost:
		m.lost.WithLabelValues(labels(ev.Op)...).Inc()
	case snapsvc.EventUnreachable:
		m.unreachable.WithLabelValues(labels(ev.Op)...).Inc()
	}
}

// ObserveBudget counts one restart-budget event; pass it as
// snapsvc.BudgetOptions.Progress (ChainBudget joins it with another). It
// returns at once. Pass Observe to the same client's WithObserver too: a
// wait that ends without a slot is told only by the operation's failure.
//
// A client waits for at most one slot of a key at a time (its operations
// share it), so budget_waiting is 0 or 1 per key for one client. A slot is
// one key and holder: taken ("acquired"), it counts as held until it is
// given back ("released"), lost ("lost") or its fifth release attempt
// failed (it is then freed only when the budget expires it).
func (m *Metrics) ObserveBudget(ev snapsvc.BudgetEvent) {
	switch ev.Kind {
	case snapsvc.BudgetWaiting:
		m.mu.Lock()
		m.waiting[ev.Key] = true
		m.budgetWaiting.WithLabelValues(ev.Key).Set(1)
		m.budgetAhead.WithLabelValues(ev.Key).Set(float64(ev.Wait.Ahead))
		m.mu.Unlock()
	case snapsvc.BudgetAcquired:
		m.endWait(ev.Key)
		m.budgetAcquired.WithLabelValues(ev.Key).Inc()
		m.budgetWait.WithLabelValues(ev.Key).Observe(ev.Waited.Seconds())
		m.setHeld(ev.Key, ev.Holder, true)
	case snapsvc.BudgetReleased:
		if m.setHeld(ev.Key, ev.Holder, false) {
			m.budgetHold.WithLabelValues(ev.Key).Observe(ev.Held.Seconds())
		}
	case snapsvc.BudgetLost:
		m.budgetLost.WithLabelValues(ev.Key).Inc()
		m.setHeld(ev.Key, ev.Holder, false)
	case snapsvc.BudgetReleaseFailed:
		m.releaseFailed.WithLabelValues(ev.Key).Inc()
		if ev.Final {
			m.setHeld(ev.Key, ev.Holder, false)
		}
	case snapsvc.BudgetFenceFailed:
		m.fenceFailed.WithLabelValues(ev.Key).Inc()
	case snapsvc.BudgetRecorded:
		if ev.Act != nil {
			m.acts.WithLabelValues(ev.Key, string(ev.Act.Outcome)).Inc()
		}
	case snapsvc.BudgetHalted:
		m.halts.WithLabelValues(ev.Key).Inc()
	case snapsvc.BudgetAdmissionRefused:
		m.admitRefused.WithLabelValues(ev.Key).Inc()
	}
}

// endWait says no operation waits for key any more.
func (m *Metrics) endWait(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.waiting[key] {
		delete(m.waiting, key)
		m.budgetWaiting.WithLabelValues(key).Set(0)
		m.budgetAhead.WithLabelValues(key).Set(0)
	}
}

// setHeld records that holder holds a slot of key, or not, and reports
// whether that changed anything.
func (m *Metrics) setHeld(key, holder string, held bool) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	holders := m.held[key]
	if holders[holder] == held {
		return false
	}
	if held {
		if holders == nil {
			holders = map[string]bool{}
			m.held[key] = holders
		}
		holders[holder] = true
	} else {
		delete(holders, holder)
	}
	m.budgetHeld.WithLabelValues(key).Set(float64(len(holders)))
	return true
}

// snapsOf is the snap label of an operation on names: its snaps, sorted,
// without duplicates, joined with commas.
func snapsOf(names []string) string {
	seen := map[string]bool{}
	var snaps []string
	for _, n := range names {
		snap, _, _ := strings.Cut(n, ".")
		if !seen[snap] {
			seen[snap] = true
			snaps = append(snaps, snap)
		}
	}
	sort.Strings(snaps)
	return strings.Join(snaps, ",")
}

// Outcome is the outcome label of an EventDone or EventFailed.
func Outcome(ev snapsvc.Event) string {
	err := ev.Err
	var ce *snapsvc.ChangeError
	switch {
	case ev.Kind == snapsvc.EventDone && err == nil:
		return "done"
	case errors.Is(err, snapsvc.ErrOutcomeUnknown):
		return "outcome-unknown"
	case errors.As(err, &ce):
		return "change-failed"
	case errors.Is(err, snapsvc.ErrNotFound):
		return "not-found"
	case errors.Is(err, snapsvc.ErrInvalidName), errors.Is(err, snapsvc.ErrNoNames), errors.Is(err, snapsvc.ErrWrongSnap):
		return "invalid"
	case errors.Is(err, snapsvc.ErrGaveUp):
		return "gave-up"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "error"
}

// Chain returns an observer that calls each of fs in turn (nil ones are
// skipped), for a client that both logs and counts its events.
func Chain(fs ...func(snapsvc.Event)) func(snapsvc.Event) {
	return func(ev snapsvc.Event) {
		for _, f := range fs {
			if f != nil {
				f(ev)
			}
		}
	}
}

// ChainBudget is Chain for snapsvc.BudgetOptions.Progress.
func ChainBudget(fs ...func(snapsvc.BudgetEvent)) func(snapsvc.BudgetEvent) {
	return func(ev snapsvc.BudgetEvent) {
		for _, f := range fs {
			if f != nil {
				f(ev)
			}
		}
	}
}
