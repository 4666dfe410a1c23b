package fake_test

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/snapsvc/snapsvc/fake"
)

// rawCall sends one request and returns the status, the body it could
// read and the read error (nil status and error when no answer came).
func rawCall(sock, method, path, body string) (int, string, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, "http://localhost"+path, rd)
	rsp, err := client(sock).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer rsp.Body.Close()
	b, err := io.ReadAll(rsp.Body)
	return rsp.StatusCode, string(b), err
}

func TestInjectFaultKinds(t *testing.T) {
	const stop = `{"action":"stop","names":["svcdemo.alpha"]}`
	for _, tc := range []struct {
		kind        fake.FaultKind
		acts        bool // a change is created
		noAnswer    bool // the client gets no status line
		cutBody     bool // the body ends early
		wantStatus  int
		bodyHasJSON bool
	}{
		{kind: fake.FaultDrop, acts: true, noAnswer: true},
		{kind: fake.FaultReject, noAnswer: true},
		{kind: fake.FaultCut, acts: true, cutBody: true, wantStatus: 202},
		{kind: fake.FaultGarble, acts: true, wantStatus: 202},
		{kind: fake.FaultReply, wantStatus: 500, bodyHasJSON: true},
	} {
		t.Run(tc.kind.String(), func(t *testing.T) {
			s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()))
			inj := s.InjectFault(fake.Fault{Kind: tc.kind, Method: "POST", Path: "/v2/apps", Times: 1,
				Status: 500, Body: fake.ErrorBody(500, "", "request canceled")})
			status, body, err := rawCall(s.SocketPath(), "POST", "/v2/apps", stop)
			switch {
			case tc.noAnswer:
				if err == nil {
					t.Fatalf("got an answer: %d %s", status, body)
				}
			case tc.cutBody:
				if status != tc.wantStatus || !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("status %d, err %v, body %q: want %d and a body cut short", status, err, body, tc.wantStatus)
				}
			default:
				if err != nil || status != tc.wantStatus {
					t.Fatalf("status %d, err %v: want %d", status, err, tc.wantStatus)
				}
				if got := strings.HasPrefix(body, "{"); got != tc.bodyHasJSON {
					t.Fatalf("body %q", body)
				}
			}
			if inj.Hits() != 1 {
				t.Fatalf("hits %d", inj.Hits())
			}
			reqs := s.Requests()
			if len(reqs) != 1 || reqs[0].Fault != tc.kind.String() {
				t.Fatalf("request log %+v", reqs)
			}
			if created := s.Counters().ChangesCreated; (created == 1) != tc.acts {
				t.Fatalf("changes created %d, acts %v", created, tc.acts)
			}
			if tc.kind == fake.FaultReply && reqs[0].Message != "request canceled" {
				t.Fatalf("logged %+v", reqs[0])
			}
			// Times: 1 — the next request is answered normally.
			if code, _ := call(t, s.SocketPath(), "POST", "/v2/apps", stop); code != 202 {
				t.Fatalf("after the fault: %d", code)
			}
		})
	}
}

func TestInjectFaultSelectorsAndRemove(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()))
	empty := s.InjectFault(fake.Fault{Kind: fake.FaultReply, Path: "/v2/changes/",
		Match: func(r fake.Request) bool { return strings.Contains(r.Query, "x=1") },
		Body:  fake.SyncBody([]string{})})
	code, e := call(t, s.SocketPath(), "GET", "/v2/changes/1?x=1", "")
	if code != 200 || string(e.Result) != "[]" {
		t.Fatalf("%d %s", code, e.Result)
	}
	// Query not matched: the real answer (no such change).
	if code, _ := call(t, s.SocketPath(), "GET", "/v2/changes/1", ""); code != 404 {
		t.Fatalf("unmatched: %d", code)
	}
	// Other path, other socket: not matched.
	if code, _ := call(t, s.SocketPath(), "GET", "/v2/changes?x=1", ""); code != 200 {
		t.Fatalf("prefix matched /v2/changes: %d", code)
	}
	if empty.Hits() != 1 {
		t.Fatalf("hits %d", empty.Hits())
	}
	empty.Remove()
	if code, _ := call(t, s.SocketPath(), "GET", "/v2/changes/1?x=1", ""); code != 404 {
		t.Fatalf("after Remove: %d", code)
	}
	snapOnly := s.InjectFault(fake.Fault{Kind: fake.FaultReject, Socket: "snap"})
	if code, _ := call(t, s.SocketPath(), "GET", "/v2/apps", ""); code != 200 {
		t.Fatalf("main socket affected: %d", code)
	}
	if _, _, err := rawCall(s.SnapSocketPath(), "POST", "/v2/snapctl", `{}`); err == nil {
		t.Fatal("snap socket not affected")
	}
	s.ClearFaults()
	if snapOnly.Hits() != 1 {
		t.Fatalf("hits %d", snapOnly.Hits())
	}
	if code, _, _ := rawCall(s.SnapSocketPath(), "POST", "/v2/snapctl", `{}`); code == 0 {
		t.Fatal("still rejected after ClearFaults")
	}
}

// A whole-snap reload is summarised like a whole-snap restart, with the
// command's action (overlord/servicestate/servicestate.go tests the
// request's action, "restart", for the generic wording).
func TestWholeSnapReloadSummary(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()))
	_, e := call(t, s.SocketPath(), "POST", "/v2/apps", `{"action":"restart","names":["svcdemo"],"reload":true}`)
	info, ok := s.ChangeByID(e.Change)
	if !ok || len(info.Tasks) != 1 || info.Tasks[0].Summary != `Run service command "reload-or-restart" for running services of snap "svcdemo"` {
		t.Fatalf("%+v", info)
	}
}

// WithStateFile: the state file is rewritten (by rename) as the state
// changes, and already says a change is done when the change reads ready.
func TestStateFile(t *testing.T) {
	s := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(demo()), fake.WithStateFile())
	if s.StateFile() == "" || fake.NewServer(t, fake.AllowNonRoot()).StateFile() != "" {
		t.Fatal("StateFile only with WithStateFile")
	}
	chg := s.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "svcdemo"})
	read := func() string {
		b, err := os.ReadFile(s.StateFile())
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if before := read(); !strings.Contains(before, `"id":"`+chg.ID()+`","status":"Doing"`) {
		t.Fatalf("state file %s", before)
	}
	chg.Finish()
	<-chg.Ready()
	if after := read(); !strings.Contains(after, `"id":"`+chg.ID()+`","status":"Done"`) {
		t.Fatalf("state file after the change %s", after)
	}
}
