// Package snapservices gives a snap's own code the service interface of
// k8sd (Canonical Kubernetes' daemon), on top of snapsvc.Client:
//
//	StartServices(ctx, services []string, extraSnapArgs ...string) error
//	StopServices(ctx, services []string, extraSnapArgs ...string) error
//	RestartServices(ctx, services []string, extraSnapArgs ...string) error
//
// A Snap is a handle for one snap, and keeps k8sd's contract for names
// (pkg/snap/service.go): a service is named bare ("kubelet") or prefixed
// with the instance ("k8s.kubelet"), both meaning "<instance>.<app>", and
// the instance name alone ("k8s") means every service of the snap. The
// instance comes from WithInstance, then $SNAP_INSTANCE_NAME, $SNAP_NAME,
// then WithDefaultInstance (k8sd's unit tests run with none of them set).
// A name of another snap ("etcd.etcd") fails with snapsvc.ErrWrongSnap and
// a malformed one with snapsvc.ErrInvalidName, before any request: a bare
// name always means a service of this snap, never another snap (passing
// "kubelet" to snapsvc.Client directly addresses a snap named kubelet).
//
// StartServices also enables and StopServices also disables, as k8sd's
// implementation always passes "--enable" and "--disable" (ImplyFlags);
// WithPlainFlags gives the flags the snap command's own meaning instead.
//
// New returns setup errors (no instance name, say); Open, for callers
// that cannot handle one where they build the handle, keeps the error and
// returns it from every call, wrapping ErrSetup.
//
// extraSnapArgs are the snap command's flags, spelled as it spells them
// (cmd/snap/cmd_services.go): "--enable" and "--no-wait" for start,
// "--disable" and "--no-wait" for stop, "--reload" and "--no-wait" for
// restart. Any other argument ("--force", a flag of another verb, a
// positional argument) fails with ErrUnknownFlag, and the scope flags
// "--system", "--user" and "--users" with ErrUnsupportedFlag, before any
// request. "--no-wait" returns once snapd has accepted the change (the
// Async forms of snapsvc.Client); the next operation of the process on the
// snap waits for that change first, so no-wait calls in a row do not
// conflict with each other.
//
// # Code written around snapctl
//
// SnapctlStyle sets a handle up for code that runs snapctl today
// (microceph, microovn, microk8s-cluster-agent; docs/ has a recipe for
// each): plain flags, snapsvc's default policy (no retry loop of its
// own), the instance from $SNAP_INSTANCE_NAME or, outside a snap, from the
// names ("microceph.rgw"), and the mode from the snap's confinement in
// $SNAP/meta/snap.yaml: classic → REST, strict or devmode → snapctl, and
// snapctl outside a snap (WithModeFromConfinement, WithSnapDir):
//
//	svc := snapservices.Open(snapservices.SnapctlStyle())
//	err := svc.RestartServices(ctx, []string{"microceph.rgw"}, "--reload")
//	states, err := svc.Services(ctx, []string{"microceph.rgw"}) // snapctl services
//
// # Modes
//
// The default is REST on /run/snapd.socket, the path of the snap command
// that k8sd runs today: it reports change ids, honours "--no-wait", sees
// every change that blocks the snap (to wake as soon as it is ready), and
// needs a classic snap, root, or snapd-control. snapsvc.New's own default
// would pick snapctl in any process of a snap, daemons included, because
// SNAP_COOKIE is set there. WithSnapctl opts in to snapctl, the one path
// of a strictly confined snap and of snap hooks; snapd answers snapctl
// start, stop and restart only once their change is ready
// (overlord/hookstate/ctlcmd), so "--no-wait" is refused there with
// ErrUnsupportedFlag rather than silently waiting, except in a configure
// or default-configure hook, where snapd queues the command and answers
// at once.
//
// # Retries
//
// Callers like k8sd keep their own retry loop around every call,
// RetryFor(ctx, 5, 5*time.Second, ...). A Snap therefore builds its client
// with retry.NestedPolicy, the policy of that loop (Loop.NestedPolicy):
// conflicts are absorbed for the loop's whole bound, 25 s, and a missing
// socket for one delay, 5 s, not snapsvc's 5 minutes and 30 s. Replace the
// loop itself with retry.Do, whose attempts start 5 s apart from start to
// start and which starts none after 25 s, so the two share that bound: a
// blocker that never ends, or a socket that stays missing, ends the loop
// after about 25 s, as the snap command's failures did (a kept RetryFor
// pauses 5 s after each attempt whatever it waited: 5 × 30 s). retry.Do
// also keeps RetryFor's useful retries (a failed change is tried again)
// and stops at once when retrying cannot help (bad input) or must not
// happen (an outcome that is unknown). Every error is the client's
// *snapsvc.OpError (Retryable, ChangeID, snapd's text), returned as is.
//
// # Logs
//
// Each action writes one line, where the snap command printed "Started."
// or its error, to the call's logger, the logr.Logger in its context
// (k8sd's), snapsvc.ContextWithLogger's, or WithLogger's: at Info when it
// is done, with the services, the change, the conflicts waited out (one
// per blocking change), the requests it took when more than one, and the
// time taken; at Warn when it failed or gave up, with the error (logr has
// no warning level: both are V(0) there, and its slog bridge hands a Warn
// to a slog handler as one, so k8sd's klog writes it as a W line). The client's own steps go to
// the same logger one level lower. WithLogLines hands the lines, with
// their level, to a logger that takes text (lxd's shared/logger, the log
// package).
//
// # Giving up
//
// A call gives up when its caller needs it to: WithGiveUp(d) bounds each
// call's wait for others' changes (and for an unreachable snapd) to d, for
// callers that answer someone (an HTTP handler, a hook); WithGiveUp(0)
// makes one attempt per call, for code inside a retry loop that pauses
// after every failure itself (k8sd's RetryFor), so the loop gives up when
// it did before. The recipes in docs/ say which each adopter needs.
//
// # Refresh
//
// Refresh and RefreshStatus are k8sd's snap.Refresh and snap.RefreshStatus
// (RefreshOpts: a channel or revision, with --amend, or a local file,
// with --classic --dangerous): Refresh returns the refresh's change id
// once snapd accepted it, after waiting out a change that holds the snap
// (snap refresh --no-wait failed on it), and never sends a local file
// twice after a lost answer; "" when snapd has no update. Under a restart
// budget (WithClientOptions(snapsvc.WithRestartBudget(...))) the refresh
// holds its slots until the snap's services are ready again (see
// snapsvc.Client.Refresh and docs/refresh.md). In snapctl mode it fails
// with snapsvc.ErrRefreshInSnapctl, as k8sd refuses a refresh on a
// strictly confined deployment.
//
// # Tests
//
// Package snapservicestest has a Recorder that implements Control in
// memory, for unit tests of callers; package fake serves a snapd for
// integration tests, and cmd/fakesnapd the same on a socket, which any
// handle reaches through WithSocket (WithSnapSocket in snapctl mode), or
// without code through $SNAPPY_GLOBAL_ROOT or $SNAPSVC_SOCKET (see
// snapsvc.EnvRoot). Tests that assert command lines
// keep doing so through WithCommandRunner: the handle hands the runner
// the line in its mode, as its callers wrote it ("snap start k8s.kubelet
// --enable" for k8sd, "snapctl restart --reload microceph.rgw" in snapctl
// mode; Request.CommandFor) instead of acting through snapd;
// WithCommandOutput also serves Services and WithEnsureRunning from the
// runner's output. Recorder.Run and Recorder.Output are such runners, and
// the Recorder checks the lines it gets are its mode's (Snapctl).
package snapservices
