// Package dqlitetest runs sqlbudget on a real dqlite cluster: three
// go-dqlite app nodes, each a child process on loopback (the test binary
// re-executed), with libdqlite from Debian's packages. Its tests run the
// budget contract (testsupport/budgetcontract) on the cluster, fault
// tests (the leader killed, a holder frozen past its TTL, a node frozen,
// a node restarted with its data) whose invariant is rebuilt from records
// outside the faulted processes, and a rolling restart of simulated
// machines.
//
// It is a module of its own, never published, so that neither go-dqlite
// nor cgo enters sqlbudget's module graph. It builds with cgo and the
// libsqlite3 tag only (go-dqlite links the system SQLite that libdqlite
// uses); without the tag the package is this file alone:
//
//	apt-get install golang-github-canonical-go-dqlite-dev libdqlite-dev
//	cd sqlbudget/internal/dqlitetest && GOWORK=off go test -race -tags libsqlite3 -count=1 .
package dqlitetest
