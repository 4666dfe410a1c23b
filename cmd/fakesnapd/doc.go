// Command fakesnapd serves the fake snapd (package fake) on Unix sockets
// from the command line, so that tools not written in Go — the real snap
// client, curl, the snapsvc CLI, a shell script — can be tried against it.
//
//	fakesnapd (--dir D | --root R) [--snapd-version 2.57|2.62|2.68|2.70|2.77] [--snaps FILE | --snap-yaml FILE...] [--no-refresh-observe] [--allow-non-root] [--json]
//
// It serves D/snapd.socket (the REST API), D/snapd-snap.socket (snapctl)
// and D/control.socket (the control API, fake.Server.ControlHandler).
// --root R puts them in R/run/, where the real snap client looks when
// SNAPPY_GLOBAL_ROOT=R. Without --snaps or --snap-yaml it serves a
// Kubernetes-like snap "k8s" (k8s-snap.yaml: containerd, etcd, k8sd,
// kube-apiserver, kube-controller-manager, kube-proxy, kube-scheduler,
// kubelet, k8s-apiserver-proxy; only k8sd enabled and active, as after an
// install), whose starts take 300ms, stops 200ms and configure hook 2s.
// --snaps reads a YAML or JSON snaps file (fake.ParseSnaps), --snap-yaml a
// snap.yaml or an unpacked snap directory (fake.SnapFromYAML,
// fake.SnapFromDir). It prints what listens and how to use it (--json: one
// JSON line, Announcement), and exits 0 on SIGINT or SIGTERM after
// removing its sockets. The fake runs on the real clock. As snapd, it
// refuses a user who is not root what snapd lets only root do (start,
// stop, restart, logs, configuration: "access denied", which snap prints
// as "access denied (try with sudo)"); --allow-non-root lets such a user
// through (fake.AllowNonRoot).
//
//	fakesnapd ctl (--dir D | --root R) COMMAND [ARGS]
//
// talks to the control socket: hold KIND SNAP (a foreign change; prints
// its id), finish/fail/next/abort ID, maintenance on|off, restart [DOWN],
// cookie SNAP, fail-start SNAP.APP, clear-fail-start, durations, service,
// store SNAP REVISION (what a refresh finds), held SNAP (a refresh hold),
// warn, log, latency, requests, counters, state, services, changes, and
// wait conflicts=N|requests=N|idle to block until something happened.
// `fakesnapd ctl -h` lists them. Exit codes: 0 done, 1 refused (unknown
// change, snap or service), 2 usage, 3 fakesnapd unreachable.
//
// See README.md beside this file for shell lines to paste.
package main
