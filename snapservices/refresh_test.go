package snapservices_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// k8sRefreshable is k8s at store revision 10 (1.30) with the store
// offering 11 (1.31) on 1.31/stable.
func k8sRefreshable(t *testing.T) *fake.Server {
	t.Helper()
	svc := func(name string) fake.App {
		return fake.App{Name: name, Daemon: "simple", Enabled: true, Active: true, StartDuration: time.Millisecond, StopDuration: time.Millisecond}
	}
	return fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Version: "1.30", Revision: "10", Confinement: "classic",
		Apps: []fake.App{svc("kubelet"), svc("containerd")}}),
		fake.WithStoreRevision("k8s", fake.StoreRevision{Revision: "11", Version: "1.31", Channel: "1.31/stable"}))
}

// TestRefreshAsK8sd: k8sd's Refresh returns the change id once snapd has
// accepted it, and its RefreshStatus follows it to Done.
func TestRefreshAsK8sd(t *testing.T) {
	srv := k8sRefreshable(t)
	s := newREST(t, srv)
	ctx := context.Background()
	id, err := s.Refresh(ctx, snapservices.RefreshOpts{Channel: "1.31/stable"})
	if err != nil || id == "" {
		t.Fatalf("Refresh: %q %v", id, err)
	}
	if err := srv.WaitFor(ctx, func(v fake.View) bool { return len(v.InProgress()) == 0 }); err != nil {
		t.Fatal(err)
	}
	st, err := s.RefreshStatus(ctx, id)
	if err != nil || st.Status != "Done" || !st.Ready || st.Err != "" {
		t.Fatalf("RefreshStatus: %+v %v", st, err)
	}
	if chg, _ := srv.ChangeByID(id); chg.Kind != "refresh-snap" || chg.Summary != `Refresh "k8s" snap from "1.31/stable" channel` {
		t.Fatalf("change %+v", chg)
	}
	// k8sd's command: --amend, so a snap installed from a file may take
	// the store's.
	for _, r := range srv.Requests() {
		if r.Method == "POST" && r.Path == "/v2/snaps/k8s" && r.Body != `{"action":"refresh","channel":"1.31/stable","amend":true}` {
			t.Fatalf("body %s", r.Body)
		}
	}
	// Nothing newer: no change, as snap --no-wait prints no id.
	if id, err := s.Refresh(ctx, snapservices.RefreshOpts{Channel: "1.31/stable"}); id != "" || err != nil {
		t.Fatalf("second Refresh: %q %v", id, err)
	}
	if _, err := s.RefreshStatus(ctx, "999"); !errors.Is(err, snapsvc.ErrNotFound) {
		t.Fatalf("unknown change: %v", err)
	}
}

func TestRefreshLocalPathAsK8sd(t *testing.T) {
	srv := k8sRefreshable(t)
	s := newREST(t, srv)
	file := filepath.Join(t.TempDir(), "k8s_1.32_amd64.snap")
	if err := os.WriteFile(file, []byte("name: k8s\nversion: '1.32'\nconfinement: classic\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id, err := s.Refresh(context.Background(), snapservices.RefreshOpts{LocalPath: file})
	if err != nil {
		t.Fatal(err)
	}
	chg, _ := srv.ChangeByID(id)
	if chg.Kind != "install-snap" {
		t.Fatalf("change %+v", chg)
	}
}

func TestRefreshEmptyAndStrict(t *testing.T) {
	srv := k8sRefreshable(t)
	if _, err := newREST(t, srv).Refresh(context.Background(), snapservices.RefreshOpts{}); !errors.Is(err, snapservices.ErrEmptyRefresh) {
		t.Fatalf("empty: %v", err)
	}
	strict := newREST(t, srv, snapservices.WithSnapctl(), snapservices.WithClientOptions(snapsvc.WithCookie(srv.Cookie("k8s"))))
	if _, err := strict.Refresh(context.Background(), snapservices.RefreshOpts{Revision: "11"}); !errors.Is(err, snapsvc.ErrRefreshInSnapctl) {
		t.Fatalf("snapctl: %v", err)
	}
	if n := srv.Counters().Requests["POST /v2/snaps/k8s"]; n != 0 {
		t.Fatalf("%d refresh requests", n)
	}
}

// TestRefreshCommandRunner: under a command runner (k8sd's unit tests)
// the snap command k8sd ran is what runs.
func TestRefreshCommandRunner(t *testing.T) {
	var ran [][]string
	s, err := snapservices.New(snapservices.WithInstance("k8s"), snapservices.WithCommandOutput(func(_ context.Context, cmd []string) (string, error) {
		ran = append(ran, cmd)
		return "42\n", nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, to := range []snapservices.RefreshOpts{{Channel: "1.31/stable"}, {Revision: "11"}, {LocalPath: "/tmp/k8s.snap"}} {
		if id, err := s.Refresh(ctx, to); id != "42" || err != nil {
			t.Fatalf("%+v: %q %v", to, id, err)
		}
	}
	want := [][]string{
		{"snap", "refresh", "k8s", "--amend", "--channel", "1.31/stable", "--no-wait"},
		{"snap", "refresh", "k8s", "--amend", "--revision", "11", "--no-wait"},
		{"snap", "install", "/tmp/k8s.snap", "--classic", "--dangerous", "--name", "k8s", "--no-wait"},
	}
	if !slices.EqualFunc(ran, want, slices.Equal[[]string]) {
		t.Fatalf("ran %q, want %q", ran, want)
	}
}
