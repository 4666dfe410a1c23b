package benchkit

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of ds by the
// nearest-rank method, and false when ds is empty. ds is not modified.
func Percentile(ds []time.Duration, p float64) (time.Duration, bool) {
	if len(ds) == 0 {
		return 0, false
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1], true
}

// FormatDuration prints d with three significant digits in ms or s
// ("4.31ms", "287ms", "2.93s"), or "–" when ok is false.
func FormatDuration(d time.Duration, ok bool) string {
	if !ok {
		return "–"
	}
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2fms", ms)
	case ms < 1000:
		return fmt.Sprintf("%.0fms", ms)
	case ms < 10000:
		return fmt.Sprintf("%.2fs", ms/1000)
	}
	return fmt.Sprintf("%.1fs", ms/1000)
}

// Interval is a span of time.
type Interval struct{ From, To time.Time }

// Union merges overlapping intervals (empty ones dropped), sorted.
func Union(in []Interval) []Interval {
	var s []Interval
	for _, iv := range in {
		if iv.To.After(iv.From) {
			s = append(s, iv)
		}
	}
	slices.SortFunc(s, func(a, b Interval) int { return a.From.Compare(b.From) })
	var out []Interval
	for _, iv := range s {
		if n := len(out); n > 0 && !iv.From.After(out[n-1].To) {
			if iv.To.After(out[n-1].To) {
				out[n-1].To = iv.To
			}
			continue
		}
		out = append(out, iv)
	}
	return out
}

// Length is the total length of disjoint intervals.
func Length(ivs []Interval) time.Duration {
	var d time.Duration
	for _, iv := range ivs {
		d += iv.To.Sub(iv.From)
	}
	return d
}

// Contains reports whether t lies inside one of disjoint intervals, ends
// excluded: a wait's window opens with the refused request and closes with
// the accepted one, and neither is a request made while waiting.
func Contains(ivs []Interval, t time.Time) bool {
	for _, iv := range ivs {
		if t.After(iv.From) && t.Before(iv.To) {
			return true
		}
	}
	return false
}
