package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/testsupport/benchkit"
)

// Scenario names, in the order they run.
const (
	scForeign     = "foreign"
	scBootstrap   = "bootstrap"
	scStorm       = "storm"
	scLateSocket  = "late-socket"
	scUncontended = "uncontended"
	scWaiters     = "waiters"
	// scWaitersOwn is waiters with a service of its own for each
	// process: no two processes' restarts are identical, so none merge,
	// and what the machine shares is its one watcher alone.
	scWaitersOwn = "waiters-own"
)

var allScenarios = []string{scForeign, scBootstrap, scStorm, scLateSocket, scUncontended, scWaiters, scWaitersOwn}

// isWaiters reports whether sc is one of the waiters scenarios.
func isWaiters(sc string) bool { return sc == scWaiters || sc == scWaitersOwn }

// waiters' cells: K callers in each of P processes wait on one blocker
// held for --waiters-hold.
var (
	defaultWaitersK = []int{1, 4, 16}
	defaultWaitersP = []int{1, 2, 4, 8}
)

const defaultWaitersHold = time.Second

// Default change durations, from real snapd on the CI machine type:
//
//   - a simple daemon's start: 31.9–53.2 ms (testdata/snapd-golden/2.57.6
//     and 2.77.1/change-start-alpha-done.json: 34.5 and 31.9 ms;
//     integration/testdata/captured/2.57.6 and 2.68.3/change-start-alpha.json:
//     53.2 and 38.9 ms);
//   - its stop: 27.0–100.5 ms, median 37 ms (captured 2.57.6 and 2.68.3
//     change-stop-alpha.json: 27.0, 36.1 ms; golden 2.77.1 and 2.57.6
//     change-stop-alpha-done.json: 39.1, 100.5 ms); a restart is a stop and
//     a start (a reload-or-restart measured 37–109 ms);
//   - the foreign changes, 30 ms to 3 s: a fast service-control change
//     (start or stop of alpha: 27–53 ms), a slower one (stop of alpha on
//     2.57.6: 100.5 ms; reload-or-restart 83–109 ms), a stop --disable or
//     start --enable (128–260 ms), a configure hook sleeping 1 s (the
//     hook's time plus ~60 ms: change-cfg6-done.json took 6.06 s for a
//     6 s hook on 2.68.3, 6.12 s on 2.77.1) and the harness's slow stop of
//     gamma (3.08 s: captured change-stop-gamma-done.json, SLOW_SECONDS=3,
//     integration/README.md);
//   - bootstrap's configure-snap hold of 2 s is issue 12's.
//
// The socket delay of late-socket has no measurement behind it: what the
// scenario measures is the time from the socket's appearance to the
// accepted request, which does not depend on it as long as it is longer
// than the strategies' first pauses.
const (
	defaultStart       = 35 * time.Millisecond
	defaultStop        = 35 * time.Millisecond
	defaultHold        = 2 * time.Second
	defaultSocketDelay = time.Second
)

var defaultDurations = []time.Duration{30 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond, time.Second, 3 * time.Second}

// config is one run of the command.
type config struct {
	scenarios   []string
	strategies  []string
	versions    []fake.Version
	samples     int // per cell of foreign, late-socket and uncontended
	runs        int // per cell of bootstrap and storm
	durations   []time.Duration
	scale       float64
	start, stop time.Duration
	hold        time.Duration
	socketDelay time.Duration
	parallel    int
	waitersK    []int
	waitersP    []int
	waitersHold time.Duration
	stateFile   bool
	json        bool
	markdown    bool
	wide        bool
	quick       bool
}

// restart is how long a restart of an active service takes on the fake.
func (c config) restart() time.Duration { return c.start + c.stop }

// versionNames maps the short forms the flag takes to the fake's profiles.
var versionNames = map[string]fake.Version{
	"2.57": fake.Version257, "2.62": fake.Version262, "2.68": fake.Version268,
	"2.70": fake.Version270, "2.77": fake.Version277,
}

func parseVersion(s string) (fake.Version, error) {
	if v, ok := versionNames[s]; ok {
		return v, nil
	}
	for _, v := range versionNames {
		if string(v) == s {
			return v, nil
		}
	}
	return "", fmt.Errorf("unknown snapd version %q (want 2.57, 2.62, 2.68, 2.70 or 2.77)", s)
}

