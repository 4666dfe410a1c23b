package snapsvc

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/snapsvc/snapsvc/retry"
)

// What a call reports to the outside: its events, to the observers of
// WithObserver (below), and its log lines, to the logger of WithLogger or
// of the call's context (at the end).

// EventKind says what an Event reports.
type EventKind int

const (
	// EventUnreachable: snapd could not be reached (no socket, nobody
	// listening). Sent once at the start of each run of such failures;
	// Socket and Err say what failed, GiveUpAt when the operation stops
	// trying (zero: only the context bounds it).
	EventUnreachable EventKind = iota + 1
	// EventReachable: snapd answered again after EventUnreachable.
	EventReachable
	// EventConflict: snapd refused the request because another change
	// holds the snap. Blockers lists the changes being waited for; it is
	// empty when none could be seen (the operation backs off instead) and
	// for a first conflict where snapd's state file is watched: the
	// operation tries again at the next rewrite without listing changes,
	// and lists them only if refused again. Err is the
	// *retry.ConflictError.
	EventConflict
	// EventAnswerLost: snapd's answer to a request to act was lost, or
	// garbled; the operation looks for the change the request may have
	// made before sending anything again. Err is the failure.
	EventAnswerLost
	// EventAccepted: snapd accepted the request; ChangeID is its change
	// ("" in snapctl mode, where snapd does not say). Elapsed is the time
	// since the operation's first attempt.
	EventAccepted
	// EventStarted: Start, Stop, Restart or Refresh (or an Async form)
	// was called.
	EventStarted
	// EventDone: the operation succeeded. Elapsed is its whole duration
	// (conflicts waited out and the change included); ChangeID, Status,
	// Attempt and Conflicts are its Result's.
	EventDone
	// EventFailed: the operation failed with Err (an *OpError, unless the
	// names were invalid). Elapsed is its duration; ChangeID is set when
	// a change was made.
	EventFailed
	// EventJoined: the restart joined an identical restart, of this
	// process or of another process of the machine, whose request was not
	// sent yet: it sends nothing itself, and shares that restart's change
	// (Result.Shared) should it end with one.
	EventJoined
	// EventReplayed: Replay (or the replay New begins, WithIntents)
	// finished an intent a process left unfinished; ChangeID is the
	// change it found or made, Err its failure. The Replayed values say
	// more.
	EventReplayed
)

