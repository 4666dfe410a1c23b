package fake_test

import (
	"testing"

	"github.com/snapsvc/snapsvc/fake"
)

// A foreign change put in Wait (waiting for a reboot) is not ready and
// reports Wait until the test finishes it.
func TestChangeWait(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(fake.Snap{Name: "k8s", Apps: []fake.App{{Name: "kubelet", Daemon: "simple"}}}))
	c := s.AddChange(fake.ChangeSpec{Kind: "auto-refresh", Snap: "k8s"})
	c.Wait()
	if info := c.Info(); info.Status != fake.StatusWait || info.Ready {
		t.Fatalf("after Wait: %+v", info)
	}
	select {
	case <-c.Ready():
		t.Fatal("a waiting change is ready")
	default:
	}
	c.Finish()
	if info := c.Info(); info.Status != fake.StatusDone || !info.Ready {
		t.Fatalf("after Finish: %+v", info)
	}
}
