package rollouttest_test

import (
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/testsupport/rollouttest"
)

func TestMaxConcurrentAndMakespan(t *testing.T) {
	t0 := time.Unix(1000, 0)
	iv := func(from, to int) rollouttest.Interval {
		return rollouttest.Interval{From: t0.Add(time.Duration(from) * time.Second), To: t0.Add(time.Duration(to) * time.Second)}
	}
	for _, c := range []struct {
		ivs  []rollouttest.Interval
		peak int
		span time.Duration
	}{
		{nil, 0, 0},
		{[]rollouttest.Interval{iv(0, 10), iv(10, 20)}, 1, 20 * time.Second}, // one ends as the next starts
		{[]rollouttest.Interval{iv(0, 10), iv(5, 20), iv(6, 7)}, 3, 20 * time.Second},
		{[]rollouttest.Interval{iv(5, 8), iv(0, 3)}, 1, 8 * time.Second},
	} {
		if got := rollouttest.MaxConcurrent(c.ivs); got != c.peak {
			t.Errorf("MaxConcurrent(%v) = %d, want %d", c.ivs, got, c.peak)
		}
		if got := rollouttest.Makespan(c.ivs); got != c.span {
			t.Errorf("Makespan(%v) = %v, want %v", c.ivs, got, c.span)
		}
	}
}
