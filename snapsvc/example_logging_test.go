package snapsvc_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"strings"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// A controller that logs with logr (as k8sd's do, taking the logger from
// the context) gets snapsvc's lines on its own request's logger, through
// logr's slog bridge.
func ExampleWithContextLogger() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
	}}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithMode(snapsvc.ModeREST),
		snapsvc.WithContextLogger(func(ctx context.Context) *slog.Logger {
			l, err := logr.FromContext(ctx)
			if err != nil {
				return nil // the client's own logger (WithLogger) then
			}
			return slog.New(logr.ToSlogHandler(l))
		}))
	if err != nil {
		log.Fatal(err)
	}

	// What a controller's reconcile receives: a logr logger in its context,
	// carrying the request's values. This one prints the line that reports
	// the change.
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, `"msg"="change done"`) {
			fmt.Println(args)
		}
	}, funcr.Options{})
	ctx := logr.NewContext(context.Background(), logger.WithValues("controller", "node-configuration"))

	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		log.Fatal(err)
	}
	// Output:
	// "level"=0 "msg"="change done" "controller"="node-configuration" "snap"="k8s" "action"="restart" "names"="k8s.kubelet" "change"="1" "attempt"=1
}
