package fake

import "testing"

// Change status precedence (overlord/state/change.go Status, statusOrder).
func TestChangeStatusPrecedence(t *testing.T) {
	mk := func(sts ...string) *change {
		c := &change{}
		var prev *task
		for _, s := range sts {
			tk := &task{status: s, chg: c}
			if prev != nil {
				tk.waitFor = []*task{prev}
			}
			prev = tk
			c.tasks = append(c.tasks, tk)
		}
		return c
	}
	for _, tc := range []struct {
		tasks []string
		want  string
	}{
		{nil, StatusHold},
		{[]string{StatusDone, StatusDoing}, StatusDoing},
		{[]string{StatusDone, StatusDo}, StatusDo},
		{[]string{StatusError, StatusHold}, StatusError},
		{[]string{StatusUndone, StatusError}, StatusError},
		{[]string{StatusDone, StatusHold}, StatusDone},
		{[]string{StatusUndone, StatusHold}, StatusUndone},
		{[]string{StatusUndo, StatusError}, StatusUndo},
		{[]string{StatusDoing, StatusAbort}, StatusAbort},
		// every pending task blocked behind a Wait task: Wait
		{[]string{StatusWait, StatusDo}, StatusWait},
		{[]string{StatusWait, StatusError}, StatusWait},
		// a runnable task elsewhere: Wait ranks after Do, before Error
		{[]string{StatusDoing, StatusWait}, StatusDoing},
	} {
		if got := mk(tc.tasks...).status(); got != tc.want {
			t.Errorf("%v: got %s, want %s", tc.tasks, got, tc.want)
		}
	}
	// Wait plus an independent runnable Do task is Do, not Wait.
	c := &change{}
	c.tasks = []*task{{status: StatusWait, chg: c}, {status: StatusDo, chg: c}, {status: StatusError, chg: c}}
	if got := c.status(); got != StatusDo {
		t.Errorf("independent Do: got %s", got)
	}
}
