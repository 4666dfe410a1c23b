// Package snapsvcprom exports snapsvc's operations as Prometheus metrics.
// It is a separate module so that only programs that import it depend on
// the Prometheus client; the snapsvc module does not.
//
// A controller makes one Metrics, registers it with its registry (for
// controller-runtime, metrics.Registry) and passes its Observe to every
// snapsvc client it builds:
//
//	m := snapsvcprom.New()
//	registry.MustRegister(m)
//	c, err := snapsvc.New(snapsvc.WithObserver(m.Observe))
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
// outcome is "done", or why the operation failed: "change-failed" (the
// change ended in error), "not-found", "invalid" (bad names), "gave-up"
// (conflicts or an unreachable snapd outlasted the policy),
// "outcome-unknown" (snapd may have acted), "canceled" (the context
// ended) or "error".
package snapsvcprom

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// Metrics is a prometheus.Collector fed by snapsvc's observer events. Its
// methods are safe for concurrent use.
type Metrics struct {
	ops         *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	inFlight    *prometheus.GaugeVec
	conflicts   *prometheus.CounterVec
	lost        *prometheus.CounterVec
	unreachable *prometheus.CounterVec
}

// Option configures New.
type Option func(*options)

type options struct {
	namespace string
	buckets   []float64
}

// WithNamespace sets the metrics' prefix (default "snapsvc").
func WithNamespace(ns string) Option { return func(o *options) { o.namespace = ns } }

// WithBuckets sets the duration histogram's buckets, in seconds (default
// DefaultBuckets).
func WithBuckets(b []float64) Option { return func(o *options) { o.buckets = b } }

// DefaultBuckets span a service command that takes tens of milliseconds
// to one that waited minutes for a refresh or a configure hook (the
// library's default budget is 5 minutes).
var DefaultBuckets = []float64{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// New makes the metrics; register them with a prometheus.Registerer.
func New(opts ...Option) *Metrics {
	o := options{namespace: "snapsvc", buckets: DefaultBuckets}
	for _, f := range opts {
		f(&o)
	}
	return &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.namespace, Name: "operations_total",
			Help: "Service operations (start, stop, restart) ended, by action and outcome."}, []string{"action", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: o.namespace, Name: "operation_duration_seconds",
			Help: "Duration of service operations, conflicts waited out and the change included.", Buckets: o.buckets}, []string{"action", "outcome"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: o.namespace, Name: "operations_in_flight",
			Help: "Service operations started and not ended."}, []string{"action"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.namespace, Name: "conflicts_total",
			Help: "snapd change conflicts met by operations (each waited out or retried)."}, []string{"action"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.namespace, Name: "answers_lost_total",
			Help: "Requests to act whose answer from snapd was lost or garbled."}, []string{"action"}),
		unreachable: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.namespace, Name: "snapd_unreachable_total",
			Help: "Runs of snapd being unreachable met by operations and reads."}, []string{"action"}),
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
	return []prometheus.Collector{m.ops, m.duration, m.inFlight, m.conflicts, m.lost, m.unreachable}
}

// Observe counts one event; pass it to snapsvc.WithObserver (Chain joins
// it with another observer). It returns at once.
func (m *Metrics) Observe(ev snapsvc.Event) {
	switch ev.Kind {
	case snapsvc.EventStarted:
		m.inFlight.WithLabelValues(ev.Op).Inc()
	case snapsvc.EventDone, snapsvc.EventFailed:
		outcome := Outcome(ev)
		m.inFlight.WithLabelValues(ev.Op).Dec()
		m.ops.WithLabelValues(ev.Op, outcome).Inc()
		m.duration.WithLabelValues(ev.Op, outcome).Observe(ev.Elapsed.Seconds())
	case snapsvc.EventConflict:
		m.conflicts.WithLabelValues(ev.Op).Inc()
	case snapsvc.EventAnswerLost:
		m.lost.WithLabelValues(ev.Op).Inc()
	case snapsvc.EventUnreachable:
		m.unreachable.WithLabelValues(ev.Op).Inc()
	}
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
