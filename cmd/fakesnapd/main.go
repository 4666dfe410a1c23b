package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/snapsvc/snapsvc/cmd/clistyle"
	"github.com/snapsvc/snapsvc/fake"
)

//go:embed k8s-snap.yaml
var k8sSnapYAML []byte

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// exitError carries a command's exit code out of cobra.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// serveFlags are fakesnapd's own flags.
type serveFlags struct {
	dir, root, version, snapsFile string
	snapYAMLs                     []string
	asJSON, noRefreshObserve      bool
	allowNonRoot                  bool
}

func run(args []string, stdout, stderr io.Writer) int {
	args = compatVersion(args, stderr)
	var f serveFlags
	ran := false
	root := &cobra.Command{
		Use: "fakesnapd",
		Example: `  fakesnapd --root /tmp/root &                 # sockets in /tmp/root/run
  SNAPPY_GLOBAL_ROOT=/tmp/root snapsvc services
  fakesnapd ctl --root /tmp/root hold configure-snap k8s`,
		Short: "Serve snapsvc's fake snapd on real Unix sockets",
		Long: `fakesnapd serves snapsvc's fake snapd (package fake) on real Unix sockets, so
the real snap client, curl, the snapsvc CLI or a script can be pointed at it,
with a control socket for "fakesnapd ctl". Ctrl-C removes the sockets.

  fakesnapd (--dir D | --root R) [--snapd-version V] [--snaps FILE | --snap-yaml FILE...] [--no-refresh-observe] [--allow-non-root] [--json]
  fakesnapd ctl (--dir D | --root R) COMMAND [ARGS]   ("fakesnapd ctl -h" lists them)`,
		// No Args: an argument is an unknown command, with suggestions.
		RunE: func(c *cobra.Command, _ []string) error {
			ran = true
			if code := serve(f, stdout, stderr); code != 0 {
				return &exitError{code}
			}
			return nil
		},
	}
	clistyle.Apply(root)
	root.Flags().StringVar(&f.dir, "dir", "", "directory for snapd.socket, snapd-snap.socket and control.socket")
	root.Flags().StringVar(&f.root, "root", "", "a SNAPPY_GLOBAL_ROOT for the real snap client: sockets in R/run/")
	root.Flags().StringVar(&f.version, "snapd-version", "2.77", "snapd release to imitate: 2.57, 2.62, 2.68, 2.70, 2.77 (or a full version)")
	root.Flags().StringVar(&f.snapsFile, "snaps", "", "YAML or JSON file describing the snaps (see go doc ./fake ParseSnaps)")
	root.Flags().StringArrayVar(&f.snapYAMLs, "snap-yaml", nil, "a snap.yaml, or an unpacked snap's directory (meta/snap.yaml, meta/hooks/); repeatable")
	root.Flags().BoolVar(&f.asJSON, "json", false, "print one JSON line describing the sockets instead of the text help")
	root.Flags().BoolVar(&f.noRefreshObserve, "no-refresh-observe", false, "refuse change and notice reads on the snap socket (403 access denied), as snapd does for a snap without snap-refresh-observe")
	root.Flags().BoolVar(&f.allowNonRoot, "allow-non-root", false, "let users who are not root start, stop and restart services, read logs and configuration (snapd refuses them: access denied)")
	root.AddCommand(&cobra.Command{
		Use: "ctl (--dir D | --root R) COMMAND [ARGS]",
		Example: `  id=$(fakesnapd ctl --root /tmp/root hold configure-snap k8s)
  fakesnapd ctl --root /tmp/root finish "$id"
  fakesnapd ctl --root /tmp/root restart 2s   # snapd away for 2 s`,
		Short:              "Drive a running fakesnapd through its control socket",
		Long:               ctlUsage,
		DisableFlagParsing: true, // ctl reads its own flags
		RunE: func(c *cobra.Command, args []string) error {
			ran = true
			if code := runCtl(args, stdout, stderr); code != 0 {
				return &exitError{code}
			}
			return nil
		},
	})
	_, err := clistyle.Execute(context.Background(), root, args, stdout, stderr, func() bool { return ran })
	var ee *exitError
	var ue *clistyle.UsageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		ue.Fprint(stderr)
		return 2
	}
	fmt.Fprintf(stderr, "error: %v\n", err)
	return 1
}

