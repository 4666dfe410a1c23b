package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// progress tells, on stderr, what a command is waiting for: the change's
// id and kind (the command's own change, or another's that holds the
// snap) and for how long.
//
// On a terminal it is one self-erasing line, redrawn every progressTick,
// as wide as the terminal. Without one (a pipe, a file, /dev/null, CI) it
// prints a line when a wait starts, and then one every quietEvery ("still
// waiting for change 42 (configure-snap), 10s"), so a log never looks
// hung. With -v it is off (the library's log says it all).
type progress struct {
	w     io.Writer
	term  bool
	off   bool
	width func() int
	every time.Duration
	now   func() time.Time

	mu        sync.Mutex
	what      string // "restart k8s.kubelet"
	cl        *snapsvc.Client
	chg, kind string
	own       bool   // chg is the command's own change
	snap      string // waiting for SNAP to be idle
	since     time.Time
	told      time.Time // last line without a terminal
	drawn     bool
	frame     int

	stop, done chan struct{}
}

// progressTick is how often the terminal line is redrawn and the quiet
// mode checks whether a line is due.
const progressTick = 200 * time.Millisecond

// progressQuietEvery is how often, without a terminal, a wait says it is
// still waiting.
const progressQuietEvery = 5 * time.Second

// completionWait bounds the request shell completion makes to snapd.
const completionWait = time.Second

func newProgress(w io.Writer, term bool, width func() int, every time.Duration, off bool) *progress {
	if every <= 0 {
		every = progressQuietEvery
	}
	p := &progress{w: w, term: term, off: off, width: width, every: every, now: time.Now,
		stop: make(chan struct{}), done: make(chan struct{})}
	if off {
		close(p.done)
		return p
	}
	go p.loop()
	return p
}

// begin names what the command does, for the line.
func (p *progress) begin(what string) {
	if p.off {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.what, p.since = what, p.now()
	if p.term {
		p.tickLocked()
	}
}

// lookup lets the progress read the changes it names (their kind).
func (p *progress) lookup(c *snapsvc.Client) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cl = c
}

// waitFor says the command now waits for its own change id.
func (p *progress) waitFor(id, kind string) { p.set(id, kind, true) }

// blocked says the command waits for another's change that holds the
// snap.
func (p *progress) blocked(id string) { p.set(id, "", false) }

// waitForSnap says the command waits for snap to be idle.
func (p *progress) waitForSnap(snap string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.snap, p.since, p.told = snap, p.now(), time.Time{}
	if !p.off && !p.term {
		p.told = p.since
		fmt.Fprintf(p.w, "%s: waiting for snap %q to be idle\n", p.what, snap)
	}
}

func (p *progress) set(id, kind string, own bool) {
	if p.off {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if id == p.chg && own == p.own {
		return
	}
	p.chg, p.kind, p.own = id, kind, own
	p.since, p.told = p.now(), time.Time{}
	if p.term {
		p.tickLocked()
	}
	if !p.term {
		// Without a terminal, a line when a wait starts.
		p.kind = p.kindLocked()
		p.told = p.since
		holds := ""
		if !own {
			holds = " that holds the snap"
		}
		fmt.Fprintf(p.w, "%s: waiting for change %s%s\n", p.what, p.changeLocked(), holds)
	}
}

// kindLocked reads the change's kind once, if a client is known.
func (p *progress) kindLocked() string {
	if p.kind != "" || p.cl == nil || p.chg == "" {
		return p.kind
	}
	cl, id := p.cl, p.chg
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), completionWait)
	chg, err := cl.Change(ctx, id)
	cancel()
	p.mu.Lock()
	if err != nil || id != p.chg {
		return p.kind
	}
	return chg.Kind
}

// changeLocked is "42 (configure-snap)".
func (p *progress) changeLocked() string {
	if p.kind == "" {
		return p.chg
	}
	return p.chg + " (" + p.kind + ")"
}

// end says the wait is over: the line is erased.
func (p *progress) end() {
	if p.off {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.chg, p.kind, p.snap, p.what = "", "", "", ""
	p.eraseLocked()
}

func (p *progress) eraseLocked() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// println prints a line; on a terminal above the progress line, which is
// erased first and drawn again after.
func (p *progress) println(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.eraseLocked()
	fmt.Fprintln(p.w, line)
}

// close stops the progress for good and erases the line.
func (p *progress) close() {
	if p.off {
		return
	}
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.end()
}

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
		p.tickLocked()
		p.mu.Unlock()
	}
}

var spinner = []string{"|", "/", "-", "\\"}

func (p *progress) tickLocked() {
	if p.chg == "" && p.snap == "" {
		if p.term && p.what != "" && !p.since.IsZero() {
			// Before any change: the request is on its way.
			p.drawLocked(fmt.Sprintf("asking snapd, %v · %s", p.now().Sub(p.since).Truncate(time.Second), p.what))
		}
		return
	}
	if p.chg != "" {
		p.kind = p.kindLocked()
	}
	if p.chg == "" && p.snap != "" {
		// wait-idle: name the change that holds the snap.
		p.chg, p.kind = p.holderLocked()
	}
	elapsed := p.now().Sub(p.since).Truncate(time.Second)
	what := "waiting for change " + p.changeLocked()
	switch {
	case p.chg == "":
		what = fmt.Sprintf("waiting for snap %q to be idle", p.snap)
	case !p.own:
		what += " that holds the snap"
	}
	if p.term {
		// Most telling first, so a narrow terminal cuts the least useful
		// part: the change, its kind and the time, then the command.
		short := "change " + p.changeLocked() + " running"
		switch {
		case p.chg == "":
			short = fmt.Sprintf("snap %q busy", p.snap)
		case !p.own:
			short = "change " + p.changeLocked() + " holds the snap"
		}
		p.drawLocked(fmt.Sprintf("%s, %v · %s", short, elapsed, p.what))
		return
	}
	last := p.told
	if last.IsZero() {
		last = p.since
	}
	if p.now().Sub(last) < p.every {
		return
	}
	p.told = p.now()
	fmt.Fprintf(p.w, "%s: still %s, %v\n", p.what, what, elapsed)
}

// drawLocked draws the terminal line: a spinner and text, cut to the
// terminal's width (80 when unknown) so it never wraps.
func (p *progress) drawLocked(text string) {
	{
		p.frame++
		line := spinner[p.frame%len(spinner)] + " " + text
		w := 80
		if p.width != nil {
			if n := p.width(); n > 0 {
				w = n
			}
		}
		if utf8.RuneCountInString(line) > w-1 {
			r := []rune(line)
			line = string(r[:w-2]) + "…"
		}
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		p.drawn = true
	}
}

// holderLocked finds a change in progress that touches p.snap.
func (p *progress) holderLocked() (string, string) {
	if p.cl == nil {
		return "", ""
	}
	cl, snap := p.cl, p.snap
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), completionWait)
	chgs, err := cl.Changes(ctx, snapsvc.ChangesOptions{Snap: snap})
	cancel()
	p.mu.Lock()
	if err != nil || len(chgs) == 0 || p.snap != snap {
		return "", ""
	}
	p.own = true // the "that holds the snap" is implied by wait-idle
	return chgs[0].ID, chgs[0].Kind
}