func (k EventKind) String() string {
	switch k {
	case EventUnreachable:
		return "unreachable"
	case EventReachable:
		return "reachable"
	case EventConflict:
		return "conflict"
	case EventAnswerLost:
		return "answer-lost"
	case EventAccepted:
		return "accepted"
	case EventStarted:
		return "started"
	case EventDone:
		return "done"
	case EventFailed:
		return "failed"
	case EventJoined:
		return "joined"
	case EventReplayed:
		return "replayed"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is a step of an operation that a user may want to see while it
// waits (snapd unreachable, a conflict being waited out, a lost answer)
// or that metrics count (started, accepted, done, failed).
type Event struct {
	Kind EventKind
	// Op is "start", "stop", "restart" or "refresh" ("wait" while
	// waiting for a change outside an operation, "gate-auto-refresh"
	// for GateAutoRefresh).
	Op string
	// Names are the services the operation targets.
	Names []string
	// Attempt is the attempt the event belongs to (1-based; 0 outside the
	// attempts, e.g. while waiting for the change).
	Attempt int
	// ChangeID is the accepted change (EventAccepted).
	ChangeID string
	// Blockers are the changes waited out (EventConflict).
	Blockers []string
	// Socket is the socket that could not be reached (EventUnreachable).
	Socket string
	// GiveUpAt is when the operation stops trying to reach snapd
	// (EventUnreachable; zero when only the context bounds it).
	GiveUpAt time.Time
	// Err is the failure behind the event, if any.
	Err error
	// Elapsed is the time since the operation started: its whole
	// duration for EventDone and EventFailed; for the events on the way
	// (EventAccepted, EventConflict, ...) the time since its first attempt.
	Elapsed time.Duration
	// Status is the change's final status (EventDone).
	Status string
	// Conflicts is how many conflicts the operation absorbed (EventDone):
	// Result.Conflicts, one per blocking change.
	Conflicts int
}

// WithObserver sets a function called, in the operation's goroutine, at
// each Event; given more than once, every observer is called, in the
// order given. It must return quickly and not call the Client. The CLI uses
// it to say at once, on stderr, that snapd is unreachable and until when
// it keeps trying.
func WithObserver(f func(Event)) Option {
	return func(s *settings) {
		if prev := s.observer; prev != nil && f != nil {
			s.observer = func(e Event) { prev(e); f(e) }
			return
		}
		if f != nil {
			s.observer = f
		}
	}
}

// events sends a Client's events to its observer (WithObserver), if any.
type events struct {
	observer func(Event)
	clock    retry.Clock
}

// emit sends e to the observer, if any.
func (es events) emit(e Event) {
	if es.observer != nil {
		es.observer(e)
	}
}

// Operation events: every Start, Stop and Restart (and their Async forms)
// emits EventStarted, then EventAccepted once snapd accepted the request
// (from operation.go), then exactly one of EventDone and EventFailed, each with
// Elapsed, the time since EventStarted, and ChangeID when a change was
// made. For an Async operation the end is emitted by the first Wait that
// sees it (an operation nobody waits for only reports its acceptance, or
// its failure to be accepted).

// opObs is what an Operation remembers for its end event.
type opObs struct {
	started time.Time
	ended   bool
}

// opStarted emits EventStarted and returns when the operation started.
func (es events) opStarted(action string, names []string) time.Time {
	at := es.clock.Now()
	es.emit(Event{Kind: EventStarted, Op: action, Names: names})
	return at
}

// opEnded emits EventDone or EventFailed.
func (es events) opEnded(action string, names []string, started time.Time, res *Result, err error) {
	ev := Event{Kind: EventDone, Op: action, Names: names, Elapsed: es.clock.Now().Sub(started), Err: err}
	if res != nil {
		ev.ChangeID, ev.Status, ev.Attempt, ev.Conflicts = res.ChangeID, res.Status, res.Attempts, res.Conflicts
	}
	if err != nil {
		ev.Kind = EventFailed
		var oe *OpError
		if errors.As(err, &oe) {
			ev.ChangeID, ev.Attempt = oe.ChangeID, oe.Attempts
		}
	}
	es.emit(ev)
}

// ---- log lines ----

// loggerKey is the context key ContextWithLogger stores a logger under.
type loggerKey struct{}

// ContextWithLogger returns a copy of ctx that carries l. Every operation
// called with that context (or one derived from it) writes its log lines
// to l instead of the client's own logger, so the values a controller put
// on its request's logger (the object reconciled, a request id) appear on
// snapsvc's lines too. A nil l leaves ctx as it is.
func ContextWithLogger(ctx context.Context, l *slog.Logger) context.Context {
	if l == nil {
		return ctx
	}
	return context.WithValue(ctx, loggerKey{}, l)
}

// WithContextLogger sets a function that picks the logger of each call
// from its context, for programs that already keep a logger in their
// contexts (logr's logr.NewContext, say). A nil answer falls back to the
// logger of WithLogger. A logger put in the context with ContextWithLogger
// takes precedence over the function. With go-logr/logr:
//
//	snapsvc.WithContextLogger(func(ctx context.Context) *slog.Logger {
//		l, err := logr.FromContext(ctx)
//		if err != nil {
//			return nil
//		}
//		return slog.New(logr.ToSlogHandler(l))
//	})
func WithContextLogger(f func(context.Context) *slog.Logger) Option {
	return func(s *settings) { s.ctxLogger = f }
}

// log returns the logger for a call made with ctx: the one ContextWithLogger
// put there, else the WithContextLogger function's, else the client's.
func (c *Client) log(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	if c.ctxLogger != nil {
		if l := c.ctxLogger(ctx); l != nil {
			return l
		}
	}
	return c.logger
}

// discardHandler drops every record: the default logger, silent. (The
// standard library's slog.DiscardHandler is Go 1.24; the module supports
// Go 1.22.)
type discardHandler struct{}

func (discardHandler) Enabled(context.Context, slog.Level) bool  { return false }
func (discardHandler) Handle(context.Context, slog.Record) error { return nil }
func (d discardHandler) WithAttrs([]slog.Attr) slog.Handler      { return d }
func (d discardHandler) WithGroup(string) slog.Handler           { return d }

// LoggerFromContext returns the logger ContextWithLogger put in ctx, or
// nil. Packages built on a Client (snapservices) use it to write their own
// lines where the call's other lines go.
func LoggerFromContext(ctx context.Context) *slog.Logger {
	l, _ := ctx.Value(loggerKey{}).(*slog.Logger)
	return l
}

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
