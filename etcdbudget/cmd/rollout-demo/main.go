// Command rollout-demo shows a rolling restart under an etcd restart
// budget, self-contained: it starts a 3-member etcd cluster on loopback
// (etcd's own server, each member a child process built from
// etcdbudget/internal/etcdtest/etcdmember), and several simulated
// machines, each with its own fake snapd serving a Kubernetes-like snap
// and a readiness check that passes some time after kube-apiserver
// restarted. Every machine runs the same rollout: restart
// k8s.kube-apiserver under the budget. It prints the timeline: who
// waited behind whom, acquired, restarted, became ready and released.
//
//	go run ./rollout-demo [--machines 4] [--max 1] [--ready-after 300ms] [--settle 100ms]
//
// With --serve it starts the same etcd and keeps it running until Ctrl-C
// (or SIGTERM), printing the line to paste into another shell, where
// snapsvc-rollout runs against it:
//
//	go run ./rollout-demo --serve [--env-file FILE]
//	export ETCDCTL_ENDPOINTS=http://127.x.y.z:PORT,...
//
// It shares the CLI style of every binary of the project
// (github.com/snapsvc/snapsvc/cmd/clistyle): help on stdout, GNU flags,
// usage errors exit 2, --version, completion bash|zsh|fish; its man pages
// come from a build with the manpages tag (package clistyle/manpage).
// Exit codes: 0 done (with --serve: stopped by Ctrl-C or SIGTERM); 1 etcd
// did not start or a restart failed; 2 usage; 130 interrupted.
//
// It builds etcd's member binary with the go command the first time, from
// the repository's source: run it from a clone.
package main

import (
	"os"

	"github.com/snapsvc/snapsvc/etcdbudget/cmd/internal/demo"
)

func main() { os.Exit(demo.Main()) }
