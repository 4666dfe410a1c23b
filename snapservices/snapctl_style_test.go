package snapservices_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapservices/snapservicestest"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// snapDir writes an installed snap's meta/snap.yaml with a confinement
// line (none when confinement is "").
func snapDir(t *testing.T, confinement string) string {
	t.Helper()
	dir := t.TempDir()
	yaml := "name: microceph\nversion: '19.2'\nsummary: s\ndescription: d\n"
	if confinement != "" {
		yaml += "confinement: " + confinement + " # from snapcraft.yaml\n"
	}
	yaml += "apps:\n  rgw:\n    command: rgw\n    daemon: simple\n"
	if err := os.MkdirAll(filepath.Join(dir, "meta"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "meta", "snap.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// unsetSnapEnv clears what a test process may inherit from a snap.
func unsetSnapEnv(t *testing.T) {
	for _, k := range []string{"SNAP", "SNAP_NAME", "SNAP_INSTANCE_NAME", "SNAP_COOKIE", "SNAP_CONTEXT"} {
		t.Setenv(k, "")
	}
}

// Issue 27, item 3: nothing picked the mode from the snap's confinement
// (microk8s-cluster-agent chose by hand). SnapctlStyle reads
// $SNAP/meta/snap.yaml: classic → REST, strict and devmode (and a
// snap.yaml without the key, snapd's default) → snapctl, no snap.yaml →
// snapctl.
func TestSnapctlStyleModeFromConfinement(t *testing.T) {
	unsetSnapEnv(t)
	for _, c := range []struct {
		confinement string
		want        snapsvc.Mode
	}{
		{"classic", snapsvc.ModeREST},
		{"strict", snapsvc.ModeSnapctl},
		{"devmode", snapsvc.ModeSnapctl},
		{"", snapsvc.ModeSnapctl},
	} {
		dir := snapDir(t, c.confinement)
		t.Setenv("SNAP", dir)
		r := snapservicestest.NewRecorder("microceph")
		s, err := snapservices.New(snapservices.SnapctlStyle(), snapservices.WithCommandRunner(r.Run))
		if err != nil {
			t.Fatal(err)
		}
		if s.Mode() != c.want {
			t.Errorf("confinement %q: mode %v, want %v", c.confinement, s.Mode(), c.want)
		}
		// WithSnapDir names the directory instead of $SNAP.
		t.Setenv("SNAP", "")
		s, err = snapservices.New(snapservices.SnapctlStyle(), snapservices.WithSnapDir(dir), snapservices.WithCommandRunner(r.Run))
		if err != nil || s.Mode() != c.want {
			t.Errorf("confinement %q with WithSnapDir: mode %v, %v", c.confinement, s.Mode(), err)
		}
	}
	// No snap.yaml (a unit test): snapctl, the mode the code was written for.
	s, err := snapservices.New(snapservices.SnapctlStyle(), snapservices.WithSnapDir(t.TempDir()), snapservices.WithCommandRunner(func(context.Context, []string) error { return nil }))
	if err != nil || s.Mode() != snapsvc.ModeSnapctl {
		t.Fatalf("no snap.yaml: mode %v, %v", s.Mode(), err)
	}
	if c, err := snapservices.Confinement(snapDir(t, "weird")); err == nil {
		t.Fatalf("confinement %q accepted", c)
	}
	if _, err := snapservices.New(snapservices.SnapctlStyle(), snapservices.WithSnapDir(snapDir(t, "weird"))); !errors.Is(err, snapservices.ErrSetup) {
		t.Fatalf("unknown confinement: %v, want ErrSetup", err)
	}
	// A client is built in the mode picked: REST for a classic snap.
	s, err = snapservices.New(snapservices.SnapctlStyle(), snapservices.WithSnapDir(snapDir(t, "classic")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Client().Mode() != snapsvc.ModeREST {
		t.Fatalf("client mode %v", s.Client().Mode())
	}
}

// Issue 27, item 2: the command seam rendered "snap ..." with the flags
// after the names whatever the mode; the three snapctl adopters assert
// snapctl lines. A handle in snapctl mode now hands its runner the line
// they write, and k8sd's default stays as it was.
func TestCommandSeamRendersTheHandlesMode(t *testing.T) {
	unsetSnapEnv(t)
	ctx := context.Background()
	var got []string
	run := func(_ context.Context, cmd []string) error { got = append(got, strings.Join(cmd, " ")); return nil }

	s, err := snapservices.New(snapservices.SnapctlStyle(), snapservices.WithCommandRunner(run))
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range []func() error{
		func() error { return s.StartServices(ctx, []string{"microceph.nfs"}, "--enable") },
		func() error { return s.StopServices(ctx, []string{"microceph.nfs"}, "--disable") },
		func() error { return s.RestartServices(ctx, []string{"microceph.rgw"}) },
		func() error { return s.RestartServices(ctx, []string{"microceph.osd"}, "--reload") },
		func() error { return s.StartServices(ctx, []string{"microceph.mon"}) }, // plain: no --enable implied
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		"snapctl start microceph.nfs --enable", // microceph's nfs_test.go
		"snapctl stop microceph.nfs --disable",
		"snapctl restart microceph.rgw",
		"snapctl restart --reload microceph.osd", // microceph's snapRestart(service, true)
		"snapctl start microceph.mon",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("lines\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// snapctl has no --no-wait: refused, nothing run.
	if err := s.StopServices(ctx, []string{"microceph.nfs"}, "--no-wait"); !errors.Is(err, snapservices.ErrUnsupportedFlag) || len(got) != len(want) {
		t.Fatalf("--no-wait in snapctl mode: %v", err)
	}
	// Outside a snap the names give the instance; a name without one, or
	// of two snaps, is refused before the runner.
	if err := s.StartServices(ctx, []string{"rgw"}); !errors.Is(err, snapsvc.ErrInvalidName) {
		t.Fatalf("bare name without an instance: %v", err)
	}
	if err := s.StartServices(ctx, []string{"microceph.rgw", "microovn.chassis"}); !errors.Is(err, snapsvc.ErrWrongSnap) {
		t.Fatalf("two snaps: %v", err)
	}
	// Inside the snap the instance comes from the environment.
	t.Setenv("SNAP_INSTANCE_NAME", "microceph")
	s, _ = snapservices.New(snapservices.SnapctlStyle(), snapservices.WithCommandRunner(run))
	if err := s.RestartServices(ctx, []string{"rgw"}); err != nil || got[len(got)-1] != "snapctl restart microceph.rgw" {
		t.Fatalf("instance from the environment: %v, %q", err, got[len(got)-1])
	}
	if err := s.RestartServices(ctx, []string{"microovn.chassis"}); !errors.Is(err, snapsvc.ErrWrongSnap) {
		t.Fatalf("another snap: %v", err)
	}

	// k8sd's default: REST, "snap", names then flags, implied flags.
	t.Setenv("SNAP_INSTANCE_NAME", "")
	got = nil
	k, err := snapservices.New(snapservices.WithDefaultInstance("k8s"), snapservices.WithCommandRunner(run))
	if err != nil {
		t.Fatal(err)
	}
	if err := k.StartServices(ctx, []string{"test-service"}, "--no-wait"); err != nil {
		t.Fatal(err)
	}
	if want := "snap start k8s.test-service --enable --no-wait"; len(got) != 1 || got[0] != want {
		t.Fatalf("k8sd's line %q, want %q", got, want)
	}
}

// The Recorder checks the lines a handle hands it: in snapctl mode it
// expects snapctl lines, refuses snap ones, and records what it got.
func TestRecorderAssertsTheMode(t *testing.T) {
	unsetSnapEnv(t)
	ctx := context.Background()
	r := snapservicestest.NewRecorder("microceph", snapservicestest.Snapctl(), snapservicestest.PlainFlags())
	s, err := snapservices.New(snapservices.SnapctlStyle(), snapservices.WithCommandRunner(r.Run))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RestartServices(ctx, []string{"microceph.rgw"}, "--reload"); err != nil {
		t.Fatal(err)
	}
	if err := r.StartServices(ctx, []string{"nfs"}, "--enable"); err != nil {
		t.Fatal(err)
	}
	if got, want := r.Commands(), []string{"snapctl restart --reload microceph.rgw", "snapctl start microceph.nfs --enable"}; !slices.Equal(got, want) {
		t.Fatalf("commands %q, want %q", got, want)
	}
	if err := r.Run(ctx, []string{"snap", "restart", "microceph.rgw"}); err == nil || !strings.Contains(err.Error(), "snapctl") {
		t.Fatalf("a snap line in snapctl mode: %v", err)
	}
	// And a REST Recorder refuses snapctl lines.
	rest := snapservicestest.NewRecorder("k8s")
	if err := rest.Run(ctx, []string{"snapctl", "restart", "k8s.kubelet"}); err == nil {
		t.Fatal("a snapctl line accepted in REST mode")
	}
}

// Issue 27, item 6: no status call in the adapter (microceph execs
// "snapctl services" and looks for "inactive"), and WithEnsureRunning
// could not be used under the command seam. Under WithCommandOutput the
// handle runs "snapctl services NAME", reads the answer (a table, or a
// test's canned word), and EnsureRunning starts only the difference.
func TestStatusAndEnsureRunningUnderTheSeam(t *testing.T) {
	unsetSnapEnv(t)
	ctx := context.Background()
	var lines []string
	answers := map[string]string{
		"snapctl services microceph.mon": "inactive", // microceph's start_test.go mocks
		"snapctl services microceph.osd": "active",
		"snapctl services microceph.rgw": "Service        Startup  Current  Notes\nmicroceph.rgw  enabled  active   -\n",
	}
	out := func(_ context.Context, cmd []string) (string, error) {
		line := strings.Join(cmd, " ")
		lines = append(lines, line)
		return answers[line], nil
	}
	s, err := snapservices.New(snapservices.SnapctlStyle(), snapservices.WithEnsureRunning(), snapservices.WithCommandOutput(out))
	if err != nil {
		t.Fatal(err)
	}
	for name, active := range map[string]bool{"microceph.mon": false, "microceph.osd": true, "microceph.rgw": true} {
		svcs, err := s.Services(ctx, []string{name})
		if err != nil || len(svcs) != 1 || svcs[0].FullName() != name || svcs[0].Active != active {
			t.Fatalf("%s: %+v, %v: want active=%t", name, svcs, err, active)
		}
	}
	lines = nil
	// microceph's start.go: start (and enable) what is not running.
	answers["snapctl services microceph.osd"] = "microceph.osd  enabled  active  -"
	for _, name := range []string{"microceph.mon", "microceph.osd"} {
		if err := s.StartServices(ctx, []string{name}, "--enable"); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"snapctl services microceph.mon", "snapctl start microceph.mon --enable", "snapctl services microceph.osd"}
	if !slices.Equal(lines, want) {
		t.Fatalf("lines %q, want %q", lines, want)
	}
	// Output that says nothing about the service is an error, not a guess.
	answers["snapctl services microceph.mds"] = "error: unknown service"
	if _, err := s.Services(ctx, []string{"microceph.mds"}); err == nil {
		t.Fatal("no state read from an answer without one")
	}
	// A runner without output cannot read.
	n, _ := snapservices.New(snapservices.SnapctlStyle(), snapservices.WithCommandRunner(func(context.Context, []string) error { return nil }))
	if _, err := n.Services(ctx, []string{"microceph.rgw"}); !errors.Is(err, snapservices.ErrSetup) {
		t.Fatalf("services without output: %v", err)
	}
	// The Recorder serves both: it answers from what the calls did.
	r := snapservicestest.NewRecorder("microceph", snapservicestest.Snapctl(), snapservicestest.PlainFlags())
	r.SetService("osd", true, true)
	s, _ = snapservices.New(snapservices.SnapctlStyle(), snapservices.WithEnsureRunning(), snapservices.WithCommandOutput(r.Output))
	if err := s.StartServices(ctx, []string{"microceph.mon", "microceph.osd"}, "--enable"); err != nil {
		t.Fatal(err)
	}
	if got, want := r.Commands(), []string{"snapctl services microceph.mon microceph.osd", "snapctl start microceph.mon --enable"}; !slices.Equal(got, want) {
		t.Fatalf("recorder commands %q, want %q", got, want)
	}
	if svcs, err := r.Services(ctx, []string{"mon"}); err != nil || !svcs[0].Active || !svcs[0].Enabled {
		t.Fatalf("mon after the start: %+v, %v", svcs, err)
	}
}

// The status call through snapd, in both modes.
func TestServicesThroughSnapd(t *testing.T) {
	unsetSnapEnv(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "microceph", Apps: []fake.App{
		{Name: "mon", Daemon: "simple", Enabled: true, Active: true},
		{Name: "rgw", Daemon: "simple"},
	}}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, mode := range []snapsvc.Mode{snapsvc.ModeREST, snapsvc.ModeSnapctl} {
		opts := []snapservices.Option{snapservices.SnapctlStyle(), snapservices.WithClientOptions(snapsvc.WithSnapSocket(srv.SnapSocketPath()))}
		if mode == snapsvc.ModeSnapctl {
			opts = append(opts, snapservices.WithClientOptions(snapsvc.WithCookie(srv.Cookie("microceph")), snapsvc.WithHook("")))
		} else {
			opts = append(opts, snapservices.WithSnapDir(snapDir(t, "classic")), snapservices.WithClientOptions(snapsvc.WithSocket(srv.SocketPath())))
		}
		s, err := snapservices.New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		if s.Mode() != mode {
			t.Fatalf("mode %v, want %v", s.Mode(), mode)
		}
		svcs, err := s.Services(ctx, []string{"microceph.mon", "microceph.rgw"})
		if err != nil || len(svcs) != 2 || !svcs[0].Active || svcs[1].Active {
			t.Fatalf("%v: %+v, %v", mode, svcs, err)
		}
		s.Close()
	}
}
