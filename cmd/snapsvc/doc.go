// Command snapsvc shows and controls a snap's services through snapd, with
// the same conflict handling as the snapsvc library: when another change
// holds the snap (a "snap set", a refresh, another service command), it
// waits for that change and tries again instead of failing.
//
// Its commands, flags and outputs follow the snap command's where they
// overlap; what it adds has names snap does not use:
//
//	services [SNAP|SNAP.APP...]             as snap services
//	logs [-n=N|all] [-f] [--abs-time] NAME...
//	                                        as snap logs, the same lines
//	start [--enable] [--no-wait] NAME...    as snap start: "Started."
//	stop [--disable] [--no-wait] NAME...    as snap stop: "Stopped."
//	restart [--reload] [--no-wait] NAME...  as snap restart: "Restarted.";
//	                                        --no-wait prints the change id alone
//	refresh [--channel C|--revision R] [--amend] [--classic] [--no-wait] SNAP [FILE]
//	                                        as snap refresh (a FILE as snap
//	                                        install --dangerous): "NAME VERSION
//	                                        refreshed", or no updates available
//	refresh --hold[=D] [--hold-level L] SNAP, refresh --unhold SNAP
//	                                        as snap refresh --hold/--unhold
//	changes [--abs-time] [--in-progress] [SNAP]
//	                                        as snap changes: every change snapd
//	                                        keeps, ID Status Spawn Ready Summary
//	tasks ID, change ID [--abs-time]        as snap tasks: a change's tasks and logs
//	watch ID                                as snap watch: wait for the change
//	abort ID                                as snap abort
//	                                        (tasks, change, watch and abort also
//	                                        take --last=KIND instead of ID: the
//	                                        latest change of that kind, as snap)
//	version                                 snapsvc's build and snapd's version
//	status [NAME...]                        services and the changes in progress
//	                                        that hold their snaps
//	wait-idle SNAP                          wait until no change holds SNAP
//	follow [--interval D] [--until-idle] [SNAP]
//	                                        print changes, tasks and logs as they
//	                                        happen
//	demo [--scale F]                        a self-contained demonstration
//	                                        against an in-process fake snapd
//	completion bash|zsh|fish                the shell completion script
//	help [COMMAND]                          help, on stdout (also --help, -h,
//	                                        and snapsvc alone, as snap)
//
// Deprecated until v0.3.0, with a notice on stderr: "wait ID" (use watch
// ID; snap's wait is "snap wait SNAP KEY"), "watch [SNAP]" without a change
// id (use follow [SNAP]), "changes --all" (every change is listed now).
//
// Global flags (before or after the command):
//
//	--socket PATH    snapd's socket (default $SNAPSVC_SOCKET, else /run/snapd.socket)
//	--json           print the result, or the error, as JSON on stdout
//	--timeout D      give up after D (e.g. 30s; default 0: no limit beyond
//	                 the library's retry policy, 5m of conflict retries)
//	--wait-snapd D   how long every command keeps trying while snapd is
//	                 unreachable or restarting: its socket missing, nobody
//	                 listening (default 30s; 0: give up at the first failed
//	                 connection). A path that is not a socket, or one the
//	                 user may not connect to, fails at once (exit 1)
//	-v, --verbose    log what the library does on stderr (slog), and add
//	                 the library's whole error to an error ("detail: ")
//	--log-format F   -v's log: text (slog's key=value lines, the default)
//	                 or json (one JSON object per line)
//	--version        this build's version (debug.ReadBuildInfo)
//
// Durations are Go durations (30s, 5m, 1h30m), never negative; a value that
// is not one is a usage error saying why. Flags are GNU-style, as pflag
// reads them; a command's own flags may come before its name too, as the
// global ones may ("snapsvc --no-wait restart k8s").
//
// Inside a snap (SNAP_COOKIE set) the library acts through snapctl on the
// snap socket, and only on the snap's own services.
//
// # Progress and interruption
//
// While a command waits, for another change that holds the snap or for its
// own, a terminal on stderr shows one self-erasing line as wide as the
// terminal, the change's id and kind and the time waited first, and once
// done what was waited out. Off a terminal it prints nothing but its
// result, as snap does, unless -v: then, beside the library's log, a line
// when a wait starts and one every 5 seconds ("still waiting for change 42
// (configure-snap) ..., 10s"). With --no-wait no progress is printed at
// all. Whatever stderr is, a command says at once when it cannot reach
// snapd (which socket, why, until when it keeps trying) and when snapd
// answers again.
//
// Ctrl-C (SIGINT) or SIGTERM stops the waiting, not the change (snap
// aborts it): exit 130 (SIGTERM: 143) with the change's id, "snapsvc
// watch ID" to wait again and "snapsvc abort ID" to stop it. logs -f ends
// so too, silently, as snap logs -f does (a shell shows snap, which the
// signal kills, with the same 130 or 143).
//
// # Errors
//
// An error is printed once on stderr after "error: ", each fact once: what
// failed (the command and its services) and why. A change that failed
// prints snapd's own text as snap does: a short message, then each failed
// task on a line of its own. A second line may follow, for a person: that
// trying again later may help (exit 3: "Trying again later may help.", or
// "Trying again once change 5 is done may help: 'snapsvc watch 5' waits
// for it."), or how to wait for a change that may still run. -v adds the
// library's whole error on a "detail:" line; --json has it as "cause".
// Under --json the error is the JSON document on stdout, and only there:
// stderr gets no "error: " line (what is said while the command runs, such
// as a snapd it cannot reach, and -v's log stay on stderr).
//
// # Exit codes
//
//	0    success
//	1    the operation failed: a change ended in Error/Undone/Hold, snapd
//	     refused the request, or snapd is not installed (no socket and
//	     nothing that would create it: snapsvc.ErrSnapdNotInstalled)
//	2    usage error: unknown command or flag, missing or malformed name or
//	     value (everything on the command line is checked before any request)
//	3    nothing was done and retrying later may help: timed out (--timeout)
//	     or gave up (the library's policy ran out) while waiting for another
//	     change or for snapd; snapd is unreachable or restarting (the
//	     message names the socket); a read or a wait (watch, wait-idle,
//	     follow) ended early, which is always safe to run again
//	4    not found: unknown snap, service or change (wait-idle: a snap snapd
//	     does not know and no change in progress touches)
//	5    the request was, or may have been, carried out, but its outcome is
//	     not known: --timeout ended the wait for its change, snapd stayed
//	     unreachable while it waited, or snapd's answer was lost and the
//	     change could not be found. Running the command again would act
//	     again (a second restart): the message names the change when there
//	     is one, for "snapsvc watch ID"
//	130  interrupted (SIGINT, Ctrl-C), follow, watch and logs -f included
//	143  terminated (SIGTERM): as 130
//
// # JSON output
//
// With --json, every command but follow prints exactly one JSON document
// on stdout: the command's result, or, when it fails for any reason (usage
// errors included, wherever --json is on the command line), an error
// object instead:
//
//	{"error":{"message":...,"exit-code":N,"change":ID,"status":S,
//	          "kind":K,"cause":...,"retryable":bool,"detail":...}}
//
// retryable is always there and agrees with the exit code: true exactly
// when running the same command again later may succeed (exit 3; an
// interrupted command, exit 130 or 143, says which it would have been). change,
// status, kind (snapd's error kind, e.g. "app-not-found") and detail
// appear when known; detail is what the command found before failing
// (watch: the change, with its tasks and error; demo: its report). The
// message is what stderr says without --json, on one line; cause is the
// library's whole error, every layer's words, without what a layer
// repeats of the one it wraps (the socket and the request are named
// once). Nothing is printed on stderr for the error: a program reads the
// one document on stdout and the exit code.
//
// follow --json prints JSON Lines (https://jsonlines.org): one JSON object
// per line, one line per event, and a failure as a last {"error":...}
// line. Help is always text.
//
// # Following
//
// follow reads GET /v2/changes and prints what changed. Where snapd has
// notices (2.62 and later) it wakes as soon as a change is spawned or
// changes status, through a notices long-poll; it also reads again every
// --interval (default 500ms) for task progress and log lines, which have
// no notices. Before 2.62 it polls at --interval.
//
// # Completion and manual
//
// "snapsvc completion bash|zsh|fish" prints the completion script (service
// names, change ids and --last's kinds are completed from snapd). The man
// pages, a page per command, come from the same definitions as the help;
// a build with the manpages tag writes them ("go run -tags manpages
// ./cmd/snapsvc man DIR": the generator, cobra/doc and go-md2man, is not
// linked into the shipped binary). The .deb packages install both.
package main