// serve runs the fake until SIGINT or SIGTERM and returns the exit code.
func serve(f serveFlags, stdout, stderr io.Writer) int {
	dir, root, version, snapsFile, snapYAMLs, asJSON := &f.dir, &f.root, &f.version, &f.snapsFile, f.snapYAMLs, &f.asJSON
	d, err := socketDir(*dir, *root)
	if err != nil {
		(&clistyle.UsageError{Msg: err.Error(), Cmd: "fakesnapd"}).Fprint(stderr)
		return 2
	}
	v, err := parseVersion(*version)
	if err != nil {
		fmt.Fprintf(stderr, "fakesnapd: %v\n", err)
		return 2
	}
	if *snapsFile != "" && len(snapYAMLs) > 0 {
		fmt.Fprintf(stderr, "fakesnapd: --snaps and --snap-yaml do not go together\n")
		return 2
	}
	snaps, err := loadSnaps(*snapsFile, snapYAMLs)
	if err != nil {
		fmt.Fprintf(stderr, "fakesnapd: %v\n", err)
		return 2
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		fmt.Fprintf(stderr, "fakesnapd: %v\n", err)
		return 1
	}
	opts := []fake.Option{fake.WithDir(d), fake.WithVersion(v), fake.WithSnaps(snaps...)}
	if f.noRefreshObserve {
		opts = append(opts, fake.WithoutRefreshObserve())
	}
	if f.allowNonRoot {
		opts = append(opts, fake.AllowNonRoot())
	}
	srv, err := fake.New(opts...)
	if err != nil {
		fmt.Fprintf(stderr, "fakesnapd: %v\n", err)
		return 1
	}
	defer srv.Close()
	ctlPath := filepath.Join(d, "control.socket")
	os.Remove(ctlPath)
	ln, err := net.Listen("unix", ctlPath)
	if err != nil {
		fmt.Fprintf(stderr, "fakesnapd: cannot listen on %s: %v\n", ctlPath, err)
		return 1
	}
	ctlSrv := &http.Server{Handler: srv.ControlHandler(), ReadHeaderTimeout: time.Minute}
	served := make(chan struct{})
	go func() { defer close(served); ctlSrv.Serve(ln) }()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	announce(stdout, *asJSON, srv, ctlPath, *root, snaps)
	<-ctx.Done()

	shut, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ctlSrv.Shutdown(shut)
	ctlSrv.Close()
	<-served
	os.Remove(ctlPath)
	srv.Close() // removes snapd.socket and snapd-snap.socket
	fmt.Fprintln(stderr, "fakesnapd: stopped, sockets removed")
	return 0
}

// compatVersion turns v0.1's "--version X" (the snapd release to imitate)
// into "--snapd-version X", with a notice: --version alone is this build's
// version now, as for snapsvc.
func compatVersion(args []string, stderr io.Writer) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "version" {
			out = append(out, a)
			continue
		}
		if !hasVal && i+1 < len(args) && len(args[i+1]) > 0 && args[i+1][0] >= '0' && args[i+1][0] <= '9' {
			val, hasVal = args[i+1], true
			i++
		}
		if hasVal && len(val) > 0 && val[0] >= '0' && val[0] <= '9' {
			fmt.Fprintf(stderr, "fakesnapd: \"--version %s\" is deprecated and goes away in v0.3.0: use --snapd-version %s\n", val, val)
			out = append(out, "--snapd-version", val)
			continue
		}
		out = append(out, a)
	}
	return out
}

func socketDir(dir, root string) (string, error) {
	switch {
	case dir != "" && root != "":
		return "", errors.New("give --dir or --root, not both")
	case root != "":
		return filepath.Join(root, "run"), nil
	case dir != "":
		return dir, nil
	}
	return "", errors.New("--dir or --root is required")
}

// parseVersion maps the short profile names to the fake's profiles.
func parseVersion(s string) (fake.Version, error) {
	switch s {
	case "2.57", "2.57.6":
		return fake.Version257, nil
	case "2.62":
		return fake.Version262, nil
	case "2.68", "2.68.3":
		return fake.Version268, nil
	case "2.70":
		return fake.Version270, nil
	case "2.77", "2.77.1":
		return fake.Version277, nil
	}
	var a, b int
	if n, _ := fmt.Sscanf(s, "%d.%d", &a, &b); n != 2 || a != 2 {
		return "", fmt.Errorf("--snapd-version %q: want 2.57, 2.62, 2.68, 2.70, 2.77 or a 2.x version", s)
	}
	return fake.Version(s), nil
}

