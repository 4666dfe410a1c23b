package fake_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 12, 2, 14, 0, 0, 0, time.UTC)

func demo() fake.Snap {
	return fake.Snap{Name: "svcdemo", Apps: []fake.App{
		{Name: "alpha", Daemon: "simple", Enabled: true, Active: true},
		{Name: "beta", Daemon: "simple", Enabled: true, Active: true, After: []string{"alpha"}},
		{Name: "gamma", Daemon: "simple", Enabled: true, Active: true, StopDuration: 20 * time.Second},
		{Name: "slowstart", Daemon: "forking", StartDuration: 20 * time.Second},
		{Name: "broken", Daemon: "oneshot", FailStart: fake.SystemctlJobFailed("svcdemo", "broken")},
		{Name: "ctl"},
	}}
}

type change struct {
	ID      string `json:"id"`
	Kind    string `json:"kind"`
	Summary string `json:"summary"`
	Status  string `json:"status"`
	Ready   bool   `json:"ready"`
	Err     string `json:"err"`
	Tasks   []struct {
		Kind    string         `json:"kind"`
		Summary string         `json:"summary"`
		Status  string         `json:"status"`
		Log     []string       `json:"log"`
		Data    map[string]any `json:"data"`
	} `json:"tasks"`
}

func TestStartStopConflictManualClock(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	code, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
	if code != 202 || e.Type != "async" || e.Change == "" {
		t.Fatalf("got %d %+v", code, e)
	}
	// conflict while gamma stops
	code, e = call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	if r := errOf(t, e); code != 400 || r.Kind != "" || r.Message != `snap "svcdemo" has "service-control" change in progress` {
		t.Fatalf("got %d %+v", code, r)
	}
	if st, _ := s.Service("svcdemo", "gamma"); !st.Active {
		t.Fatal("gamma stopped too early")
	}
	id := e.Change
	_ = id
	reqs := s.Requests()
	chID := reqs[0].Change
	var ch change
	_, e = call(t, s.SocketPath(), "GET", "/v2/changes/"+chID, "")
	decode(t, e.Result, &ch)
	if ch.Status != "Doing" || len(ch.Tasks[0].Log) != 0 {
		t.Fatalf("change %+v", ch)
	}
	// still stopping a second in: "Waiting for ... to stop."
	clk.Advance(time.Second)
	_, e = call(t, s.SocketPath(), "GET", "/v2/changes/"+chID, "")
	decode(t, e.Result, &ch)
	if ch.Status != "Doing" || len(ch.Tasks[0].Log) != 1 || !strings.HasSuffix(ch.Tasks[0].Log[0], ` INFO Waiting for "snap.svcdemo.gamma.service" to stop.`) {
		t.Fatalf("change %+v", ch)
	}
	clk.Advance(19 * time.Second)
	_, e = call(t, s.SocketPath(), "GET", "/v2/changes/"+chID, "")
	decode(t, e.Result, &ch)
	if ch.Status != "Done" || !ch.Ready {
		t.Fatalf("change %+v", ch)
	}
	if st, _ := s.Service("svcdemo", "gamma"); st.Active || !st.Enabled {
		t.Fatalf("gamma %+v", st)
	}
	info, _ := s.ChangeByID(chID)
	if !info.ReadyTime.Equal(t0.Add(20 * time.Second)) {
		t.Fatalf("ready time %v", info.ReadyTime)
	}
	c := s.Counters()
	if c.Conflicts != 1 || c.Requests["POST /v2/apps"] != 2 || c.ChangesCreated != 1 || c.Requests["GET /v2/changes/{id}"] != 3 {
		t.Fatalf("counters %+v", c)
	}
}

func TestFailedStartRollsBackBatch(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithVersion(fake.Version257))
	s.SetService("svcdemo", "alpha", fake.AppState{})
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","enable":true,"names":["svcdemo.broken","svcdemo.alpha"]}`)
	var ch change
	_, e2 := call(t, s.SocketPath(), "GET", "/v2/changes/"+e.Change, "")
	decode(t, e2.Result, &ch)
	if ch.Status != "Error" || !strings.HasPrefix(ch.Err, "cannot perform the following tasks:\n- Run service command \"start\" for services [\"alpha\" \"broken\"] of snap \"svcdemo\" (systemctl command [start snap.svcdemo.broken.service] failed") {
		t.Fatalf("%+v", ch)
	}
	for _, app := range []string{"alpha", "broken"} {
		if st, _ := s.Service("svcdemo", app); st.Active || st.Enabled {
			t.Fatalf("%s not rolled back: %+v", app, st)
		}
	}
}

