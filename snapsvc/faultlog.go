package snapsvc

import "log/slog"

// faultLog keeps logging under faults readable: a fault state (snapd
// unavailable, a conflict whose blocker cannot be seen) is logged at Info
// when it begins, its repeats at Debug with their count, and its end at
// Info with how many repeats were logged at Debug only.
type faultLog struct {
	state   string
	repeats int
}

// log logs msg for state: at Info if the state is new, else at Debug.
func (f *faultLog) log(l *slog.Logger, state, msg string, args ...any) {
	if state == f.state {
		f.repeats++
		l.Debug(msg, append(args, "repeat", f.repeats)...)
		return
	}
	f.end(l)
	f.state = state
	l.Info(msg, args...)
}

// end logs, at Info, the end of the current state, if any: the fault
// cleared.
func (f *faultLog) end(l *slog.Logger) {
	if f.state != "" {
		l.Info("no longer "+f.state, "repeats_logged_at_debug", f.repeats)
	}
	f.state, f.repeats = "", 0
}

// gaveUp logs, at Info, that the operation ended while still in the
// current state (it gave up, or its time ran out): the fault did not
// clear, so it is not reported as over.
func (f *faultLog) gaveUp(l *slog.Logger) {
	if f.state != "" {
		l.Info("ended while "+f.state, "repeats_logged_at_debug", f.repeats)
	}
	f.state, f.repeats = "", 0
}