// hasNotices reports whether the profile serves notices (>= 2.62).
func hasNotices(v fake.Version) bool { return v != fake.Version257 }

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// flagValues are the command line's values before they are checked.
type flagValues struct {
	scenarios, strategies, versions, waitersK, waitersP, durations string
	samples, runs, parallel                                        int
	scale                                                          float64
	start, stop, hold, socketDelay, waitersHold                    time.Duration
	stateFile, json, markdown, wide, quick                         bool
}

// quickPreset is --quick: the values of the flags not given, for a run of
// about half a minute that still has every scenario, strategy and
// version. Holds are shorter (foreign up to 1 s, bootstrap's 0.5 s, the
// socket 0.3 s late, waiters' blocker 0.3 s), fixed's 5 s pause is divided
// by 100, cells have 3 samples (1 run).
var quickPreset = map[string]string{
	"scale": "100", "samples": "3", "runs": "1", "durations": "30ms,300ms,1s",
	"hold": "500ms", "socket-delay": "300ms", "waiters-hold": "300ms", "waiters-k": "1,16", "waiters-p": "1,8",
}

// newCommand is the command line: flags into c once checked, then work.
func newCommand(c *config, work func() error) *cobra.Command {
	f := &flagValues{}
	cmd := &cobra.Command{
		Use: "bench [flags]",
		Example: `  go run ./cmd/bench --quick
  go run ./cmd/bench --scenario foreign,storm --json`,
		Short: "Compare snapsvc with today's retry strategies on the fake snapd",
		Long: `bench compares snapsvc with the retry strategies callers use today (one
snapctl call, k8sd's fixed 5 s loop, backoff/v4), in real time, each
sample on its own in-process fake snapd, and prints the figures: two
tables that fit 100 columns (outcomes, then requests), or one with every
column (--wide), markdown (--markdown) or JSON (--json). --quick runs
every scenario in about half a minute.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			parsed, err := f.check(cmd.Flags())
			if err != nil {
				return &clistyle.UsageError{Msg: err.Error(), Cmd: "bench"}
			}
			*c = parsed
			return work()
		},
	}
	clistyle.Apply(cmd)
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.scenarios, "scenario", strings.Join(allScenarios, ","), "scenarios to run: "+strings.Join(allScenarios, ", "))
	fs.StringVar(&f.strategies, "strategy", strings.Join(benchkit.Names, ","), "strategies to compare: "+strings.Join(benchkit.Names, ", "))
	fs.StringVar(&f.versions, "snapd-version", "2.57,2.77", "snapd versions the fake imitates (2.57: no notices; 2.62+: notices)")
	fs.BoolVar(&f.quick, "quick", false, "a run of about half a minute: "+presetText())
	fs.IntVar(&f.samples, "samples", 20, "samples per cell of foreign, late-socket and uncontended")
	fs.IntVar(&f.runs, "runs", 5, "runs per cell of bootstrap, storm and waiters")
	fs.StringVar(&f.durations, "durations", joinDurations(defaultDurations), "how long the foreign change holds the snap in foreign")
	fs.Float64Var(&f.scale, "scale", 1, "divide the fixed loop's 5 s pause by this (1: the real pause)")
	fs.DurationVar(&f.start, "start", defaultStart, "how long a service's start takes")
	fs.DurationVar(&f.stop, "stop", defaultStop, "how long a service's stop takes")
	fs.DurationVar(&f.hold, "hold", defaultHold, "how long bootstrap's foreign configure-snap change holds the snap")
	fs.DurationVar(&f.socketDelay, "socket-delay", defaultSocketDelay, "how long after the caller started snapd's socket appears (late-socket)")
	fs.StringVar(&f.waitersK, "waiters-k", joinInts(defaultWaitersK), "waiters: callers per process")
	fs.StringVar(&f.waitersP, "waiters-p", joinInts(defaultWaitersP), "waiters: processes (separate Clients, each with a lock registry of its own)")
	fs.DurationVar(&f.waitersHold, "waiters-hold", defaultWaitersHold, "waiters: how long the foreign change holds the snap")
	fs.IntVar(&f.parallel, "parallel", 8, "samples run at the same time, each on its own fake")
	fs.BoolVar(&f.stateFile, "state-file", true, "let snapsvc watch snapd's state file, as it does by default on a host (false: polling alone without notices)")
	fs.BoolVar(&f.wide, "wide", false, "print one table with every column (wider than 100 columns)")
	fs.BoolVar(&f.markdown, "markdown", false, "print the table as markdown (every column)")
	fs.BoolVar(&f.json, "json", false, "print one JSON document instead of the tables")
	return cmd
}

// presetText lists --quick's values.
func presetText() string {
	var parts []string
	for _, name := range []string{"scale", "samples", "runs", "durations", "hold", "socket-delay", "waiters-hold", "waiters-k", "waiters-p"} {
		parts = append(parts, "--"+name+"="+quickPreset[name])
	}
	return strings.Join(parts, " ") + ", unless given"
}

// parseFlags reads a command line (without running it); errors are usage
// errors.
func parseFlags(args []string) (config, error) {
	var c config
	cmd := newCommand(&c, func() error { return nil })
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	_, err := cmd.ExecuteC()
	return c, err
}

// check turns the flags' values into a config, --quick's preset applied to
// the flags not given.
func (f *flagValues) check(fs *pflag.FlagSet) (config, error) {
	if f.quick {
		for name, value := range quickPreset {
			if !fs.Changed(name) {
				if err := fs.Set(name, value); err != nil {
					return config{}, err
				}
			}
		}
	}
	c := config{
		samples: f.samples, runs: f.runs, scale: f.scale, start: f.start, stop: f.stop, hold: f.hold,
		socketDelay: f.socketDelay, waitersHold: f.waitersHold, parallel: f.parallel, stateFile: f.stateFile,
		json: f.json, markdown: f.markdown, wide: f.wide, quick: f.quick,
	}
	for _, s := range splitList(f.scenarios) {
		if !slices.Contains(allScenarios, s) {
			return config{}, fmt.Errorf("unknown scenario %q (want %s)", s, strings.Join(allScenarios, ", "))
		}
		if !slices.Contains(c.scenarios, s) {
			c.scenarios = append(c.scenarios, s)
		}
	}
	for _, s := range splitList(f.strategies) {
		if !slices.Contains(benchkit.Names, s) {
			return config{}, fmt.Errorf("unknown strategy %q (want %s)", s, strings.Join(benchkit.Names, ", "))
		}
		if !slices.Contains(c.strategies, s) {
			c.strategies = append(c.strategies, s)
		}
	}
	for _, s := range splitList(f.versions) {
		v, err := parseVersion(s)
		if err != nil {
			return config{}, err
		}
		if !slices.Contains(c.versions, v) {
			c.versions = append(c.versions, v)
		}
	}
	for _, l := range []struct {
		flag string
		in   string
		out  *[]int
	}{{"--waiters-k", f.waitersK, &c.waitersK}, {"--waiters-p", f.waitersP, &c.waitersP}} {
		for _, s := range splitList(l.in) {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return config{}, fmt.Errorf("bad count %q in %s", s, l.flag)
			}
			*l.out = append(*l.out, n)
		}
		if len(*l.out) == 0 && slices.ContainsFunc(c.scenarios, isWaiters) {
			return config{}, fmt.Errorf("%s needs at least one count", l.flag)
		}
	}
	for _, s := range splitList(f.durations) {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return config{}, fmt.Errorf("bad duration %q in --durations", s)
		}
		c.durations = append(c.durations, d)
	}
	switch {
	case len(c.scenarios) == 0 || len(c.strategies) == 0 || len(c.versions) == 0:
		return config{}, errors.New("--scenario, --strategy and --snapd-version each need at least one value")
	case slices.Contains(c.scenarios, scForeign) && len(c.durations) == 0:
		return config{}, errors.New("--durations needs at least one duration")
	case c.samples < 1 || c.runs < 1 || c.parallel < 1:
		return config{}, errors.New("--samples, --runs and --parallel must be at least 1")
	case c.scale < 1:
		return config{}, errors.New("--scale must be at least 1")
	case c.start < 0 || c.stop < 0 || c.hold <= 0 || c.socketDelay <= 0 || c.waitersHold <= 0:
		return config{}, errors.New("--start and --stop must not be negative, --hold, --socket-delay and --waiters-hold must be positive")
	case c.json && (c.markdown || c.wide):
		return config{}, errors.New("--json prints no table: it takes no --markdown or --wide")
	}
	return c, nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func joinDurations(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ",")
}

// scaleString prints a scale without useless decimals.
func scaleString(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
