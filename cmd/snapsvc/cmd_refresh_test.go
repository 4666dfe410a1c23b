package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// refreshFake is a fake snapd with svcdemo at store revision 1 (version
// 1.0, two services taking 1ms to stop and start) whose store offers
// revision 2 (1.1) on latest/stable and 3 (1.2) on latest/beta.
func refreshFake(t *testing.T, opts ...fake.Option) *fake.Server {
	t.Helper()
	svc := func(name string) fake.App {
		return fake.App{Name: name, Daemon: "simple", Enabled: true, Active: true, StartDuration: time.Millisecond, StopDuration: time.Millisecond}
	}
	base := []fake.Option{
		fake.WithSnaps(fake.Snap{Name: "svcdemo", Version: "1.0", Revision: "1", Apps: []fake.App{svc("alpha"), svc("beta")}}),
		fake.WithStoreRevision("svcdemo", fake.StoreRevision{Revision: "2", Version: "1.1"}),
		fake.WithStoreRevision("svcdemo", fake.StoreRevision{Revision: "3", Version: "1.2", Channel: "beta"}),
	}
	srv := fake.NewServer(t, append(append([]fake.Option{fake.AllowNonRoot()}, base...), opts...)...)
	return srv
}

func TestRefreshCommand(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := refreshFake(t)
	sock := srv.SocketPath()
	ctx := context.Background()

	code, out, errOut := runWithSocket(ctx, sock, false, "refresh", "svcdemo")
	if code != 0 || out != "svcdemo 1.1 refreshed\n" || errOut != "" {
		t.Fatalf("refresh: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// Nothing newer: snap's words on stderr, exit 0.
	code, out, errOut = runWithSocket(ctx, sock, false, "refresh", "svcdemo")
	if code != 0 || out != "" || errOut != "snap \"svcdemo\" has no updates available\n" {
		t.Fatalf("no update: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = runWithSocket(ctx, sock, false, "refresh", "--json", "svcdemo")
	var j refreshOutput
	if err := json.Unmarshal([]byte(out), &j); code != 0 || err != nil || !j.NoUpdate || j.Change != "" || j.Action != "refresh" {
		t.Fatalf("no update --json: exit %d %v %s", code, err, out)
	}
	// Another channel: snap names it when its risk is not stable.
	code, out, errOut = runWithSocket(ctx, sock, false, "refresh", "--channel", "beta", "svcdemo")
	if code != 0 || out != "svcdemo (beta) 1.2 refreshed\n" {
		t.Fatalf("refresh --channel beta: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// A local file, as snap install --dangerous.
	file := filepath.Join(t.TempDir(), "svcdemo_2.0_amd64.snap")
	if err := os.WriteFile(file, []byte("name: svcdemo\nversion: '2.0'\napps:\n  alpha:\n    daemon: simple\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runWithSocket(ctx, sock, false, "--json", "refresh", "svcdemo", file)
	if err := json.Unmarshal([]byte(out), &j); code != 0 || err != nil || j.After == nil || j.After.Version != "2.0" || j.After.Revision != "x1" || j.Change == "" || j.Status != "Done" {
		t.Fatalf("refresh FILE: exit %d %v, stdout %s, stderr %q", code, err, out, errOut)
	}
	if chg, _ := srv.ChangeByID(j.Change); chg.Kind != "install-snap" || !strings.Contains(chg.Summary, file) {
		t.Fatalf("change %+v", chg)
	}
	// --no-wait prints the change's id alone.
	srv.SetStoreRevision("svcdemo", fake.StoreRevision{Revision: "4", Version: "1.3"})
	code, out, _ = runWithSocket(ctx, sock, false, "refresh", "--no-wait", "--amend", "--channel", "stable", "svcdemo")
	if code != 0 || !regexp.MustCompile(`^[0-9]+\n$`).MatchString(out) {
		t.Fatalf("--no-wait: exit %d, stdout %q", code, out)
	}
	code, _, _ = runWithSocket(ctx, sock, false, "watch", strings.TrimSpace(out))
	if code != 0 {
		t.Fatalf("watch the refresh: exit %d", code)
	}
}

func TestRefreshHoldCommand(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := refreshFake(t)
	sock := srv.SocketPath()
	ctx := context.Background()
	code, out, errOut := runWithSocket(ctx, sock, false, "refresh", "--hold", "svcdemo")
	if until, level := srv.Hold("svcdemo"); code != 0 || out != "General refreshes of \"svcdemo\" held indefinitely\n" || level != "general" || until.IsZero() {
		t.Fatalf("--hold: exit %d, stdout %q, stderr %q; fake %v %q", code, out, errOut, until, level)
	}
	code, out, _ = runWithSocket(ctx, sock, false, "refresh", "--hold=72h", "--hold-level", "auto-refresh", "svcdemo")
	if _, level := srv.Hold("svcdemo"); code != 0 || level != "auto-refresh" || !regexp.MustCompile(`^Auto-refreshes of "svcdemo" held until \d{4}-\d\d-\d\dT`).MatchString(out) {
		t.Fatalf("--hold=72h: exit %d, stdout %q, level %q", code, out, level)
	}
	code, out, _ = runWithSocket(ctx, sock, false, "--json", "refresh", "--hold", "svcdemo")
	var j refreshOutput
	if err := json.Unmarshal([]byte(out), &j); code != 0 || err != nil || j.Hold == nil || !j.Hold.Held || !j.Hold.Forever || j.Change == "" {
		t.Fatalf("--json --hold: exit %d %v %s", code, err, out)
	}
	code, out, _ = runWithSocket(ctx, sock, false, "refresh", "--unhold", "svcdemo")
	if until, _ := srv.Hold("svcdemo"); code != 0 || out != "Removed general refresh hold of \"svcdemo\"\n" || !until.IsZero() {
		t.Fatalf("--unhold: exit %d, stdout %q, still held until %v", code, out, until)
	}
}

func TestRefreshHoldOldSnapd(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	srv := refreshFake(t, fake.WithVersion(fake.Version257))
	code, out, errOut := runWithSocket(context.Background(), srv.SocketPath(), false, "refresh", "--hold", "svcdemo")
	if code != exitFailed || out != "" || !strings.Contains(errOut, "2.58 or later") || !strings.Contains(errOut, "2.57.6") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestRefreshUsage(t *testing.T) {
	srv := refreshFake(t)
	file := filepath.Join(t.TempDir(), "x.snap")
	for _, args := range [][]string{
		{"refresh"},
		{"refresh", "svcdemo.alpha"},
		{"refresh", "svcdemo", file, "extra"},
		{"refresh", "--hold", "--unhold", "svcdemo"},
		{"refresh", "--hold", "svcdemo", file},
		{"refresh", "--hold", "--channel", "beta", "svcdemo"},
		{"refresh", "--hold=500ms", "svcdemo"},
		{"refresh", "--hold=soon", "svcdemo"},
		{"refresh", "--hold-level", "auto-refresh", "svcdemo"},
		{"refresh", "--hold", "--hold-level", "all", "svcdemo"},
		{"refresh", "--channel", "beta", "svcdemo", file},
	} {
		code, _, errOut := runWithSocket(context.Background(), srv.SocketPath(), false, args...)
		if code != exitUsage || !strings.HasPrefix(errOut, "error: ") {
			t.Errorf("%q: exit %d, stderr %q", args, code, errOut)
		}
	}
	if n := len(srv.Requests()); n != 0 {
		t.Fatalf("%d requests sent", n)
	}
}

// TestRefreshedLine: snap's "refreshed" line (showDoneSnap), channel and
// publisher as snap prints them.
func TestRefreshedLine(t *testing.T) {
	for _, tc := range []struct {
		in   snapsvc.SnapInfo
		want string
	}{
		{snapsvc.SnapInfo{Name: "svcdemo", Version: "1.1"}, "svcdemo 1.1 refreshed"},
		{snapsvc.SnapInfo{Name: "svcdemo", Version: "1.1", Channel: "latest/stable"}, "svcdemo 1.1 refreshed"},
		{snapsvc.SnapInfo{Name: "svcdemo", Version: "1.2", Channel: "latest/beta"}, "svcdemo (beta) 1.2 refreshed"},
		{snapsvc.SnapInfo{Name: "k8s", Version: "v1.31.2", Channel: "1.31/stable", Publisher: "Canonical", PublisherValidation: "verified"}, "k8s (1.31/stable) v1.31.2 from Canonical✓ refreshed"},
		{snapsvc.SnapInfo{Name: "lxd", Version: "6.1", Channel: "edge/fix-1", Publisher: "Canonical", PublisherValidation: "starred"}, "lxd (edge/fix-1) 6.1 from Canonical✪ refreshed"},
		{snapsvc.SnapInfo{Name: "demo", Version: "2", Channel: "latest/candidate", Publisher: "alice"}, "demo (candidate) 2 from alice refreshed"},
	} {
		if got := refreshedLine(&tc.in); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.in, got, tc.want)
		}
	}
}
