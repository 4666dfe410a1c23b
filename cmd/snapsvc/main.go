package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"
)

func main() { os.Exit(realMain()) }

// realMain runs the command line of this process and returns its exit code.
func realMain() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, os.Args[1:], env{
		stdout:   os.Stdout,
		stderr:   os.Stderr,
		getenv:   os.Getenv,
		terminal: term.IsTerminal(int(os.Stderr.Fd())) && os.Getenv("TERM") != "dumb",
		width:    stderrWidth,
	})
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
