package snapsvc_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/internal/flock"
	"github.com/snapsvc/snapsvc/snapsvc"
	"github.com/snapsvc/snapsvc/testsupport/testclock"
)

// blindRun restarts kubelet with c while a foreign service-control change
// holds the snap for hold (on the manual clock that drives both the fake
// and c), and returns the result and the time the foreign change ended.
// The clock moves only while c sleeps: every timer pending is the
// client's pause, or the end of the foreign change.
// asleep, if not nil, runs the first time c sleeps.
func blindRun(t *testing.T, srv *fake.Server, mc *fake.ManualClock, c *snapsvc.Client, hold time.Duration, asleep func()) (*snapsvc.Result, time.Time) {
	t.Helper()
	ctx := ctxT(t)
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "service-control", Snap: "k8s"})
	end := mc.Now().Add(hold)
	type outcome struct {
		res *snapsvc.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- outcome{res, err}
	}()
	finished := false
	for {
		added := mc.TimerAdded()
		if dl, ok := mc.NextDeadline(); ok {
			if asleep != nil {
				asleep()
				asleep = nil
			}
			if !finished && !dl.Before(end) {
				mc.Set(end)
				foreign.Finish()
				finished = true
			}
			mc.AdvanceToNext()
			continue
		}
		select {
		case o := <-done:
			if o.err != nil {
				t.Fatal(o.err)
			}
			if !finished {
				t.Fatalf("returned %+v before the foreign change ended", o.res)
			}
			return o.res, end
		case <-added:
		case <-ctx.Done():
			t.Fatal("stuck")
		}
	}
}

// checkBlindWait checks the requests of a blind wait from the first
// refusal to the accepted action on path: the action was accepted within
// one step of the cadence (70 ms at worst) after the blocker ended, at no
// more than 20 requests per second in between, and it returns them.
func checkBlindWait(t *testing.T, srv *fake.Server, path string, end time.Time) (between []fake.Request) {
	t.Helper()
	var refused, accepted time.Time
	for _, r := range srv.Requests() {
		if r.Method != "POST" || r.Path != path {
			continue
		}
		switch {
		case r.Status >= 400 && refused.IsZero():
			refused = r.Time
		case r.Status < 400 && !refused.IsZero():
			accepted = r.Time
		}
	}
	if refused.IsZero() || accepted.IsZero() {
		t.Fatalf("no refusal then acceptance on %s in %+v", path, srv.Requests())
	}
	if wake := accepted.Sub(end); wake < 0 || wake > 70*time.Millisecond {
		t.Errorf("accepted %v after the blocker ended, want within 70ms", wake)
	}
	for _, r := range srv.Requests() {
		if r.Time.After(refused) && r.Time.Before(accepted) {
			between = append(between, r)
		}
	}
	if rate := float64(len(between)) / accepted.Sub(refused).Seconds(); rate > 20 {
		t.Errorf("%d requests in the %v waited: %.1f/s, want <= 20/s", len(between), accepted.Sub(refused), rate)
	}
	return between
}

// A snap without snap-refresh-observe cannot list the blocker: snapctl is
// retried on the blind cadence (not the generic backoff of 250 ms growing
// to 1 s), and the refused listing is not asked again.
func TestSnapctlBlindCadence(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	for _, v := range []fake.Version{fake.Version257, fake.Version277} {
		t.Run(string(v), func(t *testing.T) {
			mc := fake.NewManualClock(time.Now())
			srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithVersion(v), fake.WithClock(mc), fake.WithSnapSocketObserveDenied())
			c := newSnapctlClient(t, srv, srv.Cookie("k8s"), snapsvc.WithClock(testclock.Of(mc)))
			// While it sleeps between retries it holds no file lock: a
			// hook of the blocking change may need it.
			lockFile := filepath.Join(filepath.Dir(srv.SnapSocketPath()), ".snapsvc-lock", "k8s.lock")
			res, end := blindRun(t, srv, mc, c, time.Second, func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				l, err := flock.Acquire(ctx, lockFile)
				if err != nil {
					t.Errorf("file lock held while waiting blind: %v", err)
					return
				}
				l.Unlock()
			})
			if res.Status != "Done" || res.Conflicts < 15 || res.Conflicts > 21 {
				t.Errorf("result %+v: want Done after 15-21 refusals in 1s", res)
			}
			checkBlindWait(t, srv, "/v2/snapctl", end)
			if n := srv.Counters().Requests["GET /v2/changes"]; n != 1 {
				t.Errorf("GET /v2/changes asked %d times, want once (refused: no snap-refresh-observe)", n)
			}
		})
	}
}

// REST without notices and without the state file (a confined snap with
// snapd-control on snapd 2.57): the first 2 s of a wait retry on the
// cadence without listing; a longer blocker is then listed and read at
// the poll interval.
func TestRESTBlindCadence(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	for _, tc := range []struct {
		hold   time.Duration
		listed bool
	}{
		{hold: 300 * time.Millisecond},
		{hold: time.Second},
		{hold: 3 * time.Second, listed: true},
	} {
		t.Run(tc.hold.String(), func(t *testing.T) {
			mc := fake.NewManualClock(time.Now())
			srv := fake.NewServer(t, fake.WithSnaps(k8sSnap(0)), fake.WithVersion(fake.Version257), fake.WithClock(mc))
			c := newClient(t, srv, snapsvc.WithClock(testclock.Of(mc)))
			// A caller that has made a call before knows snapd has no notices.
			warm := make(chan error, 1)
			go func() {
				_, err := c.Restart(context.Background(), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
				warm <- err
			}()
			if err := testclock.Drive(t, mc, time.Hour, warm); err != nil {
				t.Fatal(err)
			}
			before := len(srv.Requests())
			_, end := blindRun(t, srv, mc, c, tc.hold, nil)
			checkBlindWait(t, srv, "/v2/apps", end)
			lists := 0
			for _, r := range srv.Requests()[before:] {
				if r.Method == "GET" && r.Path == "/v2/changes" {
					lists++
				}
			}
			if want := map[bool]int{false: 0, true: 1}[tc.listed]; lists != want {
				t.Errorf("blocker listed %d times, want %d", lists, want)
			}
		})
	}
}
