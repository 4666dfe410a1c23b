package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"
)

func main() { os.Exit(realMain()) }

// realMain runs the command line of this process and returns its exit code.
func realMain() int {
	ctx, stop := signalContext()
	defer stop()
	return run(ctx, os.Args[1:], env{
		stdout:   os.Stdout,
		stderr:   os.Stderr,
		getenv:   os.Getenv,
		terminal: term.IsTerminal(int(os.Stderr.Fd())) && os.Getenv("TERM") != "dumb",
		width:    stderrWidth,
	})
}

// signalContext is a context that SIGINT (Ctrl-C) or SIGTERM cancels, its
// cause a *signalError naming the signal (the exit code tells them apart:
// 130, 143). As with signal.NotifyContext, a second signal is ignored
// until stop: the command is already ending.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-ch:
			cancel(&signalError{s})
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel(nil)
	}
}

// signalError is the cause of a context a signal cancelled. It matches
// context.Canceled.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string        { return e.sig.String() + " signal received" }
func (e *signalError) Is(target error) bool { return target == context.Canceled }

// terminatedBy is the signal that cancelled ctx (nil: none, or a plain
// cancel, which tests use for Ctrl-C).
func terminatedBy(ctx context.Context) os.Signal {
	var se *signalError
	if errors.As(context.Cause(ctx), &se) {
		return se.sig
	}
	return nil
}

// stderrWidth is the width of the terminal on stderr, 0 if unknown. It is
// read at each redraw, so a resized terminal is followed.
func stderrWidth() int {
	w, _, err := term.GetSize(int(os.Stderr.Fd()))
	if err != nil {
		return 0
	}
	return w
}
