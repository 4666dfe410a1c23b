module github.com/snapsvc/snapsvc/sqlbudget

go 1.26.0

require (
	github.com/mattn/go-sqlite3 v1.14.53
	github.com/snapsvc/snapsvc v0.2.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	golang.org/x/sync v0.11.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
)
