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
// Callers like k8sd keep their own retry loop around every call. A Snap
// therefore builds its client with retry.NestedPolicy (conflicts absorbed
// for up to 30 s), not snapsvc's 5-minute default; replace the loop itself
// with retry.Do, which keeps RetryFor's useful retries (a failed change is
// tried again) and stops at once when retrying cannot help (bad input) or
// must not happen (an outcome that is unknown). Every
// error is the client's *snapsvc.OpError (Retryable, ChangeID, snapd's
// text), returned as is.
//
// # Tests
//
// Package snapservicestest has a Recorder that implements Control in
// memory, for unit tests of callers; package fake serves a snapd for
// integration tests. Tests that assert the snap command line (k8sd's, with
// its mock.Runner) keep doing so through WithCommandRunner: the handle
// hands the runner the line k8sd built ("snap start k8s.kubelet --enable")
// instead of acting through snapd; Recorder.Run is such a runner.
package snapservices
