// Command snapsvc shows and controls a snap's services through snapd, with
// the same conflict handling as the snapsvc library: when another change
// holds the snap (a "snap set", a refresh, another service command), it
// waits for that change and tries again instead of failing.
//
// Usage:
//
//	snapsvc [global flags] COMMAND [flags] [ARGS]
//
// Commands:
//
//	status [NAME...]            services (of snaps or "snap.app" names, or all)
//	                            and the changes in progress that hold their snaps
//	start [--enable] [--no-wait] NAME...
//	stop [--disable] [--no-wait] NAME...
//	restart [--reload] [--no-wait] NAME...
//	                            act on services and wait for snapd's change;
//	                            --no-wait prints the change id once snapd
//	                            accepted the request (after any conflict),
//	                            with the attempts, conflicts and changes
//	                            waited for until then
//	changes [--all] [SNAP]      changes in progress (--all: also finished ones),
//	                            optionally only those touching SNAP
//	change ID                   one change: its tasks, their status and log
//	wait ID                     wait until change ID is ready
//	wait-idle SNAP              wait until no change holds SNAP
//	watch [--interval D] [--until-idle] [SNAP]
//	                            follow changes and their tasks as they happen
//	demo [--scale F]            run a self-contained demonstration against an
//	                            in-process fake snapd (no snapd needed): k8sd's
//	                            bootstrap code (a plain REST client, not a
//	                            snap hook) and a controller race while a
//	                            foreign change holds the snap; it checks its
//	                            own outcome (exit 1 if wrong). Under --json
//	                            its "at" and "elapsed" are seconds (numbers)
//	version                     snapsvc's module version (from the binary's
//	                            build information) and, when snapd answers
//	                            within 5s, snapd's; exit 0 either way
//	help [COMMAND]              the usage, or a command's, on stdout
//
// "COMMAND -h" prints the command's usage on stderr: its own flags with
// their defaults, then the global flags.
//
// Global flags (before or after the command):
//
//	--socket PATH    snapd's socket (default $SNAPSVC_SOCKET, else /run/snapd.socket)
//	--json           print the result, or the error, as JSON on stdout
//	--timeout D      give up after D (e.g. 30s; default 0: no limit beyond
//	                 the library's retry policy, 5m of conflict retries)
//	--wait-snapd D   how long to keep trying while snapd is unreachable: its
//	                 socket missing, nobody listening, a path that is not a
//	                 socket (default 30s; 0: give up at the first failed
//	                 connection). start, stop and restart keep trying to
//	                 reach snapd this long, and a wait for a change keeps
//	                 waiting through an outage this long; the other reads
//	                 fail at once when snapd is unreachable, and watch
//	                 rides out outages until it ends
//	-v               log what the library does (slog text on stderr)
//	--version        the same as the version command (before the command only)
//
// Durations are Go durations (30s, 5m, 1h30m), never negative; a value that
// is not one is a usage error saying why.
//
// Inside a snap (SNAP_COOKIE set) the library acts through snapctl on the
// snap socket, and only on the snap's own services.
//
// On a terminal, long waits show on stderr which change and task snapd is
// working on; otherwise only the result is printed, one plain line per item.
// Whatever stderr is, a command that keeps trying (start, stop, restart, a
// wait for a change) says there at once when it cannot reach snapd (which
// socket, why, and until when it keeps trying) and when snapd answers
// again.
//
// # Exit codes
//
//	0    success
//	1    the operation failed: a change ended in Error/Undone/Hold, or snapd
//	     refused the request
//	2    usage error: unknown command or flag, missing or malformed name or
//	     value (everything on the command line is checked before any request)
//	3    nothing was done and retrying later may help: timed out (--timeout)
//	     or gave up (the library's policy ran out) while waiting for another
//	     change or for snapd; snapd is unreachable or restarting (the
//	     message names the socket); a read or a wait (wait, wait-idle,
//	     watch) ended early, which is always safe to run again
//	4    not found: unknown snap, service or change (wait-idle: a snap snapd
//	     does not know and no change in progress touches)
//	5    the request was, or may have been, carried out, but its outcome is
//	     not known: --timeout ended the wait for its change, snapd stayed
//	     unreachable while it waited, or snapd's answer was lost and the
//	     change could not be found. Running the command again would act
//	     again (a second restart): the message names the change when there
//	     is one, for "snapsvc wait ID"
//	130  interrupted (SIGINT/SIGTERM); watch exits 0 when interrupted
//
// # JSON output
//
// With --json, every command but watch prints exactly one JSON document on
// stdout: the command's result, or, when it fails for any reason (usage
// errors included, wherever --json is on the command line), an error
// object instead:
//
//	{"error":{"message":...,"exit-code":N,"change":ID,"status":S,
//	          "retryable":bool,"detail":...}}
//
// retryable is always there and agrees with the exit code: true exactly
// when running the same command again later may succeed (exit 3; an
// interrupted command, exit 130, says which it would have been). change,
// status and detail appear when known; detail is what the command found
// before failing (wait: the change, with its tasks and error; demo: its
// report). The message is printed on stderr too.
//
// watch --json prints JSON Lines (https://jsonlines.org): one JSON object
// per line, one line per event, and a failure as a last {"error":...}
// line. Help (-h, help) is always text.
//
// # Watching
//
// watch reads GET /v2/changes and prints what changed. Where snapd has
// notices (2.62 and later) it wakes as soon as a change is spawned or
// changes status, through a notices long-poll; it also reads again every
// --interval (default 500ms) for task progress and log lines, which have
// no notices. Before 2.62 it polls at --interval.
package main
