//go:build realsnapd

package integration

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// snapsvc.Refresh, HoldRefresh and UnholdRefresh against the real snapd:
// the second revision of svcdemo installed as a refresh while a
// service-control change runs (the conflict absorbed, one install change,
// the services active after), holds read back (2.58+), and the clear
// error of 2.57.6, which has no holds.

// svcdemoFiles returns the paths of svcdemo's version 1 and 2 snaps
// (run.sh packs both), or skips.
func svcdemoFiles(t *testing.T) (v1, v2 string) {
	t.Helper()
	v1, v2 = os.Getenv("SNAPSVC_REALSNAPD_SVCDEMO1"), os.Getenv("SNAPSVC_REALSNAPD_SVCDEMO2")
	if v1 == "" || v2 == "" {
		t.Skip("SNAPSVC_REALSNAPD_SVCDEMO1/2 not set: run through integration/run.sh")
	}
	return v1, v2
}

// installChangesOf returns snapd's install-snap changes of file.
func (w *wire) installChangesOf(t testing.TB, file string) []change {
	t.Helper()
	r := w.do(t, "GET", "/v2/changes?select=all", nil)
	var cs []change
	decode(t, r, &cs)
	var out []change
	for _, c := range cs {
		if c.Kind == "install-snap" && strings.Contains(c.Summary, `from file "`+file+`"`) {
			out = append(out, c)
		}
	}
	return out
}

func TestClientRefreshFileDuringServiceChange(t *testing.T) {
	e := loadEnv(t)
	v1, v2 := svcdemoFiles(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	// The install's configure hook must neither sleep nor restart.
	w.waitChange(t, w.setConf(t, map[string]any{"hook-sleep": "0", "hook-restart": nil}), time.Minute)
	c := newClient(t, e, snapsvc.WithMode(snapsvc.ModeREST))
	ctx := ctxFor(t, 5*time.Minute)
	before, err := c.Snap(ctx, "svcdemo")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Back to version 1, whatever happened.
		ctx := ctxFor(t, 5*time.Minute)
		if in, err := c.Snap(ctx, "svcdemo"); err == nil && in.Version == before.Version {
			w.ensureBaseline(t)
			return
		}
		if _, err := c.Refresh(ctx, "svcdemo", snapsvc.RefreshOptions{File: v1}); err != nil {
			t.Errorf("reinstalling version 1: %v", err)
		}
		w.ensureBaseline(t)
	})
	prior := len(w.installChangesOf(t, v2))

	stop := startSlowStop(t, w) // gamma's stop: a service-control change, Doing for SLOW seconds
	res, err := c.Refresh(ctx, "svcdemo", snapsvc.RefreshOptions{File: v2})
	if err != nil {
		t.Fatalf("Refresh with %s during change %s: %v", v2, stop, err)
	}
	blk := w.change(t, stop)
	if !blk.Ready || res.Conflicts < 1 || !slices.Contains(res.WaitedFor, stop) {
		t.Fatalf("result %+v; the service-control change %s is %s: want its conflict absorbed", res.Result, stop, blk.Status)
	}
	installs := w.installChangesOf(t, v2)
	if len(installs) != prior+1 {
		t.Fatalf("%d install changes of %s, want one more than %d", len(installs), v2, prior)
	}
	own := installs[len(installs)-1]
	if own.ID != res.ChangeID || own.Status != "Done" || own.SpawnTime.Before(blk.ReadyTime) {
		t.Fatalf("install change %+v, result %+v, blocker ready at %v", own, res.Result, blk.ReadyTime)
	}
	t.Logf("snapd %s: refresh of %s waited out change %s, then its change %s spawned %v after it (%d attempts)",
		e.Version, v2, stop, own.ID, own.SpawnTime.Sub(blk.ReadyTime), res.Attempts)
	if res.After == nil || res.After.Version != "2" || res.After.Revision == before.Revision {
		t.Fatalf("after the refresh: %+v (before %+v)", res.After, before)
	}
	apps := w.apps(t, "svcdemo")
	for _, n := range []string{"alpha", "beta", "gamma"} {
		if !apps[n].Active || !apps[n].Enabled {
			t.Errorf("after the refresh %s is %+v", n, apps[n])
		}
	}

	// Back to version 1: a refresh to the retained revision where snapd
	// allows it (2.68+: a local amend), else the file again.
	if versionAtLeast(e.Version, 2, 68) {
		back, err := c.Refresh(ctx, "svcdemo", snapsvc.RefreshOptions{Revision: before.Revision})
		if err != nil || back.After == nil || back.After.Version != before.Version {
			t.Fatalf("refresh back to revision %s: %+v %v", before.Revision, back, err)
		}
		if chg := w.change(t, back.ChangeID); chg.Kind != "refresh-snap" || chg.Status != "Done" {
			t.Fatalf("refresh back: change %+v", chg)
		}
	}
}

func TestClientRefreshHold(t *testing.T) {
	e := loadEnv(t)
	w := newWire(t, e.Socket)
	w.ensureBaseline(t)
	c := newClient(t, e, snapsvc.WithMode(snapsvc.ModeREST))
	ctx := ctxFor(t, time.Minute)
	if !versionAtLeast(e.Version, 2, 58) {
		_, err := c.HoldRefresh(ctx, "svcdemo", snapsvc.HoldOptions{})
		t.Logf("snapd %s: %v", e.Version, err)
		var he *snapsvc.HoldUnsupportedError
		if !errors.Is(err, snapsvc.ErrHoldUnsupported) || !errors.As(err, &he) || !strings.HasPrefix(he.Version, "2.57") ||
			!strings.Contains(err.Error(), "holds need snapd 2.58 or later") {
			t.Fatalf("hold on snapd %s: %v", e.Version, err)
		}
		if _, err := c.UnholdRefresh(ctx, "svcdemo"); !errors.Is(err, snapsvc.ErrHoldUnsupported) {
			t.Fatalf("unhold on snapd %s: %v", e.Version, err)
		}
		return
	}
	t.Cleanup(func() { w.doErr("POST", "/v2/snaps/svcdemo", map[string]any{"action": "unhold"}) })
	h, err := c.HoldRefresh(ctx, "svcdemo", snapsvc.HoldOptions{})
	if err != nil || !h.Held() || !h.Forever {
		t.Fatalf("hold forever: %+v %v", h, err)
	}
	if chg := w.change(t, h.ChangeID); chg.Kind != "hold-snap" || chg.Summary != `Hold general refreshes for "svcdemo"` {
		t.Fatalf("hold change %+v", chg)
	}
	asked := time.Now()
	h, err = c.HoldRefresh(ctx, "svcdemo", snapsvc.HoldOptions{Level: snapsvc.HoldAutoRefresh, For: time.Hour})
	if err != nil || h.Forever || h.Until.Sub(asked.Add(time.Hour)).Abs() > 5*time.Second {
		t.Fatalf("hold for an hour: %+v %v", h, err)
	}
	if chg := w.change(t, h.ChangeID); chg.Summary != `Hold auto-refreshes for "svcdemo"` {
		t.Fatalf("hold change %+v", chg)
	}
	in, err := c.Snap(ctx, "svcdemo")
	if err != nil || !in.Hold.Until.Equal(h.Until) {
		t.Fatalf("read back: %+v %v", in, err)
	}
	h, err = c.UnholdRefresh(ctx, "svcdemo")
	if err != nil || h.Held() {
		t.Fatalf("unhold: %+v %v", h, err)
	}
	if chg := w.change(t, h.ChangeID); chg.Kind != "unhold-snap" {
		t.Fatalf("unhold change %+v", chg)
	}
}
