package snapservices

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// Log lines. The snap command that k8sd ran printed one line per action
// ("Started.", "Stopped.", "Restarted.", or "error: ...") to k8sd's own
// output, whatever its log level; a handle writes one line per action in
// its place, at Info (V(0) in logr: shown at k8sd's default verbosity),
// naming the services, snapd's change, the conflicts it waited out and
// how long it took, or, at Warn (V(0) too in logr; klog, k8sd's, writes it
// as a W line), the error. The client's
// step-by-step lines (a change created, a conflict and what it waits for)
// go to the same logger one level lower (Info becomes logr's V(1), where
// k8sd logs "Starting services").
//
// The logger is the call's: the one snapsvc.ContextWithLogger put in its
// context, else the logr.Logger in it (logr.NewContext: k8sd's log.
// NewContext, controller-runtime's), through logr's slog bridge, else the
// handle's WithLogger. With none of them the lines are dropped.

// WithLogger sets the logger for calls whose context carries none
// (default: none, silent).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logs.logger = l } }

// WithLogLines is WithLogger for a logger that takes a line of text, so
// that one line per action reaches an adopter's own log, at its level,
// whatever the logger's kind: lxd's shared/logger (microovn, microceph),
// the log package. print gets each line with its level: slog.LevelInfo
// for an action done ("restarted services services=microovn.ovn-northd
// change=12 elapsed=1.06s"), slog.LevelWarn for one that failed or gave
// up ("cannot restart services services=microovn.ovn-northd
// elapsed=30s: snapsvc: restart ...": the error last, after a colon, as
// it reads). Wire the levels to the logger's, so that a give-up shows
// where warnings do:
//
//	snapservices.WithLogLines(func(level slog.Level, line string) {
//		if level >= slog.LevelWarn {
//			logger.Warn(line)
//			return
//		}
//		logger.Info(line)
//	})
//
// A line is the action's message and its attributes, key=value, without
// time or level; a value is quoted only when it has a space in it, and
// never escaped, so that the adopter's logger, which quotes the line as
// it quotes any message, escapes it once. The client's step-by-step
// lines (below Info) are not passed; its own warnings (a restart budget
// slot not given back) come one level lower, below slog.LevelWarn.
//
// In 0.2.0 print took the line alone, and the recipes sent every line,
// a give-up included, to the logger's Info.
func WithLogLines(print func(level slog.Level, line string)) Option {
	return WithLogger(slog.New(lineHandler{print: print}))
}

// lineHandler formats each record of Info or above as one line of text and
// hands it to print with its level.
type lineHandler struct {
	print func(slog.Level, string)
	attrs []slog.Attr
}

func (lineHandler) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }

func (h lineHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(oneLine(r.Message))
	var errText string
	add := func(a slog.Attr) {
		a.Value = a.Value.Resolve()
		switch {
		case a.Equal(slog.Attr{}):
		case a.Key == "error" && errText == "":
			errText = oneLine(a.Value.String())
		case a.Value.Kind() == slog.KindGroup:
			for _, g := range a.Value.Group() {
				b.WriteString(" " + a.Key + "." + g.Key + "=" + lineValue(g.Value.Resolve().String()))
			}
		default:
			b.WriteString(" " + a.Key + "=" + lineValue(a.Value.String()))
		}
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool { add(a); return true })
	if errText != "" {
		b.WriteString(": " + errText)
	}
	h.print(r.Level, b.String())
	return nil
}

// lineValue writes a value of a line: as it is when it is one word; in
// double quotes, unescaped, when it has spaces (or is empty); quoted as Go
// quotes strings only when it holds a double quote or a backslash itself,
// which no value of the handle's own lines does (the error, which may,
// ends the line unquoted).
func lineValue(v string) string {
	v = oneLine(v)
	switch {
	case v == "":
		return `""`
	case !strings.ContainsAny(v, " =\"\\"):
		return v
	case !strings.ContainsAny(v, "\"\\"):
		return `"` + v + `"`
	}
	return strconv.Quote(v)
}

