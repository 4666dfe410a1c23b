module github.com/snapsvc/snapsvc/sqlbudget/internal/dqlitetest

go 1.26.0

require (
	github.com/canonical/go-dqlite v1.11.5
	github.com/snapsvc/snapsvc v0.2.0
	github.com/snapsvc/snapsvc/sqlbudget v0.2.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/Rican7/retry v0.3.0 // indirect
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/ghodss/yaml v1.0.0 // indirect
	github.com/google/renameio v1.0.1 // indirect
	github.com/mattn/go-sqlite3 v1.14.53 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sync v0.11.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
)

// Test-only module, never published: go-dqlite 1.11.5 from Debian's
// golang-github-canonical-go-dqlite-dev (it matches Debian's libdqlite
// 1.11.1; go-dqlite v3 needs libdqlite >= 1.17), and this repository's
// modules from their working trees.
replace (
	github.com/canonical/go-dqlite => /usr/share/gocode/src/github.com/canonical/go-dqlite
	github.com/snapsvc/snapsvc => ../../..
	github.com/snapsvc/snapsvc/sqlbudget => ../..
)
