package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// logsCmd is snap logs: the same flags, the same request (GET /v2/logs,
// names=..., n=N, follow=true) and the same lines, byte for byte
// (cmd/snap/cmd_services.go svcLogs, client/apps.go Log.String).
func (a *app) logsCmd() *cobra.Command {
	var n string
	var follow, absTime bool
	c := &cobra.Command{
		Use:   "logs [-n=N|all] [-f] [--abs-time] NAME...",
		Short: "Retrieve logs for services",
		Long: `The logs command fetches logs of the given services and displays them in
chronological order, as snap logs does: the last 10 lines by default, each
"TIME SID[PID]: MESSAGE" with the time in RFC 3339, in the local time zone
(--abs-time: in UTC). -f waits for new lines and prints them as they come
in, until interrupted (Ctrl-C: exit 130, as every command; SIGTERM: 143) or
--timeout (exit 0). --json prints each entry as a
JSON object on a line of its own (snapd's fields: timestamp, message, sid,
pid).

The journal is read through snapd's socket (never the snap socket: snapd
serves logs only there).`,
		Example: `  snapsvc logs k8s.kubelet           # its last 10 lines
  snapsvc logs -n=all k8s             # every line of every service of k8s
  snapsvc logs -f k8s.kubelet         # and new lines as they come, until Ctrl-C`,
		Args:              needNames("logs"),
		ValidArgsFunction: a.completeNames,
		RunE: func(c *cobra.Command, names []string) error {
			if err := checkNames(names); err != nil {
				return err
			}
			count := -1
			if n != "all" {
				// snap's own check and words (cmd/snap/cmd_services.go).
				v, err := strconv.ParseInt(n, 0, 32)
				if v < 0 || err != nil {
					return usagef("invalid argument for flag ‘-n’: expected a non-negative integer argument, or “all”.")
				}
				count = int(v)
			}
			return a.do(c, func(ctx context.Context) error {
				return a.logs(ctx, snapd.LogsOptions{Names: names, N: count, Follow: follow}, absTime)
			})
		},
	}
	c.Flags().StringVarP(&n, "lines", "n", "10", "show only the given number of lines, or 'all'")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "wait for new lines and print them as they come in")
	c.Flags().BoolVar(&absTime, "abs-time", false, "display absolute times (in RFC 3339 format, UTC); otherwise in the local time zone")
	return c
}

// logs prints the journal's entries as they arrive. Following ends
// without an error at --timeout, and, as snap logs -f, with nothing said
// when interrupted, but with the exit code of every interrupted command
// (130; 143 for SIGTERM): snap, killed by the signal, shows as 130 or
// 143 in a shell.
func (a *app) logs(ctx context.Context, opts snapd.LogsOptions, absTime bool) error {
	loc := time.Local
	if absTime {
		loc = time.UTC
	}
	// The main socket: snapd serves /v2/logs there only (daemon/api_apps.go
	// logsCmd, openAccess), inside a snap too.
	socket := a.socket
	if socket == "" {
		socket, _ = snapsvc.SocketsFromEnv(a.getenv)
	}
	c := a.wire(socket)
	defer c.Close()
	enc := json.NewEncoder(a.stdout)
	enc.SetEscapeHTML(false)
	err := c.Logs(ctx, opts, func(l snapd.Log) error {
		if a.json {
			return enc.Encode(l)
		}
		_, err := fmt.Fprintln(a.stdout, l.String(loc))
		return err
	})
	switch {
	case !opts.Follow || err == nil:
		return err
	case errors.Is(ctx.Err(), context.Canceled):
		return &interruptedError{err: err, quiet: true, sig: terminatedBy(ctx)}
	case errors.Is(err, context.DeadlineExceeded):
		return nil
	}
	return err
}
