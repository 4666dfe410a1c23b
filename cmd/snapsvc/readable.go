package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
)

// readableHandler renders the library's log records as short readable
// lines ("k8s restart k8s.kubelet: change created (change 4, attempt 1)")
// and hands them to sink. Records below Info are dropped unless debug.
type readableHandler struct {
	who   string
	attrs []slog.Attr
	debug bool
	sink  func(msg, line string)
	// ops remembers the names of each change's operation, for the records
	// that only carry the change id ("change done").
	ops *sync.Map
}

func (h *readableHandler) Enabled(_ context.Context, l slog.Level) bool {
	return h.debug || l >= slog.LevelInfo
}

func (h *readableHandler) Handle(_ context.Context, r slog.Record) error {
	attrs := append([]slog.Attr(nil), h.attrs...)
	r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a); return true })
	if h.ops != nil {
		var change, names string
		for _, a := range attrs {
			switch a.Key {
			case "change":
				change = a.Value.String()
			case "names":
				names = a.Value.String()
			}
		}
		if change != "" && names != "" {
			h.ops.Store(change, names)
		} else if v, ok := h.ops.Load(change); ok && change != "" {
			attrs = append(attrs, slog.String("names", v.(string)))
		}
	}
	h.sink(r.Message, renderRecord(r.Message, attrs))
	return nil
}

func (h *readableHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h2 := *h
	h2.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &h2
}

func (h *readableHandler) WithGroup(string) slog.Handler { return h }

// renderRecord puts the operation (snap, action, names) first, then the
// message, then the other attributes in parentheses.
func renderRecord(msg string, attrs []slog.Attr) string {
	var action, names, snap string
	var extra []string
	for _, a := range attrs {
		v := a.Value.Resolve()
		switch a.Key {
		case "action":
			action = v.String()
		case "names":
			names = v.String()
		case "snap":
			snap = v.String()
		default:
			extra = append(extra, a.Key+" "+fmt.Sprint(v.Any()))
		}
	}
	var b strings.Builder
	switch {
	case action != "" && names != "":
		fmt.Fprintf(&b, "%s %s: ", action, strings.ReplaceAll(names, ",", " "))
	case action != "" && snap != "":
		fmt.Fprintf(&b, "%s %s: ", action, snap)
	case action != "":
		fmt.Fprintf(&b, "%s: ", action)
	case snap != "":
		fmt.Fprintf(&b, "%s: ", snap)
	}
	b.WriteString(msg)
	if len(extra) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(extra, ", "))
	}
	return b.String()
}
