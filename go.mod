module github.com/snapsvc/snapsvc

go 1.22.0

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/go-logr/logr v1.4.3
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sync v0.11.0
	golang.org/x/sys v0.30.0
)
