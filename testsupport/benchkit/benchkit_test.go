package benchkit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/snapsvc/snapsvc/fake"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPercentile(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		out := make([]time.Duration, len(n))
		for i, v := range n {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	in := ms(5, 1, 4, 2, 3, 10, 9, 8, 7, 6)
	for _, tc := range []struct {
		p    float64
		want int
	}{{50, 5}, {99, 10}, {100, 10}, {10, 1}, {1, 1}, {90, 9}} {
		got, ok := Percentile(in, tc.p)
		if !ok || got != time.Duration(tc.want)*time.Millisecond {
			t.Errorf("p%v = %v, %v; want %dms", tc.p, got, ok, tc.want)
		}
	}
	if in[0] != 5*time.Millisecond {
		t.Errorf("Percentile sorted its input: %v", in)
	}
	if _, ok := Percentile(nil, 50); ok {
		t.Error("Percentile of nothing reported a value")
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		4310 * time.Microsecond: "4.31ms", 287 * time.Millisecond: "287ms",
		2930 * time.Millisecond: "2.93s", 12500 * time.Millisecond: "12.5s",
	} {
		if got := FormatDuration(d, true); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
	if got := FormatDuration(time.Second, false); got != "–" {
		t.Errorf("no value printed as %q", got)
	}
}

func TestUnionLengthContains(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	u := Union([]Interval{{at(50), at(60)}, {at(0), at(10)}, {at(5), at(20)}, {at(70), at(70)}, {at(20), at(30)}})
	if len(u) != 2 || !u[0].From.Equal(at(0)) || !u[0].To.Equal(at(30)) || !u[1].From.Equal(at(50)) {
		t.Fatalf("Union = %v", u)
	}
	if got := Length(u); got != 40*time.Millisecond {
		t.Errorf("Length = %v, want 40ms", got)
	}
	for ms, want := range map[int]bool{0: false, 1: true, 29: true, 30: false, 31: false, 55: true, 60: false, 70: false} {
		if got := Contains(u, at(ms)); got != want {
			t.Errorf("Contains(%dms) = %v, want %v", ms, got, want)
		}
	}
}

func k8s() fake.Snap {
	app := func(n string) fake.App {
		return fake.App{Name: n, Daemon: "simple", Enabled: true, Active: true}
	}
	return fake.Snap{Name: "k8s", Apps: []fake.App{app("kubelet"), app("containerd")}}
}

func newFor(t *testing.T, name string, srv *fake.Server) Strategy {
	t.Helper()
	st, err := New(name, Target{Socket: srv.SocketPath(), SnapSocket: srv.SnapSocketPath(), Cookie: srv.Cookie("k8s")}, Config{Scale: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if st.Name() != name {
		t.Errorf("New(%q).Name() = %q", name, st.Name())
	}
	return st
}

var restartKubelet = Call{Action: "restart", Names: []string{"k8s.kubelet"}}

// Against a change that never ends, naive gives up at once and fixed after
// its five attempts; the calls after a failed one are not attempted.
func TestGivingUp(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		attempts int
	}{{Naive, 1}, {Fixed, FixedAttempts}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8s()))
			srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
			outs := newFor(t, tc.name, srv).Sequence(ctx, restartKubelet, restartKubelet)
			o := outs[0]
			if !o.Failed() || o.Attempts != tc.attempts || o.Conflicts != tc.attempts || o.ChangeID != "" {
				t.Errorf("first call %+v: want failed after %d refused attempts", o, tc.attempts)
			}
			if !strings.Contains(o.Err.Error(), "configure-snap") {
				t.Errorf("error %v does not name the blocking change", o.Err)
			}
			if s := outs[1]; !errors.Is(s.Err, ErrSkipped) || s.Attempts != 0 || !s.Start.IsZero() {
				t.Errorf("second call %+v: want skipped", s)
			}
			if got := srv.Counters().Conflicts; got != tc.attempts {
				t.Errorf("snapd refused %d requests, want %d", got, tc.attempts)
			}
		})
	}
}

// backoff and snapsvc get through once the blocker ends: every attempt but
// the last was refused, and the call made exactly one change.
func TestWaitingOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, name := range []string{Backoff, Snapsvc} {
		t.Run(name, func(t *testing.T) {
			srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8s()))
			blk := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
			st := newFor(t, name, srv)
			done := make(chan []Outcome, 1)
			go func() { done <- st.Sequence(ctx, restartKubelet) }()
			// The first request is the POST; once it is answered (the
			// log holds it), snapd has refused it.
			if err := srv.WaitFor(ctx, func(v fake.View) bool { return v.Requests() >= 1 }); err != nil {
				t.Fatal(err)
			}
			if n := srv.Counters().Conflicts; n != 1 {
				t.Fatalf("%d conflicts answered before the blocker ends, want 1", n)
			}
			blk.Finish()
			o := (<-done)[0]
			if o.Failed() || o.Attempts < 2 || o.Conflicts != o.Attempts-1 || o.ChangeID == "" {
				t.Fatalf("outcome %+v: want done after refused attempts", o)
			}
			if chg, ok := srv.ChangeByID(o.ChangeID); !ok || chg.Kind != "service-control" || chg.Status != "Done" {
				t.Errorf("change %s: %+v", o.ChangeID, chg)
			}
			if got := srv.Counters().ChangesCreated; got != 2 {
				t.Errorf("%d changes created, want the blocker and ours", got)
			}
			if ids := OwnChanges([]Outcome{o}); len(ids) != 1 || ids[0] != o.ChangeID {
				t.Errorf("OwnChanges = %v", ids)
			}
		})
	}
}

// fixed retries the whole sequence, as k8sd's bootstrap does: a refusal
// of the second call makes the first run again.
func TestFixedRetriesTheWholeSequence(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8s()))
	srv.InjectFault(fake.Fault{
		Kind: fake.FaultReply, Method: "POST", Path: "/v2/apps", Times: 1,
		Match:  func(r fake.Request) bool { return strings.Contains(r.Body, "containerd") },
		Status: 400, Body: fake.ErrorBody(400, "", `snap "k8s" has "configure-snap" change in progress`),
	})
	outs := newFor(t, Fixed, srv).Sequence(context.Background(),
		Call{Action: "start", Names: []string{"k8s.kubelet"}}, Call{Action: "start", Names: []string{"k8s.containerd"}})
	if a, b := outs[0], outs[1]; a.Failed() || b.Failed() || a.Attempts != 2 || b.Attempts != 2 || a.Conflicts != 0 || b.Conflicts != 1 {
		t.Fatalf("outcomes %+v / %+v: want both done, both sent twice, the second refused once", a, b)
	}
	if got := srv.Counters().ChangesCreated; got != 3 {
		t.Errorf("%d changes created, want 3 (kubelet twice, containerd once)", got)
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New("sleepy", Target{Socket: "x"}, Config{}); err == nil {
		t.Error("unknown strategy accepted")
	}
	if _, err := New(Naive, Target{Socket: "x"}, Config{}); err == nil {
		t.Error("naive without a cookie accepted")
	}
	if got := FixedPauseAt(0.5); got != FixedPause {
		t.Errorf("FixedPauseAt(0.5) = %v, want the real pause", got)
	}
	if got := FixedPauseAt(100); got != 50*time.Millisecond {
		t.Errorf("FixedPauseAt(100) = %v", got)
	}
}
