package snapservices_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"strings"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapservices/snapservicestest"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Bad input fails before any request, saying what is wrong.
func ExampleSnap_StopServices() {
	// AllowNonRoot: examples run as you, and snapd lets only root start,
	// stop and restart services.
	srv, err := fake.New(fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{
		{Name: "kubelet", Daemon: "simple", Enabled: true, Active: true},
	}}))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Close()
	snap, err := snapservices.New(snapservices.WithInstance("k8s"),
		snapservices.WithSocket(srv.SocketPath()))
	if err != nil {
		log.Fatal(err)
	}
	defer snap.Close()
	ctx := context.Background()

	err = snap.StopServices(ctx, []string{"kubelet"}, "--force")
	fmt.Println(errors.Is(err, snapservices.ErrUnknownFlag), err)
	err = snap.StopServices(ctx, []string{"etcd.etcd"})
	fmt.Println(errors.Is(err, snapsvc.ErrWrongSnap), err)
	fmt.Println("requests sent:", len(srv.Requests()))

	// The remove hook's stop (and disable, as k8sd's StopServices always
	// does): --no-wait returns once snapd accepted it.
	if err := snap.StopServices(ctx, []string{"kubelet"}, "--no-wait"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("requests sent:", len(srv.Requests()))
	// Output:
	// true snapsvc: stop k8s.kubelet: unknown flag --force: snap stop accepts --disable, --no-wait [not retryable]
	// true snapsvc: stop etcd.etcd: service of another snap: "etcd.etcd" names a service of snap "etcd"; this handle controls snap "k8s" only (give "<app>" or "k8s.<app>") [not retryable]
	// requests sent: 0
	// requests sent: 1
}

// Code written around snapctl (microceph's snapStart, snapRestart and
// snapCheckActive) keeps its calls; in a unit test the handle hands the
// test's runner the snapctl lines the code ran before, and reads the state
// from the runner's answer. In the strict snap the same calls go through
// snapctl on snapd's snap socket, waiting out changes that hold the snap.
func ExampleSnapctlStyle() {
	r := snapservicestest.NewRecorder("microceph", snapservicestest.Snapctl(), snapservicestest.PlainFlags())
	r.SetService("rgw", true, true)
	svc := snapservices.Open(snapservices.SnapctlStyle(), snapservices.WithSnapDir(""), snapservices.WithCommandOutput(r.Output))
	ctx := context.Background()

	fmt.Println(svc.Mode(), svc.StartServices(ctx, []string{"microceph.nfs"}, "--enable"))
	fmt.Println(svc.RestartServices(ctx, []string{"microceph.rgw"}, "--reload"))
	states, err := svc.Services(ctx, []string{"microceph.rgw"})
	fmt.Println(states[0].FullName(), states[0].Active, err)
	for _, line := range r.Commands() {
		fmt.Println(line)
	}
	// Output:
	// snapctl <nil>
	// <nil>
	// microceph.rgw true <nil>
	// snapctl start microceph.nfs --enable
	// snapctl restart --reload microceph.rgw
	// snapctl services microceph.rgw
}

// WithLogLines hands one line per action, with its level, to a logger that
// takes text: lxd's shared/logger in microovn and microceph, wired so that
// a failure or a give-up is a warning. Here a command runner stands in for
// snapd, and the lines are printed without their varying time.
func ExampleWithLogLines() {
	s, err := snapservices.New(snapservices.WithInstance("microovn"), snapservices.WithSnapctl(),
		snapservices.WithCommandRunner(func(_ context.Context, command []string) error {
			if command[len(command)-1] == "microovn.ovn-nb" {
				return errors.New(`snap "microovn" has "configure-snap" change in progress`)
			}
			return nil
		}),
		snapservices.WithLogLines(func(level slog.Level, line string) {
			before, after, _ := strings.Cut(line, " elapsed=")
			if _, errText, ok := strings.Cut(after, ": "); ok {
				before += ": " + errText
			}
			if level >= slog.LevelWarn {
				fmt.Println("warn:", before) // logger.Warn(line)
				return
			}
			fmt.Println("info:", before) // logger.Info(line)
		}))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	_ = s.RestartServices(ctx, []string{"microovn.ovn-northd"}, "--reload")
	_ = s.RestartServices(ctx, []string{"microovn.ovn-nb"})
	// Output:
	// info: restarted services services=microovn.ovn-northd flags=--reload command="snapctl restart --reload microovn.ovn-northd"
	// warn: cannot restart services services=microovn.ovn-nb command="snapctl restart microovn.ovn-nb": snap "microovn" has "configure-snap" change in progress
}
