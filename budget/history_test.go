package budget_test

import (
	"testing"

	"github.com/snapsvc/snapsvc/budget"
)

func TestFailuresAfter(t *testing.T) {
	ready, failed, abandoned := budget.Act{Outcome: budget.OutcomeReady}, budget.Act{Outcome: budget.OutcomeFailed}, budget.Act{Outcome: budget.OutcomeAbandoned}
	for _, c := range []struct {
		before    int
		act       budget.Act
		haltAfter int
		after     int
		halts     bool
	}{
		{0, failed, 1, 1, true},
		{0, failed, 2, 1, false},
		{1, failed, 2, 2, true},
		{3, failed, 2, 4, true}, // past the threshold (halted and resumed is a reset to 0 by the backend)
		{1, ready, 2, 0, false},
		{1, abandoned, 2, 1, false},
		{5, failed, -1, 6, false},
		{0, ready, 1, 0, false},
	} {
		after, halts := budget.FailuresAfter(c.before, c.act, c.haltAfter)
		if after != c.after || halts != c.halts {
			t.Errorf("FailuresAfter(%d, %s, %d) = %d, %v; want %d, %v", c.before, c.act.Outcome, c.haltAfter, after, halts, c.after, c.halts)
		}
	}
}
