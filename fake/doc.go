// Package fake is a snapd double for tests: a server in your test process
// that speaks snapd's REST API and snapctl on real Unix sockets, with the
// snaps, services and changes you give it, and controls no snapd has (a
// foreign change that holds a snap, failing starts, faults, a manual
// clock). Point the code under test at its socket instead of
// /run/snapd.socket:
//
//	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s",
//		Apps: []fake.App{{Name: "kubelet", Daemon: "simple", Enabled: true}}}))
//	c, _ := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()))
//	_, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
//	st, _ := srv.Service("k8s", "kubelet") // st.Active; also srv.Requests(), srv.Counters()
//
// AllowNonRoot is there because go test runs as you while the code under
// test runs as root in production, and snapd lets only root restart a
// service (see Who may do what).
//
// Fidelity to real snapd is the point: every body the fake serves has the
// shape real snapd serves (testsupport/conformance replays bodies captured from
// snapd 2.57.6 against it), so a client that works against the fake reads a
// real snapd the same way.
//
// # Starting
//
// NewServer starts a fake for a test and closes it in t.Cleanup; New is
// the same without testing.TB (call Close). s.SocketPath() is
// snapd.socket, s.SnapSocketPath() snapd-snap.socket, s.Cookie("k8s") the
// snap's SNAP_COOKIE. Options: WithSnaps, AllowNonRoot, WithVersion
// (Version257, Version262, Version268, Version270, Version277 — the
// default), WithClock (RealClock or a *ManualClock), WithConflictAs409,
// WithDir, WithSnapctlTimeout, WithoutListening,
// WithSnapSocketObserveDenied, WithoutRefreshObserve, WithStateFile,
// WithStoreRevision (what a refresh finds in the store).
//
// # Who may do what
//
// As snapd, the fake reads each caller's uid from the socket (SO_PEERCRED)
// and applies snapd's access rules (daemon/access.go) after the method and
// socket checks. Anyone may read: GET /v2/apps, changes, notices, snaps,
// find, warnings, system-info. Only root may start, stop or restart
// services (POST /v2/apps), abort a change, read the services' logs (GET
// /v2/logs), read or set a snap's configuration (/v2/snaps/{name}/conf),
// acknowledge warnings or ask for snap operations; anyone else gets
// snapd's 401 {"message":"access denied","kind":"login-required"}, which
// the snap client prints as "access denied (try with sudo)". On the snap
// socket snapctl lets anyone run services and get, and refuses the other
// commands to a caller who is not root with 403 "cannot use "restart" with
// uid 1000, try with sudo". The fake has no polkit and no store login: a
// user snapd would let in through either is refused.
//
// go test runs as you: where the code under test runs as root in
// production, pass AllowNonRoot, which lets every caller do what root
// does. Without it a test sees what a user who is not root would meet.
// Request.UID records who called.
//
// # What it serves
//
//   - GET /v2/apps (names, select=service; sorted by snap then app;
//     enabled/active omitted when false; snap-not-found / app-not-found) and
//     POST /v2/apps (start/stop/restart with enable/disable/reload; 202 async
//     "service-control" change with snap-names; one service-control task per
//     snap; services of one request start one at a time in before/after order and
//     stop in name order; a failing start stops the whole batch again in
//     reverse order and, with --enable, disables all of it; conflicts are snapd's 400 without kind, or 409
//     snap-change-conflict with WithConflictAs409). Main socket only.
//     A stop still running 1 s in (on the Clock) logs `Waiting for
//     "snap.S.A.service" to stop.` on its task, as snapd does; a failed
//     systemctl call reads "...: stderr:", a newline and the text (without
//     its trailing newline) from 2.68 on.
//   - GET /v2/changes/{id}, GET /v2/changes (select, for= matching only
//     changes with snap-names: those of /v2/apps and PUT conf, and the
//     changes AddChange and StartHook make of a kind snapd gives them to,
//     such as configure-snap, install-snap, auto-refresh; not snapctl's),
//     POST /v2/changes/{id} {"action":"abort"}.
//     With WithSnapSocketObserveDenied, reads of changes and notices on the
//     snap socket answer 403 login-required: "access denied" before 2.68,
//     "could not determine snap name for pid: ..." from 2.68 on.
//   - POST /v2/snapctl (snap socket only): services, start/stop/restart,
//     get/set/unset (a caller who is not root: services and get only). An ephemeral context (the snap's cookie) creates a
//     change without snap-names (an "exec-command" task, "task ignored",
//     then the service-control task) and answers only when it is ready, or
//     "<action> command is taking too long" after the snapctl timeout (the
//     change continues). A configure/default-configure hook (StartHook)
//     queues the tasks into the hook's change and answers at once; other
//     hooks behave like the ephemeral context but their own change does not
//     conflict. Errors carry the version's prefix ("error running snapctl: "
//     before 2.70, "snapctl: " after). SetSnapctlUnsuccessful makes a command
//     answer snapd's "unsuccessful" result (HTTP 200, exit code). refresh
//     (ctlcmd/refresh.go, hidden): --pending prints the snap's refresh
//     candidate (the fake's store) as YAML; from a gate-auto-refresh hook
//     (StartHook(snap, "gate-auto-refresh"), an auto-refresh change)
//     --hold holds the snap's own auto-refresh (prints "hold: <time
//     left>", read back as "gating-hold") and --proceed lets it go
//     (Hook.RefreshAction); elsewhere snapd's errors.
//   - GET /v2/notices (2.62+, else 404 "not found"): change-update notices
//     (one per change, counting spawn, each status change and ready), types,
//     keys, after (strictly after last-repeated), timeout long-poll that
//     wakes as soon as a matching notice is recorded. GET /v2/notices/{id}.
//   - GET /v2/snaps/{name}/conf (keys=, dotted keys, whole document;
//     missing key 400 option-not-found with value {SnapName, Key}) and
//     PUT (daemon/api_snap_conf.go): a "configure-snap" change with
//     snap-names and one run-hook task "Run configure hook of %q snap"
//     (" if present" for an empty patch) that runs the snap's configure
//     hook for Snap.ConfigureHookDuration on the Clock (or the seconds in
//     the config key Snap.ConfigureHookSleepKey, like the integration
//     snap's hook-sleep; negative: held until Change.Finish) and commits
//     the patch when it ends Done. A snap without "configure" in
//     Snap.Hooks fails a non-empty patch with snapd's `snap %q has no
//     "configure" hook`. While any change holds the snap, PUT answers 409
//     snap-change-conflict {change-kind, snap-name}; /v2/apps answers its
//     400 without kind. snapctl get/set/unset read and write the same
//     configuration. Unknown snap: 404 snap-not-found.
//   - GET /v2/snaps (select=, snaps=, "sources":["local"]) and
//     GET /v2/snaps/{name} (404 snap-not-found "snap not installed"): the
//     fields mapLocal fills for a sideloaded local snap (daemon/snap.go,
//     client/packages.go), apps with daemon fields, per profile ("links"
//     null from 2.62 to 2.68, "grade" from 2.77, "hold" from 2.58 while
//     held). GET /v2/find, which `snap info` also asks, is an empty store:
//     name= 404 snap-not-found "snap not found", a search [].
//   - POST /v2/snaps/{name} (daemon/api_snaps.go postSnap, checked against
//     real 2.57.6, 2.68.3 and 2.77.1: testdata/refresh): "refresh" to what
//     the fake's store offers (WithStoreRevision, SetStoreRevision) or to
//     a revision a local snap still has: a refresh-snap change with
//     snapd's tasks, which stops the snap's running services
//     (stop-snap-services, with the "Waiting for" log), links the new
//     revision, starts its enabled services (start-snap-services: a
//     FailStart there fails the change and undoes it, the old revision
//     and its services back) and runs the configure hook; snap-local 400
//     for a sideloaded snap the store does not know,
//     snap-no-update-available 400 when nothing is newer (no change),
//     409 snap-change-conflict. "hold"/"unhold" (2.58+; 2.57.6: "unknown
//     action hold"): a Done change without tasks, read back as "hold" in
//     GET /v2/snaps/{name}; never a conflict. Other actions (install,
//     remove, ...) are refused with a 400 saying so.
//   - POST /v2/snaps multipart (sideloadOrTrySnap): a local file over the
//     installed snap, as `snap install --dangerous FILE`: an install-snap
//     change with the refresh's tasks and a new local revision (x2, x3,
//     ...). The file is read as meta/snap.yaml or a one-snap snaps file;
//     a real squashfs gives its name and version through its file name
//     (NAME_VERSION_ARCH.snap). Without dangerous: snapd's "cannot find
//     signatures with metadata for snap ...".
//   - GET /v2/logs (daemon/api_apps.go getLogs: names=, n= default 10,
//     negative for all, follow=): an application/json-seq stream of
//     client.Log records ("\x1e{...}\n") from the services' journal: the
//     lines systemd logs as the fake starts and stops them (Started,
//     Stopping, Deactivated successfully, Stopped, Failed to start; systemd
//     252's wording) and lines added with AppendLog. No service at all: 404
//     app-not-found "no matching services".
//   - GET /v2/warnings (select=pending|all) and POST {"action":"okay",
//     "timestamp":T}; while a warning (AddWarning) is pending every
//     non-error answer carries warning-count and warning-timestamp.
//   - GET /v2/system-info per profile: the version string Debian's build
//     reports ("2.57.6-1+deb12u1+b2", "2.68.3-3+deb13u1+b7", "2.77.1-2";
//     other profiles their number), os-release Debian 12 for 2.57 and 13
//     after, "features" from 2.62, "snapd-bin-from" from 2.77, the
//     captured feature lists; no "virtualization" and no refresh hold.
//   - Unknown routes: 404 {"message":"not found"}.
//
// The conflict rule is snapd's CheckChangeConflictMany: any change that is
// not ready and has any task (even a Done one) affecting the snap blocks it;
// a hook's own change is ignored for its snapctl calls; the exclusive kinds
// (remodel, transition-ubuntu-core, ...) block every snap.
//
// # Task runner semantics
//
// As overlord/state: a change's status is derived from its tasks with
// snapd's precedence (Abort, Undoing, Undo, Doing, Do, Wait, Error, Undone,
// Done, Hold; Wait outright when every pending task is blocked behind a
// Wait task). A failing task aborts its change first (pending tasks go to
// Hold, Done ones to Undo, the failing one through Abort) and then ends in
// Error, so a failed change records one more change-update occurrence than a
// successful one. Kinds without an undo handler (service-control,
// exec-command) go from Undo back to Done; test-controlled tasks end Undone.
// POST abort: Do -> Hold, Doing -> Abort, Done -> Undo; an aborted
// service-control task still runs to the end and ends Done.
//
// # Known differences from snapd
//
// Not reproduced, on purpose or for lack of a model (none of them is in the
// captured golden cases, so testsupport/conformance lists none):
//   - Ready changes are never pruned (snapd drops them 24h after they are
//     ready, and aborts changes unready for 7 days); old ids keep answering.
//   - GET /v2/changes lists changes in id order (snapd walks a map).
//   - With several unknown names in GET/POST /v2/apps, snapd reports a
//     random one (map order); the fake the first in request order. Likewise
//     the exec-command summary of a whole-snap snapctl command lists the
//     services in name order (snapd: map order).
//   - Repeated service names are de-duplicated (snapd keeps duplicates in
//     the task data and summaries).
//   - The rollback stops of a failed start and the --disable/--enable
//     systemctl calls take no time; user services (scope, users) are not
//     modelled: scope/users are only validated.
//   - snapctl: only services, start, stop, restart, get, set, unset; no
//     --help text, no "Notes" other than "-".
//   - No polkit and no store login (see Who may do what); with
//     AllowNonRoot every caller is root, user-id filters included.
//   - The caller's uid is not looked up in the passwd database: from 2.63
//     (POST from 2.62) snapd answers /v2/apps from a uid without an entry
//     (a container run with --user N) 400 "cannot retrieve services:
//     user: unknown userid N" ("cannot perform operation on services: ..."
//     for POST).
//   - Snaps cannot be installed new or removed through the API, and a
//     local file goes only over an installed snap. The store holds only
//     what WithStoreRevision/SetStoreRevision put there (one revision per
//     channel; no cohorts, no amend, no epochs, no assertions). Every snap
//     is active, sideloaded-looking (revision x1 unless set, no
//     publisher) with installed-size 4096 and its install date when the
//     Server learnt of it (or of its last refresh). Refresh hooks
//     (pre-refresh, post-refresh, health check) take no time; the
//     configure hook runs as for PUT conf. snapd's refresh.retain is 2.
//     The "time" of an RFC3339 hold is kept to the second given; holds
//     on all snaps (POST /v2/snaps) and gating holds are not modelled.
//   - A failing start in start-snap-services is reported for the failing
//     unit alone ("systemctl command [start snap.S.A.service] ..."), as
//     service-control reports it; real snapd's text there is not captured.
//   - A configure hook started by PUT conf has no cookie of its own, so
//     snapctl from inside it cannot be scripted (StartHook can).
//   - /v2/logs has no injected faults or latency, and reads no real
//     journal: only the modelled lines.
//
// # Time
//
// All timestamps and durations use the Clock. With a *ManualClock
// (NewManualClock) nothing moves until the test calls Advance,
// AdvanceToNext, or Server.AdvanceUntilReady / AdvanceUntilIdle; with
// RealClock, App.StartDuration/StopDuration make changes take real time.
// Request times (Request.Time/Done) and change ready times come from the
// same clock, so tests can assert e.g. that a retry arrived within 20ms of a
// foreign change becoming ready.
//
// # Faults
//
//   - AddChange(ChangeSpec{Kind: "configure-snap", Snap: "k8s"}) blocks the
//     snap until Change.Finish or Change.Fail (Change.Next walks a
//     multi-task change one task at a time); StartHook runs a hook.
//   - App.FailStart / SetFailStart make a start fail like systemctl;
//     App.DiesAfterStart makes a service whose start succeeds but which is
//     inactive right after (a refreshed service that never becomes
//     ready). A StoreRevision's Apps give a refresh's new revision such
//     services.
//   - InjectFault(Fault{Kind, Method, Path, Socket, Match, Times}) breaks
//     the answers of matching requests: FaultDrop (handled, then no
//     answer), FaultCut (handled, body cut short), FaultGarble (handled,
//     answered with a body that is not an envelope), FaultReject (not
//     handled, no answer), FaultWedge (a wedged snapd: nothing until
//     Hold is closed, for good without one, then handled and answered)
//     and FaultReply (not handled, a canned status
//     and body such as ErrorBody(500, "", "request canceled") or an
//     instant empty notices list, SyncBody([]any{})). Request.Fault
//     records which applied. DropNextResponse(method, path) is the
//     one-shot FaultDrop; DropConnections cuts every open connection.
//   - BeginMaintenance/EndMaintenance add/remove "maintenance";
//     StopListening/StartListening remove/re-create the socket files (a
//     daemon restart: maintenance, socket gone, back; RestartDaemon(down)
//     does the whole sequence on the clock); WithoutListening for a socket
//     that appears late.
//   - SetLatency delays every answer (on the fake's clock).
//   - AddWarning adds a snapd warning; AppendLog a journal line.
//
// # Outside Go
//
// ControlHandler serves the test controls as a JSON HTTP API (fakesnapd,
// cmd/fakesnapd, serves it on D/control.socket). SnapFromYAML and
// SnapFromDir build a Snap from a snap.yaml; ParseSnaps reads a small
// YAML/JSON snaps file with durations and failing starts.
//
// # Introspection
//
// Requests (log with clock timestamps, socket, status, error kind/message,
// change id), Counters (requests per "METHOD /path", conflicts answered,
// changes created), Service, ChangeByID, Changes, Change, WaitFor, WaitIdle,
// ChangeReady, Config; AdvanceUntilReady / AdvanceUntilIdle drive a
// ManualClock until a change (or everything) is ready.
//
// # For contributors: where things are
//
// The model (what snapd does): state.go (changes, tasks, statuses,
// notices, the conflict rule), engine.go (service-control tasks and their
// systemctl steps), options.go (snaps, apps, version profiles, options).
//
// The routes (what snapd serves), one file per family as in snapd's
// daemon/api_*.go: api_apps.go, api_changes.go, api_conf.go (with the
// configuration model, config.go), api_logs.go, api_notices.go,
// api_snapctl.go, api_snaps.go, api_system.go, api_warnings.go;
// snapyaml.go and snapsfile.go read snap descriptions; router.go
// dispatches the routes, writes the envelopes and applies injected
// faults; access.go reads the caller's uid and applies snapd's access
// rules; server.go is the Server's lifecycle (New, listening, Close) and
// clock.go its Clock.
//
// Test controls (what no snapd has; a test or a user of the fake drives
// the double with them): control_changes.go (AddChange, Change, StartHook),
// control_faults.go (InjectFault), control_restart.go (maintenance,
// RestartDaemon, latency, dropped connections), control_state.go
// (SetFailStart, SetService, AddWarning, AppendLog, ...), control_http.go
// (ControlHandler, the controls over HTTP), control_wait.go (WaitFor,
// View, WaitIdle, AdvanceUntil*), introspect.go (Requests, Counters, Service,
// ChangeByID, ...) and clock_manual.go (ManualClock).
package fake
