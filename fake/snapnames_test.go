package fake_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/snapsvc/snapsvc/fake"
)

// TestHeldChangesListedForTheirSnap checks that a held change carries
// "snap-names" exactly where snapd's would, so that GET
// /v2/changes?for=SNAP (snap changes SNAP) lists it:
//
//   - a configure-snap change held through the control API (fakesnapd ctl
//     hold configure-snap svcdemo) is listed for svcdemo as the captured
//     `snap set` change of snapd 2.77.1 (testdata/2.77.1/
//     changes-in-progress-configure.json, the only change in progress
//     then; daemon/api_snap_conf.go makes it with snap-names [svcdemo]),
//     body for body;
//   - an install-snap held with AddChange is listed, as the captures list
//     the install of svcdemo (changes-svcdemo in both capture sets);
//   - a snapctl-made service-control change (WithoutSnapNames, and one
//     snapctl really makes) is not, as the captures' changes-after-snapctl
//     leave out the "Running service command for snap" changes; /v2/apps'
//     own change is.
func TestHeldChangesListedForTheirSnap(t *testing.T) {
	clk := fake.NewManualClock(t0)
	s := fake.NewServer(t, fake.WithVersion(fake.Version277), fake.WithClock(clk), fake.WithSnaps(svcdemo277()), fake.AllowNonRoot())
	ctl := func(body string) fake.ChangeInfo {
		t.Helper()
		rec := httptest.NewRecorder()
		s.ControlHandler().ServeHTTP(rec, httptest.NewRequest("POST", "/changes", strings.NewReader(body)))
		var info fake.ChangeInfo
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &info) != nil {
			t.Fatalf("control POST /changes %s: %d %s", body, rec.Code, rec.Body)
		}
		return info
	}

	held := ctl(`{"kind":"configure-snap","snap":"svcdemo"}`)
	g := &goldenRun{t: t, s: s, clk: clk}
	code, b := g.main("GET", "/v2/changes?for=svcdemo&select=in-progress", "")
	g.check("changes-in-progress-configure", code, b)
	if ids := listed(t, b); len(ids) != 1 || ids[0] != held.ID {
		t.Fatalf("for=svcdemo lists %v, want the held configure-snap %s", ids, held.ID)
	}
	if _, b = g.main("GET", "/v2/changes?for=other&select=all", ""); len(listed(t, b)) != 0 {
		t.Errorf("for=other lists %s", b)
	}
	s.Change(held.ID).Finish()

	inst := s.AddChange(fake.ChangeSpec{Kind: "install-snap", Snap: "svcdemo"})
	inst.Finish()
	byCtl := ctl(`{"kind":"service-control","snap":"svcdemo","summary":"Running service command for snap \"svcdemo\"","without-snap-names":true}`)
	s.Change(byCtl.ID).Finish()
	_, rb := g.main("POST", "/v2/apps", `{"action":"restart","names":["svcdemo.alpha"]}`)
	rest := changeID(t, rb)
	s.AdvanceUntilReady(context.Background(), rest)
	code, sb := g.snapctl(s.Cookie("svcdemo"), "restart", "svcdemo.beta")
	if code != 200 {
		t.Fatalf("snapctl restart: %d %s", code, sb)
	}
	var snapctlMade string
	for _, c := range s.Changes() {
		if c.Summary == `Running service command for snap "svcdemo"` && c.ID != byCtl.ID {
			snapctlMade = c.ID
		}
	}

	_, b = g.main("GET", "/v2/changes?for=svcdemo&select=all", "")
	got := strings.Join(listed(t, b), ",")
	if want := strings.Join([]string{held.ID, inst.ID(), rest}, ","); got != want {
		t.Errorf("for=svcdemo&select=all lists %s, want %s (configure-snap, install-snap, /v2/apps' service-control; not %s and %s, made as snapctl makes them)",
			got, want, byCtl.ID, snapctlMade)
	}
}

// listed is the change ids of a GET /v2/changes answer, in order.
func listed(t *testing.T, body []byte) []string {
	t.Helper()
	var env struct {
		Result []struct {
			ID string `json:"id"`
		} `json:"result"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	var ids []string
	for _, c := range env.Result {
		ids = append(ids, c.ID)
	}
	return ids
}
