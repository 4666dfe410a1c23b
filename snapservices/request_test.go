package snapservices_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/snapsvc/snapsvc/snapservices"
	"github.com/snapsvc/snapsvc/snapsvc"
)

func TestParseRequestFlags(t *testing.T) {
	// What snap start/stop/restart accept (cmd/snap/cmd_services.go).
	valid := map[string][]string{
		"start":   {"--enable", "--no-wait"},
		"stop":    {"--disable", "--no-wait"},
		"restart": {"--reload", "--no-wait"},
	}
	every := []string{"--enable", "--disable", "--reload", "--no-wait"}
	for action, ok := range valid {
		for _, flag := range every {
			req, err := snapservices.ParseRequest("k8s", action, []string{"kubelet"}, flag)
			if slices.Contains(ok, flag) {
				if err != nil {
					t.Errorf("%s %s: %v", action, flag, err)
					continue
				}
				got := map[string]bool{"--enable": req.Enable, "--disable": req.Disable, "--reload": req.Reload, "--no-wait": req.NoWait}
				for f, set := range got {
					if set != (f == flag) {
						t.Errorf("%s %s: %s = %t", action, flag, f, set)
					}
				}
				continue
			}
			if !errors.Is(err, snapservices.ErrUnknownFlag) || !strings.Contains(err.Error(), flag) || !strings.Contains(err.Error(), "snap "+action) {
				t.Errorf("%s %s: %v: want ErrUnknownFlag naming the flag and the action", action, flag, err)
			}
		}
		for _, flag := range []string{"--force", "-f", "--enable=true", "kubelet"} {
			_, err := snapservices.ParseRequest("k8s", action, []string{"kubelet"}, flag)
			if !errors.Is(err, snapservices.ErrUnknownFlag) || !strings.Contains(err.Error(), flag) {
				t.Errorf("%s %s: %v", action, flag, err)
			}
		}
		for _, flag := range []string{"--system", "--user", "--users=all", "--users"} {
			_, err := snapservices.ParseRequest("k8s", action, []string{"kubelet"}, flag)
			if !errors.Is(err, snapservices.ErrUnsupportedFlag) || !strings.Contains(err.Error(), flag) {
				t.Errorf("%s %s: %v", action, flag, err)
			}
		}
	}
	req, err := snapservices.ParseRequest("k8s", "stop", []string{"kubelet", "kube-proxy"}, "--disable", "--no-wait")
	if err != nil || !req.Disable || !req.NoWait || req.Action != "stop" || !slices.Equal(req.Names, []string{"k8s.kubelet", "k8s.kube-proxy"}) {
		t.Fatalf("%+v, %v", req, err)
	}
	if _, err := snapservices.ParseRequest("k8s", "reload", []string{"kubelet"}); err == nil || !strings.Contains(err.Error(), `"reload"`) {
		t.Fatalf("unknown action: %v", err)
	}
}

func TestParseRequestNames(t *testing.T) {
	for _, c := range []struct {
		instance, name, want string
		err                  error
	}{
		{"k8s", "kubelet", "k8s.kubelet", nil},
		{"k8s", "kube-apiserver", "k8s.kube-apiserver", nil},
		{"k8s_dev", "kubelet", "k8s_dev.kubelet", nil},
		// k8sd's contract: "either prefixed or not", and the snap's own
		// name for all of its services (k8sd pkg/snap/service.go).
		{"k8s", "k8s.kubelet", "k8s.kubelet", nil},
		{"k8s_dev", "k8s_dev.kubelet", "k8s_dev.kubelet", nil},
		{"k8s", "k8s", "k8s", nil},
		{"k8s_dev", "k8s_dev", "k8s_dev", nil},
		{"k8s", "microk8s.kubelet", "", snapsvc.ErrWrongSnap},
		{"k8s_dev", "k8s.kubelet", "", snapsvc.ErrWrongSnap},
		{"k8s_dev", "k8s", "", snapsvc.ErrWrongSnap},
		{"k8s", "k8s.", "", snapsvc.ErrInvalidName},
		{"k8s", "k8s.kube_let", "", snapsvc.ErrInvalidName},
		{"k8s", "k8s.a.b", "", snapsvc.ErrInvalidName},
		{"k8s", "", "", snapsvc.ErrInvalidName},
		{"k8s", "kube_let", "", snapsvc.ErrInvalidName},
		{"k8s", "-kubelet", "", snapsvc.ErrInvalidName},
	} {
		req, err := snapservices.ParseRequest(c.instance, "restart", []string{c.name})
		if c.err == nil {
			if err != nil || !slices.Equal(req.Names, []string{c.want}) {
				t.Errorf("%s in %s: %v, %v", c.name, c.instance, req.Names, err)
			}
			continue
		}
		var opErr *snapsvc.OpError
		if !errors.Is(err, c.err) || !errors.As(err, &opErr) || opErr.Retryable() || opErr.Op != "restart" || opErr.Snap != c.instance {
			t.Errorf("%q in %s: %v: want a non-retryable *OpError wrapping %v", c.name, c.instance, err, c.err)
		}
	}
	if _, err := snapservices.ParseRequest("k8s", "start", nil, "--enable"); !errors.Is(err, snapsvc.ErrNoNames) {
		t.Fatalf("no names: %v", err)
	}
}

func TestRequestCommandAndImpliedFlags(t *testing.T) {
	// The command lines k8sd's own tests expect (pkg/snap/snap_test.go).
	for _, c := range []struct {
		action   string
		services []string
		extra    []string
		want     string
	}{
		{"start", []string{"test-service"}, nil, "snap start k8s.test-service --enable"},
		{"start", []string{"test-service"}, []string{"--no-wait"}, "snap start k8s.test-service --enable --no-wait"},
		{"stop", []string{"test-service"}, nil, "snap stop k8s.test-service --disable"},
		{"stop", []string{"k8s.test-service"}, []string{"--no-wait"}, "snap stop k8s.test-service --disable --no-wait"},
		{"restart", []string{"test-service"}, nil, "snap restart k8s.test-service"},
		{"restart", []string{"k8s"}, []string{"--no-wait"}, "snap restart k8s --no-wait"},
	} {
		req, err := snapservices.ParseRequest("k8s", c.action, c.services, snapservices.ImplyFlags(c.action, c.extra)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(req.Command(), " "); got != c.want {
			t.Errorf("%s %v %v: %q, want %q", c.action, c.services, c.extra, got, c.want)
		}
	}
	req, err := snapservices.ParseRequest("k8s", "start", []string{"kubelet"}, snapservices.ImplyFlags("start", []string{"--enable"})...)
	if err != nil || !req.Enable || !slices.Equal(req.Args, []string{"--enable", "--enable"}) {
		t.Fatalf("an explicit --enable on top of the implied one: %+v, %v", req, err)
	}
	extra := []string{"--no-wait"}
	_ = snapservices.ImplyFlags("start", extra)
	if !slices.Equal(extra, []string{"--no-wait"}) {
		t.Fatal("ImplyFlags changed its argument")
	}
}
