package plan_test

import (
	"errors"
	"testing"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/plan"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// Inside a configure hook, snapctl service commands are queued until the
// hook ends: a plan cannot gate on readiness there, and says so instead
// of signalling ready while nothing runs.
func TestPlanInConfigureHookFailsClearly(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap()))
	hook := srv.StartHook("k8s", "configure")
	c, err := snapsvc.New(snapsvc.WithSocket(srv.SocketPath()), snapsvc.WithSnapSocket(srv.SnapSocketPath()),
		snapsvc.WithMode(snapsvc.ModeSnapctl), snapsvc.WithCookie(hook.Cookie()), snapsvc.WithHook("configure"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p, err := plan.New([]plan.Service{
		{Name: "k8s.containerd"},
		{Name: "k8s.kubelet", After: []string{"k8s.containerd"}},
	}, plan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Start(ctxT(t), c)
	if !errors.Is(err, plan.ErrQueued) || isClosed(p.Ready()) {
		t.Errorf("plan in a configure hook: err %v, ready %v; want ErrQueued and no ready signal", err, isClosed(p.Ready()))
	}
	hook.Finish()
}
