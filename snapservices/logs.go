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
// how long it took, or, at Warn (V(0) too), the error. The client's
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
// that one line per action reaches an adopter's own log whatever its
// kind: lxd's shared/logger (microovn: func(l string) { logger.Info(l) }),
// microceph's logger.Infof, the log package's log.Print. Each line is
// the action's message and its attributes as slog's text handler writes
// them, without time or level ("restarted services services=microovn.ovn-
// northd change=12 elapsed=1.06s"); a failed action's line starts with
// "cannot". The client's step-by-step lines (below Info) are not passed.
func WithLogLines(print func(line string)) Option {
	return WithLogger(slog.New(lineHandler{print: print}))
}

// lineHandler formats each record of Info or above as one line of text and
// hands it to print.
type lineHandler struct {
	print func(string)
	attrs []slog.Attr
}

func (lineHandler) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }

func (h lineHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	th := slog.NewTextHandler(&b, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey) {
			return slog.Attr{}
		}
		return a
	}})
	r2 := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r2.AddAttrs(h.attrs...)
	r.Attrs(func(a slog.Attr) bool { r2.AddAttrs(a); return true })
	if err := th.Handle(context.Background(), r2); err != nil {
		return err
	}
	line := strings.TrimSpace(b.String())
	if m, ok := strings.CutPrefix(line, "msg="); ok {
		// The message as words, not a quoted value: "restarted services
		// services=...".
		if uq, rest, ok := unquoteMsg(m); ok {
			line = uq + rest
		}
	}
	h.print(line)
	return nil
}

// unquoteMsg splits the msg value at the start of s (quoted or not) from
// the attributes after it.
func unquoteMsg(s string) (msg, rest string, ok bool) {
	if strings.HasPrefix(s, `"`) {
		for i := 1; i < len(s); i++ {
			if s[i] == '\\' {
				i++
				continue
			}
			if s[i] == '"' {
				uq, err := strconv.Unquote(s[:i+1])
				return uq, s[i+1:], err == nil
			}
		}
		return "", "", false
	}
	msg, rest, _ = strings.Cut(s, " ")
	if rest != "" {
		rest = " " + rest
	}
	return msg, rest, true
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
		attrs = append(attrs, slog.Int("conflicts", out.conflicts))
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
