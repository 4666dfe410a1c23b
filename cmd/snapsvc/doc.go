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
//
// Global flags (before or after the command):
//
//	--socket PATH   snapd's socket (default $SNAPSVC_SOCKET, else /run/snapd.socket)
//	--json          print results as JSON on stdout
//	--timeout D     give up after D (e.g. 30s; default: no limit beyond the
//	                library's retry policy, 5m of conflict retries)
//	-v              log what the library does (slog text on stderr)
//
// Inside a snap (SNAP_COOKIE set) the library acts through snapctl on the
// snap socket, and only on the snap's own services.
//
// On a terminal, long waits show on stderr which change and task snapd is
// working on; otherwise only the result is printed, one plain line per item.
//
// # Exit codes
//
//	0    success
//	1    the operation failed: a change ended in Error/Undone/Hold, or snapd
//	     refused the request
//	2    usage error: unknown command or flag, missing or malformed name
//	     (names are checked before any request)
//	3    timed out (--timeout), gave up retrying a conflict (the library's
//	     policy ran out), or snapd is unreachable or restarting (the
//	     message names the socket): retrying later may help
//	4    not found: unknown snap, service or change
//	130  interrupted (SIGINT/SIGTERM); watch exits 0 when interrupted
//
// # JSON output
//
// With --json, stdout carries exactly one JSON document: the command's
// result, or, when it fails for any reason (usage errors included, wherever
// --json is on the command line), an error object instead:
//
//	{"error":{"message":...,"exit-code":N,"change":ID,"status":S,
//	          "retryable":bool,"detail":...}}
//
// change, status, retryable and detail appear when known; detail is what
// the command found before failing (wait: the change, with its tasks and
// error; demo: its report). The message is printed on stderr too. watch
// --json prints JSON lines, one event per line, and a failure as a last
// {"error":...} line. Help (-h, help) is always text.
//
// # Watching
//
// watch reads GET /v2/changes and prints what changed. Where snapd has
// notices (2.62 and later) it wakes as soon as a change is spawned or
// changes status, through a notices long-poll; it also reads again every
// --interval (default 500ms) for task progress and log lines, which have
// no notices. Before 2.62 it polls at --interval.
package main