// oneLine puts text on one line: snapd's change errors list their failed
// tasks on lines of their own.
func oneLine(s string) string {
	if !strings.ContainsAny(s, "\n\r\t") {
		return s
	}
	return strings.Join(strings.Fields(s), " ")
}

func (h lineHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return lineHandler{print: h.print, attrs: append(append([]slog.Attr(nil), h.attrs...), a...)}
}

func (h lineHandler) WithGroup(string) slog.Handler { return h }

type logs struct{ logger *slog.Logger }

// of returns the logger of a call made with ctx, or nil.
func (l logs) of(ctx context.Context) *slog.Logger {
	if lg := snapsvc.LoggerFromContext(ctx); lg != nil {
		return lg
	}
	if lr, err := logr.FromContext(ctx); err == nil {
		return slog.New(logr.ToSlogHandler(lr))
	}
	return l.logger
}

// client is the client's WithContextLogger: the call's logger, one level
// lower.
func (l logs) client(ctx context.Context) *slog.Logger {
	lg := l.of(ctx)
	if lg == nil {
		return nil
	}
	return slog.New(lower{lg.Handler()})
}

var past = map[string]string{"start": "started", "stop": "stopped", "restart": "restarted"}

// action logs the end of an action.
func (l logs) action(ctx context.Context, req Request, out outcome, err error, elapsed time.Duration) {
	lg := l.of(ctx)
	if lg == nil {
		return
	}
	names := req.Names
	if out.names != nil {
		names = out.names
	}
	attrs := []slog.Attr{slog.String("services", strings.Join(names, ","))}
	if len(req.Args) > 0 {
		attrs = append(attrs, slog.String("flags", strings.Join(req.Args, " ")))
	}
	if out.change != "" {
		attrs = append(attrs, slog.String("change", out.change))
	}
	if out.conflicts > 0 {
		attrs = append(attrs, slog.Int("conflicts", out.conflicts)) // one per blocking change
	}
	if out.attempts > 1 {
		attrs = append(attrs, slog.Int("attempts", out.attempts)) // every request sent, polls included
	}
	if len(out.waited) > 0 {
		attrs = append(attrs, slog.String("waited-for", strings.Join(out.waited, ",")))
	}
	if out.command != nil {
		attrs = append(attrs, slog.String("command", strings.Join(out.command, " ")))
	}
	attrs = append(attrs, slog.Duration("elapsed", elapsed.Round(time.Millisecond)))
	switch {
	case err != nil:
		attrs = append(attrs, slog.Any("error", err))
		lg.LogAttrs(ctx, slog.LevelWarn, "cannot "+req.Action+" services", attrs...)
	case out.unchanged:
		lg.LogAttrs(ctx, slog.LevelInfo, "services already running", attrs...) // WithEnsureRunning
	case out.queued:
		lg.LogAttrs(ctx, slog.LevelInfo, req.Action+" of services queued until the hook ends", attrs...)
	case req.NoWait:
		lg.LogAttrs(ctx, slog.LevelInfo, req.Action+" of services accepted", attrs...)
	default:
		lg.LogAttrs(ctx, slog.LevelInfo, past[req.Action]+" services", attrs...)
	}
}

// lower hands records to h one level lower (Info as logr's V(1)).
type lower struct{ h slog.Handler }

func (l lower) Enabled(ctx context.Context, lv slog.Level) bool { return l.h.Enabled(ctx, lv-1) }

func (l lower) Handle(ctx context.Context, r slog.Record) error {
	r.Level--
	return l.h.Handle(ctx, r)
}

func (l lower) WithAttrs(a []slog.Attr) slog.Handler { return lower{l.h.WithAttrs(a)} }
func (l lower) WithGroup(n string) slog.Handler      { return lower{l.h.WithGroup(n)} }
