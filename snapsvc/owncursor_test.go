package snapsvc_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// ownRestarts restarts kubelet twice, each time alone, the first time
// taking first, the second time second, and returns the requests of the
// second restart. It runs on the real clock: snapsvc's cursor is the
// client's clock, which must read snapd's (a manual clock moved by the
// test could move between snapd's answer and the client's next request,
// which no real clock does).
func ownRestarts(t *testing.T, first, second time.Duration) ([]fake.Request, *snapsvc.Result) {
	t.Helper()
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(first/2)), fake.WithVersion(fake.Version277))
	c := newClient(t, srv)
	ctx := ctxT(t)
	// Learns that snapd has notices, and how long a restart takes.
	if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	srv.SetDurations("k8s", "kubelet", second/2, second/2)
	before := len(srv.Requests())
	res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return srv.Requests()[before:], res
}

// An uncontended restart on snapd with notices takes three requests: the
// POST, one long-poll from the time snapd answered it (no request for a
// cursor), one read of the change.
func TestUncontendedRestartThreeRequests(t *testing.T) {
	reqs, res := ownRestarts(t, 70*time.Millisecond, 50*time.Millisecond)
	if len(reqs) != 3 || reqs[0].Path != "/v2/apps" || reqs[1].Path != "/v2/notices" || reqs[2].Path != "/v2/changes/"+res.ChangeID {
		t.Errorf("requests %+v, want POST, one long-poll, one read", reqs)
	}
	if res.Status != "Done" {
		t.Errorf("result %+v", res)
	}
}

// A change that ends before the long-poll starts (here: at once, inside
// snapd's handler) is not missed: the first long-poll is bounded by twice
// the last change's time plus 5 ms, and the change is read when it runs
// out, still in three requests.
func TestOwnChangeEndingBeforeLongPollNotMissed(t *testing.T) {
	reqs, res := ownRestarts(t, 0, 0)
	if len(reqs) != 3 || reqs[1].Path != "/v2/notices" || reqs[2].Path != "/v2/changes/"+res.ChangeID || res.Status != "Done" {
		t.Fatalf("requests %+v, result %+v", reqs, res)
	}
	q, _ := url.ParseQuery(reqs[1].Query)
	if d, err := time.ParseDuration(q.Get("timeout")); err != nil || d > 10*time.Millisecond {
		t.Errorf("first long-poll %q: want a timeout of at most 10ms", reqs[1].Query)
	}
}

// A change that takes much longer than the last one costs two more
// requests (the bounded long-poll runs out, a read finds it running, a
// long-poll from the same cursor), and its end is still seen.
func TestOwnChangeSlowerThanLastOne(t *testing.T) {
	reqs, res := ownRestarts(t, 20*time.Millisecond, 400*time.Millisecond)
	if len(reqs) != 5 || res.Status != "Done" {
		t.Errorf("requests %+v, result %+v: want 5 requests, Done", reqs, res)
	}
	if last := reqs[len(reqs)-1]; last.Path != "/v2/changes/"+res.ChangeID {
		t.Errorf("last request %+v, want the read of the change", last)
	}
}

// Without notices and without the state file (a confined snap on snapd
// 2.57) the wait for an own change idles about as long as the last one
// took before its first read, instead of reading every 20 ms: a restart
// like the last one costs the POST and one or two reads.
func TestBlindOwnChangeFirstReadAtLastDuration(t *testing.T) {
	srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(35*time.Millisecond)), fake.WithVersion(fake.Version257))
	c := newClient(t, srv)
	ctx := ctxT(t)
	for range 2 {
		if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	before := len(srv.Requests())
	res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil || res.Status != "Done" {
		t.Fatalf("%+v, %v", res, err)
	}
	reqs := srv.Requests()[before:]
	if len(reqs) > 3 || len(reqs) < 2 || reqs[1].Path != "/v2/changes/"+res.ChangeID {
		t.Fatalf("requests %+v: want the POST and one or two reads", reqs)
	}
	if first := reqs[1].Time.Sub(reqs[0].Time); first < 70*time.Millisecond {
		t.Errorf("first read %v after the POST, want after about the last restart's 70ms", first)
	}
}
