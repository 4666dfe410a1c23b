package snapsvc

import (
	"context"
	"log/slog"
)

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