func TestSnapctlEphemeralWaitsAndHookQueues(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk), fake.WithVersion(fake.Version257))
	done := make(chan env, 1)
	added := clk.TimerAdded()
	go func() {
		_, e := call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", `{"context-id":"`+s.Cookie("svcdemo")+`","args":["stop","svcdemo.gamma"]}`)
		done <- e
	}()
	<-added // the stop step is waiting on the clock
	// a conflict through snapctl has the 2.57 prefix
	_, e := call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", `{"context-id":"`+s.Cookie("svcdemo")+`","args":["restart","svcdemo.alpha"]}`)
	if r := errOf(t, e); r.Message != `error running snapctl: snap "svcdemo" has "service-control" change in progress` {
		t.Fatalf("%+v", r)
	}
	// for=svcdemo does not see the snapctl change
	_, e = call(t, s.SocketPath(), "GET", "/v2/changes?for=svcdemo&select=all", "")
	if string(e.Result) != "[]" {
		t.Fatalf("%s", e.Result)
	}
	if err := s.AdvanceUntilIdle(context.Background()); err != nil {
		t.Fatal(err)
	}
	e = <-done
	if e.Type != "sync" || string(e.Result) != `{"stdout":"","stderr":""}` {
		t.Fatalf("%+v %s", e, e.Result)
	}

	// configure hook: queued, returns at once, runs after the hook
	h := s.StartHook("svcdemo", "configure")
	_, e = call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"start","names":["svcdemo.gamma"]}`)
	if r := errOf(t, e); r.Message != `snap "svcdemo" has "configure-snap" change in progress` {
		t.Fatalf("%+v", r)
	}
	_, e = call(t, s.SnapSocketPath(), "POST", "/v2/snapctl", `{"context-id":"`+h.Cookie()+`","args":["start","svcdemo.gamma"]}`)
	if e.Type != "sync" {
		t.Fatalf("%s", e.Result)
	}
	if st, _ := s.Service("svcdemo", "gamma"); st.Active {
		t.Fatal("started before hook finished")
	}
	h.Finish()
	if st, _ := s.Service("svcdemo", "gamma"); !st.Active {
		t.Fatal("not started after hook finished")
	}
	info, _ := s.ChangeByID(h.ChangeID())
	if info.Status != "Done" || len(info.Tasks) != 3 {
		t.Fatalf("%+v", info)
	}
}

func TestNoticesLongPoll(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithClock(clk))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"stop","names":["svcdemo.gamma"]}`)
	id := e.Change
	var ns []struct {
		Key          string    `json:"key"`
		Occurrences  int       `json:"occurrences"`
		LastRepeated time.Time `json:"last-repeated"`
	}
	_, e = call(t, s.SocketPath(), "GET", "/v2/notices?types=change-update&keys="+id, "")
	decode(t, e.Result, &ns)
	if len(ns) != 1 || ns[0].Occurrences != 2 {
		t.Fatalf("%s", e.Result)
	}
	after := ns[0].LastRepeated.Format(time.RFC3339Nano)
	got := make(chan env, 1)
	added := clk.TimerAdded()
	go func() {
		_, e := call(t, s.SocketPath(), "GET", "/v2/notices?types=change-update&keys="+id+"&after="+after+"&timeout=30s", "")
		got <- e
	}()
	<-added
	clk.Advance(20 * time.Second)
	e = <-got
	decode(t, e.Result, &ns)
	if len(ns) != 1 || ns[0].Occurrences != 3 {
		t.Fatalf("%s", e.Result)
	}
	// timeout with nothing
	go func() {
		_, e := call(t, s.SocketPath(), "GET", "/v2/notices?keys=999&timeout=3s", "")
		got <- e
	}()
	// wait for the long-poll's timer then expire it
	waitTimers(clk, 1)
	clk.Advance(3 * time.Second)
	if e := <-got; string(e.Result) != "[]" {
		t.Fatalf("%s", e.Result)
	}
}

// waitTimers blocks until at least n timers are pending on clk.
func waitTimers(clk *fake.ManualClock, n int) {
	for {
		ch := clk.TimerAdded()
		if clk.Pending() >= n {
			return
		}
		<-ch
	}
}
