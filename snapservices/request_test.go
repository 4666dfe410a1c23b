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
		{"k8s", "k8s.kubelet", "", snapsvc.ErrInvalidName},
		{"k8s_dev", "k8s_dev.kubelet", "", snapsvc.ErrInvalidName},
		{"k8s", "microk8s.kubelet", "", snapsvc.ErrWrongSnap},
		{"k8s_dev", "k8s.kubelet", "", snapsvc.ErrWrongSnap},
		{"k8s", "k8s", "", snapsvc.ErrInvalidName},
		{"k8s_dev", "k8s", "", snapsvc.ErrInvalidName},
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
