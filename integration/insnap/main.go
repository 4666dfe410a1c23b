// Command snapsvc-helper runs one snapsvc operation from inside a snap; the
// integration suite packs it into the svcdemo test snap (as the "helper"
// app) to exercise snapsvc exactly as a snap's own code would: snapctl mode
// detected from SNAP_COOKIE, changes read on the snap socket.
//
// Usage: snapsvc-helper [-enable|-disable|-reload] start|stop|restart|services NAME...
//
// It prints one JSON object: {"mode", "result"} on success or {"mode",
// "error", "retryable"} on failure (exit status 1).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/snapsvc/snapsvc/snapsvc"
)

type output struct {
	Mode      string            `json:"mode"`
	Hook      string            `json:"hook,omitempty"`
	Result    *snapsvc.Result   `json:"result,omitempty"`
	Services  []snapsvc.Service `json:"services,omitempty"`
	Error     string            `json:"error,omitempty"`
	Retryable bool              `json:"retryable,omitempty"`
	Took      string            `json:"took"`
}

func main() {
	enable := flag.Bool("enable", false, "start: also enable")
	disable := flag.Bool("disable", false, "stop: also disable")
	reload := flag.Bool("reload", false, "restart: reload if possible")
	timeout := flag.Duration("timeout", 2*time.Minute, "give up after this long")
	flag.Parse()
	if flag.NArg() < 1 {
		fmt.Fprintln(os.Stderr, "usage: snapsvc-helper start|stop|restart|services NAME...")
		os.Exit(2)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := snapsvc.New(snapsvc.WithLogger(logger))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	out := output{Mode: c.Mode().String(), Hook: c.Hook()}
	begin := time.Now()
	names := flag.Args()[1:]
	switch flag.Arg(0) {
	case "start":
		out.Result, err = c.Start(ctx, names, snapsvc.StartOptions{Enable: *enable})
	case "stop":
		out.Result, err = c.Stop(ctx, names, snapsvc.StopOptions{Disable: *disable})
	case "restart":
		out.Result, err = c.Restart(ctx, names, snapsvc.RestartOptions{Reload: *reload})
	case "services":
		out.Services, err = c.Services(ctx, names...)
	default:
		err = fmt.Errorf("unknown action %q", flag.Arg(0))
	}
	out.Took = time.Since(begin).String()
	if err != nil {
		out.Error = err.Error()
		var oe *snapsvc.OpError
		out.Retryable = errors.As(err, &oe) && oe.Retryable()
	}
	json.NewEncoder(os.Stdout).Encode(out)
	if err != nil {
		os.Exit(1)
	}
}
