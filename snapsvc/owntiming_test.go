package snapsvc_test

import (
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// ownRestarts restarts kubelet twice, each time alone, the first time
// taking first, the second time second, and returns the requests of the
// second restart. It runs on the real clock: snapsvc's cursor is the
// client's clock, which must read snapd's (a manual clock moved by the
// test could move between snapd's answer and the client's next request,
// which no real clock does).
func ownRestarts(t *testing.T, first, second time.Duration) ([]fake.Request, *snapsvc.Result) {
	t.Helper()
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(first/2)), fake.WithVersion(fake.Version277))
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

// A change that ends before snapd's answer, like the last one of its kind
// (here: at once, inside snapd's handler), is read at once: two requests,
// the POST and the read that finds it ready, with no long-poll to run out.
func TestOwnChangeEndingBeforeLongPollNotMissed(t *testing.T) {
	reqs, res := ownRestarts(t, 0, 0)
	if len(reqs) != 2 || reqs[1].Path != "/v2/changes/"+res.ChangeID || res.Status != "Done" {
		t.Fatalf("requests %+v, result %+v: want the POST and one read", reqs, res)
	}
}

// A change that takes much longer than the last one costs three more
// requests (the bounded long-poll runs out, a read finds it running, a
// read of its notices gives a cursor in snapd's time, a long-poll from
// it), and its end is still seen. The second long-poll never takes the
// client's time for snapd's (issue 25 defect 8).
func TestOwnChangeSlowerThanLastOne(t *testing.T) {
	reqs, res := ownRestarts(t, 20*time.Millisecond, 400*time.Millisecond)
	if len(reqs) != 6 || res.Status != "Done" {
		t.Errorf("requests %+v, result %+v: want 6 requests, Done", reqs, res)
	}
	if len(reqs) == 6 && (reqs[3].Path != "/v2/notices" || strings.Contains(reqs[3].Query, "after=")) {
		t.Errorf("request 4 %+v: want a read of the change's notices, with no cursor", reqs[3])
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
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(35*time.Millisecond)), fake.WithVersion(fake.Version257))
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

// An instant change (the start of a service already running) is seen
// within 10 ms of its end in at most three requests, even right after a
// slow change of another kind (issue 27: it took 0.4-1.0 s, the bounded
// first long-poll waiting twice the previous change's time): the pace is
// learned per kind, and a kind not seen yet reads its notices first,
// which show an instant change ready.
func TestInstantChangeSeenAtOnce(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(150*time.Millisecond)), fake.WithVersion(fake.Version277))
	c := newClient(t, srv)
	ctx := ctxT(t)
	for i := 0; i < 2; i++ { // a slow kind, learned
		if _, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ { // then an instant one: unseen, then learned
		before := len(srv.Requests())
		lat := testclock.StartLateness()
		res, err := c.Start(ctx, []string{"k8s.kubelet"}, snapsvc.StartOptions{})
		returned := time.Now()
		late := lat.Stop() // a busy machine delays the call as much as any timer
		if err != nil {
			t.Fatal(err)
		}
		reqs := srv.Requests()[before:]
		chg, _ := srv.ChangeByID(res.ChangeID)
		if after := returned.Sub(chg.ReadyTime); after > 10*time.Millisecond+latenessSteps*late {
			t.Errorf("start %d: returned %v after its change was ready, want within 10ms (and 3 times the %v the machine's timers fired late)", i, after, late)
		}
		if len(reqs) > 3 {
			t.Errorf("start %d: %d requests, want at most 3: %+v", i, len(reqs), reqs)
		}
	}
}
