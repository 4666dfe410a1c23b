// Command bench compares snapsvc with the retry strategies callers use
// today, in real time, on the in-process fake snapd, and prints one table
// (or, with --json, one JSON document).
//
//	go run ./bench                                   # every scenario, strategy and version
//	go run ./bench --scenario foreign --version 2.57 --samples 40
//	go run ./bench --scale 100 --samples 5 --runs 2  # quick: fixed's 5 s pause becomes 50 ms
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
//   - uncontended: one restart with nothing in the way.
//
// Every sample runs on its own fake, --parallel of them at a time (a
// default run takes about 5 minutes, most of it fixed's 5 s pauses); each
// scenario runs on snapd 2.57
// (no notices: snapsvc polls) and 2.77 (notices long-poll) unless
// --version says otherwise. Per cell it prints the median makespan and
// its ratio to the ideal (the change durations snapd must serialise
// anyway), failed calls, snapd requests (per sample, per call, and per
// second while calls waited), changes created, and the wake latency (the
// snap free, or the socket up, to our accepted request's arrival in the
// fake's request log) at p50 and p99; then issue 12's targets for
// snapsvc, met or missed.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// run is the command; it returns the exit code (2 for a usage error).
func run(args []string, stdout, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	rows := c.measureAll(stderr)
	if c.json {
		err = c.writeJSON(stdout, rows)
	} else {
		err = c.writeTable(stdout, rows)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
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
