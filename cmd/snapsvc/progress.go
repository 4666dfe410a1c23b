package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// progress draws one self-erasing status line on a terminal while a
// command waits. When off (not a terminal, or -v), every method is a no-op.
type progress struct {
	w  io.Writer
	on bool

	mu       sync.Mutex
	text     string
	describe func() string
	drawn    bool
	frame    int

	stop chan struct{}
	done chan struct{}
}

// progressTick is how often the line is redrawn (and a followed change
// re-read).
const progressTick = 200 * time.Millisecond

// progressWidth bounds the line so it never wraps on an 80-column terminal.
const progressWidth = 78

func newProgress(w io.Writer, on bool) *progress {
	p := &progress{w: w, on: on}
	if on {
		p.stop = make(chan struct{})
		p.done = make(chan struct{})
		go p.loop()
	}
	return p
}

func (p *progress) enabled() bool { return p != nil && p.on }

func (p *progress) loop() {
	defer close(p.done)
	t := time.NewTicker(progressTick)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.mu.Lock()
		describe := p.describe
		p.mu.Unlock()
		if describe != nil {
			if s := describe(); s != "" {
				p.mu.Lock()
				if p.describe != nil { // not cleared meanwhile
					p.text = s
				}
				p.mu.Unlock()
			}
		}
		p.mu.Lock()
		p.drawLocked()
		p.mu.Unlock()
	}
}

var spinner = []string{"|", "/", "-", "\\"}

func (p *progress) drawLocked() {
	if p.text == "" {
		return
	}
	p.frame++
	line := spinner[p.frame%len(spinner)] + " " + p.text
	if utf8.RuneCountInString(line) > progressWidth {
		r := []rune(line)
		line = string(r[:progressWidth-1]) + "…"
	}
	fmt.Fprintf(p.w, "\r\033[K%s", line)
	p.drawn = true
}

// set shows text until the next set, follow or clear.
func (p *progress) set(text string) {
	if !p.enabled() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.text = strings.ReplaceAll(text, "\n", " ")
	p.drawLocked()
}

// println prints a line; on a terminal above the progress line, which is
// erased first and drawn again after.
func (p *progress) println(line string) {
	if !p.enabled() {
		fmt.Fprintln(p.w, line)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
	fmt.Fprintln(p.w, line)
	p.drawLocked()
}

// follow shows what describe returns, re-evaluated at every tick.
func (p *progress) follow(describe func() string) {
	if !p.enabled() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.describe = describe
}

// clear stops following and erases the line, before results are printed.
func (p *progress) clear() {
	if !p.enabled() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.describe = nil
	p.text = ""
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// close stops drawing for good.
func (p *progress) close() {
	if !p.enabled() {
		return
	}
	close(p.stop)
	<-p.done
	p.clear()
}

// followChange is a describe function for progress.follow that reads the
// change and says which task snapd is on.
func (a *app) followChange(ctx context.Context, read func(ctx context.Context) (string, error)) func() string {
	return func() string {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		s, err := read(ctx)
		if err != nil {
			return ""
		}
		return s
	}
}

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
