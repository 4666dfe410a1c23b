// Command bench compares snapsvc with the retry strategies callers use
// today, in real time, on the in-process fake snapd, and prints its figures
// as tables that fit 100 columns (--wide: one table with every column;
// --markdown, --json).
//
//	go run ./cmd/bench --quick                           # ~30 s: every scenario and strategy, shorter holds
//	go run ./cmd/bench                                   # ~7 min: every scenario, strategy and version
//	go run ./cmd/bench --scenario foreign --snapd-version 2.57 --samples 40
//
// It is a command of the cmd module, in the CLI style every binary of the
// project shares (cmd/clistyle: GNU flags, help on stdout,
// --version): the root module stays free of cobra, and bench needs nothing
// of the core that the cmd module does not already import.
//
// Strategies:
//
//   - naive: one attempt, no retry: a hook running `snapctl restart` once
//     (one POST /v2/snapctl, answered when the change is ready);
//   - fixed: what Kubernetes-as-a-snap ships, k8sd's control.RetryFor(5
//     attempts, 5 s apart) around the snap command (POST /v2/apps, then the
//     change polled every 100 ms as cmd/snap/wait.go does), any error
//     retried, no lock; --scale divides its 5 s pause;
//   - backoff: backoff/v4's defaults (backoff.NewExponentialBackOff) around
//     the same snap command: no lock, no wake-up;
//   - snapsvc: the library (REST mode, its default policy and file lock;
//     it watches the fake's state file as it watches
//     /var/lib/snapd/state.json on a host, unless --state-file=false).
//
// Scenarios:
//
//   - foreign: one caller restarts kubelet while a foreign change holds
//     the snap for D (each of --durations);
//   - bootstrap: a hook starts 8 services one call each while a controller
//     restarts kubelet 10 times and a foreign configure-snap change holds
//     the snap for --hold;
//   - storm: 5 controllers each restart one service 10 times at once;
//   - late-socket: snapd's socket appears --socket-delay after the caller
//     started;
//   - uncontended: one restart with nothing in the way;
//   - waiters: K callers in each of P processes (Clients with lock
//     registries of their own, sharing one lock directory) restart kubelet
//     while a foreign change holds the snap for --waiters-hold; their
//     restarts are identical, so they may merge;
//   - waiters-own: the same, each process restarting a service of its
//     own: nothing merges, the processes share one watcher alone.
//
// Every sample runs on its own fake, --parallel of them at a time (a
// default run takes about 7 minutes, most of it fixed's 5 s pauses; --quick
// about half a minute); each scenario runs on snapd 2.57 (no notices:
// snapsvc polls) and 2.77 (notices long-poll) unless --snapd-version says
// otherwise. Per cell it prints the median makespan and its ratio to the
// ideal (the change durations snapd must serialise anyway), failed calls
// and the wake latency (the snap free, or the socket up, to our accepted
// request's arrival in the fake's request log) at p50 and p99; then, in a
// second table, snapd requests (per sample, per call, and per second while
// calls waited) and changes created; then issue 12's targets for snapsvc,
// met or missed.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the command; it returns the exit code: 0, 1 when writing the
// figures failed, 2 for a usage error.
func run(args []string, stdout, stderr io.Writer) int {
	var c config
	ran := false
	cmd := newCommand(&c, func() error {
		ran = true
		rows := c.measureAll(stderr)
		if c.json {
			return c.writeJSON(stdout, rows)
		}
		return c.writeTable(stdout, rows)
	})
	_, err := clistyle.Execute(context.Background(), cmd, args, stdout, stderr, func() bool { return ran })
	var ue *clistyle.UsageError
	if errors.As(err, &ue) {
		ue.Fprint(stderr)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, "error:", err)
		return 1
	}
	return 0
}

// measureAll runs every scenario in turn (the samples of one scenario in
// parallel) and returns the table's rows; progress goes to progress.
func (c config) measureAll(progress io.Writer) []row {
	var rows []row
	for _, sc := range c.scenarios {
		jobs := c.jobs(sc)
		fmt.Fprintf(progress, "bench: %s: %d samples...\n", sc, len(jobs))
		rows = append(rows, aggregate(c.runAll(jobs))...)
	}
	return rows
}