// defaultSnap is the k8s snap of k8s-snap.yaml, with its configure hook
// (k8s-snap ships it in meta/hooks/) and durations that make its changes
// visible: starts take 300ms, stops 200ms, the configure hook 2s.
func defaultSnap() (fake.Snap, error) {
	sn, err := fake.SnapFromYAML(k8sSnapYAML)
	if err != nil {
		return fake.Snap{}, err
	}
	sn.Hooks = append(sn.Hooks, "configure")
	sn.ConfigureHookDuration = 2 * time.Second
	for i := range sn.Apps {
		if sn.Apps[i].Daemon != "" {
			sn.Apps[i].StartDuration = 300 * time.Millisecond
			sn.Apps[i].StopDuration = 200 * time.Millisecond
		}
	}
	return sn, nil
}

func loadSnaps(file string, yamls []string) ([]fake.Snap, error) {
	switch {
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		return fake.ParseSnaps(data)
	case len(yamls) > 0:
		var out []fake.Snap
		for _, p := range yamls {
			var sn fake.Snap
			fi, err := os.Stat(p)
			if err != nil {
				return nil, err
			}
			if fi.IsDir() {
				sn, err = fake.SnapFromDir(p)
			} else {
				var data []byte
				if data, err = os.ReadFile(p); err == nil {
					sn, err = fake.SnapFromYAML(data)
				}
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			out = append(out, sn)
		}
		return out, nil
	}
	sn, err := defaultSnap()
	if err != nil {
		return nil, err
	}
	return []fake.Snap{sn}, nil
}

// Announcement is the --json line fakesnapd prints once it listens.
type Announcement struct {
	Version       string   `json:"version"`
	Socket        string   `json:"socket"`
	SnapSocket    string   `json:"snap-socket"`
	ControlSocket string   `json:"control-socket"`
	Root          string   `json:"root,omitempty"`
	Snaps         []string `json:"snaps"`
	PID           int      `json:"pid"`
}

func announce(w io.Writer, asJSON bool, srv *fake.Server, ctlPath, root string, snaps []fake.Snap) {
	a := Announcement{Version: string(srv.Version()), Socket: srv.SocketPath(), SnapSocket: srv.SnapSocketPath(),
		ControlSocket: ctlPath, Root: root, PID: os.Getpid()}
	for _, sn := range snaps {
		a.Snaps = append(a.Snaps, sn.Name)
	}
	if asJSON {
		json.NewEncoder(w).Encode(a)
		return
	}
	d := srv.Dir()
	first := a.Snaps[0]
	svc := first
	for _, app := range snaps[0].Apps {
		if app.Daemon != "" && (svc == first || app.Active) {
			svc = first + "." + app.Name
			if app.Active {
				break
			}
		}
	}
	fmt.Fprintf(w, "fakesnapd: fake snapd %s serving snap(s) %s (pid %d)\n", a.Version, strings.Join(a.Snaps, ", "), a.PID)
	fmt.Fprintf(w, "  snapd.socket       %s\n  snapd-snap.socket  %s\n  control            %s\n", a.Socket, a.SnapSocket, ctlPath)
	fmt.Fprintf(w, "try:\n")
	fmt.Fprintf(w, "  curl -sS --unix-socket %s http://localhost/v2/apps\n", a.Socket)
	fmt.Fprintf(w, "  snapsvc --socket %s status %s\n", a.Socket, first)
	if root != "" {
		fmt.Fprintf(w, "  SNAPPY_GLOBAL_ROOT=%s SNAP_REEXEC=0 snap services %s\n", root, first)
		fmt.Fprintf(w, "  fakesnapd ctl --root %s hold configure-snap %s     # a foreign change; then: finish ID\n", root, first)
	} else {
		fmt.Fprintf(w, "  fakesnapd ctl --dir %s hold configure-snap %s     # a foreign change; then: finish ID\n", d, first)
	}
	fmt.Fprintf(w, "  (a service to restart: %s)  Ctrl-C stops and removes the sockets.\n", svc)
}
