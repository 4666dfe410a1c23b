package snapsvcprom_test

import (
	"context"
	"fmt"
	"log"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/snapsvcprom"
)

// A controller registers the metrics with its registry and observes its
// client with them. Here a "snap set" holds the snap when the controller
// restarts kubelet: the restart meets one conflict, waits it out and is
// done.
func Example() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
	}}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()

	reg := prometheus.NewRegistry()
	m := snapsvcprom.New()
	reg.MustRegister(m)
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithoutFileLock(), snapsvc.WithObserver(m.Observe))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	snapSet := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	go func() {
		// The configure hook ends once the restart has met it.
		srv.WaitFor(context.Background(), func(v fake.View) bool { return v.Conflicts() >= 1 })
		snapSet.Finish()
	}()
	if _, err := c.Restart(context.Background(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		log.Fatal(err)
	}

	err = testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP snapsvc_conflicts_total snapd change conflicts met by operations (each waited out or retried).
# TYPE snapsvc_conflicts_total counter
snapsvc_conflicts_total{action="restart"} 1
# HELP snapsvc_operations_in_flight Service operations started and not ended.
# TYPE snapsvc_operations_in_flight gauge
snapsvc_operations_in_flight{action="restart"} 0
# HELP snapsvc_operations_total Service operations (start, stop, restart) ended, by action and outcome.
# TYPE snapsvc_operations_total counter
snapsvc_operations_total{action="restart",outcome="done"} 1
`), "snapsvc_conflicts_total", "snapsvc_operations_in_flight", "snapsvc_operations_total")
	fmt.Println("metrics as expected:", err == nil)
	n, _ := testutil.GatherAndCount(reg, "snapsvc_operation_duration_seconds")
	fmt.Println("duration series:", n)
	// Output:
	// metrics as expected: true
	// duration series: 1
}
