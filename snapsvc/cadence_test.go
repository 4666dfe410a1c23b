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
func blindRun(t testing.TB, srv *fake.Server, mc *fake.ManualClock, c *snapsvc.Client, hold time.Duration, asleep func()) (*snapsvc.Result, time.Time) {
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
// one step of the cadence after the blocker ended (63 ms at worst in the
// first 2 s, 107 ms later), and no 1 s window of the wait's requests (from
// the refusal that began it up to the accepted request, which is the
// wait's end) held more than 20 of them, nor more than 10 once the window
// starts 2 s into the wait. It returns the requests in between.
func checkBlindWait(t *testing.T, srv *fake.Server, path string, end time.Time) (between []fake.Request) {
	t.Helper()
	var refused, accepted time.Time
	reqs := srv.Requests()
	first, last := -1, -1
	for i, r := range reqs {
		if r.Method != "POST" || r.Path != path {
			continue
		}
		switch {
		case r.Status >= 400 && refused.IsZero():
			refused, first = r.Time, i
		case r.Status < 400 && !refused.IsZero():
			accepted, last = r.Time, i
		}
	}
	if refused.IsZero() || accepted.IsZero() {
		t.Fatalf("no refusal then acceptance on %s in %+v", path, srv.Requests())
	}
	step := 70 * time.Millisecond
	if end.Sub(refused) > 2*time.Second {
		step = 110 * time.Millisecond
	}
	if wake := accepted.Sub(end); wake < 0 || wake > step {
		t.Errorf("accepted %v after the blocker ended, want within %v", wake, step)
	}
	var all []time.Time // the wait's requests: from the refusal to the one before the accepted request
	for i := first; i < last; i++ {
		all = append(all, reqs[i].Time)
		if i > first && i < last {
			between = append(between, reqs[i])
		}
	}
	for i := range all {
		limit := 20
		if all[i].Sub(refused) >= 2*time.Second {
			limit = 10
		}
		in := 0
		for j := i; j < len(all) && all[j].Sub(all[i]) < time.Second; j++ {
			in++
		}
		if in > limit {
			t.Errorf("%d requests in the second from %v into the wait, want <= %d", in, all[i].Sub(refused), limit)
			break
		}
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
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithVersion(v), fake.WithClock(mc), fake.WithSnapSocketObserveDenied())
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
			// Issue 44, item 3: one blocker is one conflict, however many
			// polls it refused (the result said 19 conflicts for one).
			if res.Status != "Done" || res.Refused < 15 || res.Refused > 20 || res.Conflicts != 1 || res.Attempts != res.Refused+1 {
				t.Errorf("result %+v: want Done after 15-20 refusals in 1s, one conflict", res)
			}
			checkBlindWait(t, srv, "/v2/snapctl", end)
			if n := srv.Counters().Requests["GET /v2/changes"]; n != 1 {
				t.Errorf("GET /v2/changes asked %d times, want once (refused: no snap-refresh-observe)", n)
			}
		})
	}
}

// A long blocker waited out blind (issue 27: a strict snap without
// snap-refresh-observe, as microceph, microovn and microk8s are): after
// its first 2 s the wait keeps retrying every ~102 ms, about the snap
// command's polling, so the blocker's end is seen within one step, where
// the step used to grow to a second; at most 10 requests in any second
// after the first 2 s.
func TestSnapctlBlindCadenceLongBlocker(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
	for _, hold := range []time.Duration{3 * time.Second, 10*time.Second + 37*time.Millisecond, 30*time.Second + 81*time.Millisecond} {
		t.Run(hold.String(), func(t *testing.T) {
			mc := fake.NewManualClock(time.Now())
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithVersion(fake.Version277), fake.WithClock(mc), fake.WithSnapSocketObserveDenied())
			c := newSnapctlClient(t, srv, srv.Cookie("k8s"), snapsvc.WithClock(testclock.Of(mc)))
			res, end := blindRun(t, srv, mc, c, hold, nil)
			between := checkBlindWait(t, srv, "/v2/snapctl", end)
			// 20 a second for 2 s, then about 10.
			if want := 40 + int((hold-2*time.Second)/(102*time.Millisecond)); len(between) > want+3 || len(between) < want-5 {
				t.Errorf("%d requests while waiting %v, want about %d", len(between), hold, want)
			}
			if res.Status != "Done" {
				t.Errorf("result %+v", res)
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
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)), fake.WithVersion(fake.Version257), fake.WithClock(mc))
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
