package snapsvc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

func TestHoldAndUnholdReadBack(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	c := newClient(t, srv)
	ctx := context.Background()

	h, err := c.HoldRefresh(ctx, "svcdemo", snapsvc.HoldOptions{})
	if err != nil {
		t.Fatal(err)
	}
	until, level := srv.Hold("svcdemo")
	if !h.Held() || !h.Forever || h.ChangeID == "" || level != "general" || !h.Until.Equal(until) {
		t.Fatalf("hold %+v; fake holds until %v at %q", h, until, level)
	}
	if chg, ok := srv.ChangeByID(h.ChangeID); !ok || chg.Kind != "hold-snap" || chg.Status != "Done" {
		t.Fatalf("hold change %+v", chg)
	}

	asked := time.Now()
	h, err = c.HoldRefresh(ctx, "svcdemo", snapsvc.HoldOptions{Level: snapsvc.HoldAutoRefresh, For: 72 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	_, level = srv.Hold("svcdemo")
	if want := asked.Add(72 * time.Hour); h.Forever || level != "auto-refresh" || h.Until.Before(want.Add(-2*time.Second)) || h.Until.After(want.Add(time.Minute)) {
		t.Fatalf("hold for 72h: %+v at %q, want until about %v", h, level, want)
	}
	in, err := c.Snap(ctx, "svcdemo")
	if err != nil || !in.Hold.Until.Equal(h.Until) {
		t.Fatalf("Snap: %+v %v", in, err)
	}

	h, err = c.UnholdRefresh(ctx, "svcdemo")
	if err != nil || h.Held() || h.ChangeID == "" {
		t.Fatalf("unhold: %+v %v", h, err)
	}
	if until, _ := srv.Hold("svcdemo"); !until.IsZero() {
		t.Fatalf("still held until %v", until)
	}
	// Unholding what is not held succeeds, as snapd's unhold does.
	if _, err := c.UnholdRefresh(ctx, "svcdemo"); err != nil {
		t.Fatal(err)
	}
}

// TestHeldSnapIsRefreshedByName: a hold keeps back auto-refreshes, not a
// refresh that names the snap; holding never conflicts with a change.
func TestHeldSnapIsRefreshedByName(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	c := newClient(t, srv)
	ctx := context.Background()
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "svcdemo"})
	if _, err := c.HoldRefresh(ctx, "svcdemo", snapsvc.HoldOptions{}); err != nil {
		t.Fatalf("hold while a change holds the snap: %v", err)
	}
	foreign.Finish()
	res, err := c.Refresh(ctx, "svcdemo", snapsvc.RefreshOptions{})
	if err != nil || res.NoUpdate || res.After == nil || res.After.Revision != "2" || !res.After.Hold.Forever {
		t.Fatalf("refresh of a held snap: %+v %v", res, err)
	}
}

func TestHoldOnOldSnapdSaysWhichVersion(t *testing.T) {
	sn, _ := svcdemoStore(time.Millisecond)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(sn), fake.WithVersion(fake.Version257))
	c := newClient(t, srv)
	for _, f := range []func() error{
		func() error {
			_, err := c.HoldRefresh(context.Background(), "svcdemo", snapsvc.HoldOptions{})
			return err
		},
		func() error { _, err := c.UnholdRefresh(context.Background(), "svcdemo"); return err },
	} {
		err := f()
		var he *snapsvc.HoldUnsupportedError
		var oe *snapsvc.OpError
		if !errors.Is(err, snapsvc.ErrHoldUnsupported) || !errors.As(err, &he) || !errors.As(err, &oe) || oe.Retryable() {
			t.Fatalf("err = %v", err)
		}
		if !strings.HasPrefix(he.Version, "2.57.6") || !strings.Contains(err.Error(), "snapd 2.57.6") || !strings.Contains(err.Error(), "2.58 or later") {
			t.Fatalf("err = %v (version %q)", err, he.Version)
		}
	}
}

func TestHoldBadInputSendsNothing(t *testing.T) {
	srv := newStoreServer(t, time.Millisecond)
	c := newClient(t, srv)
	for _, tc := range []struct {
		snap string
		opts snapsvc.HoldOptions
		want error
	}{
		{"svcdemo", snapsvc.HoldOptions{For: 500 * time.Millisecond}, snapsvc.ErrInvalidRefresh},
		{"svcdemo", snapsvc.HoldOptions{For: -time.Hour}, snapsvc.ErrInvalidRefresh},
		{"svcdemo", snapsvc.HoldOptions{Level: "everything"}, snapsvc.ErrInvalidRefresh},
		{"svcdemo.alpha", snapsvc.HoldOptions{}, snapsvc.ErrInvalidName},
	} {
		if _, err := c.HoldRefresh(context.Background(), tc.snap, tc.opts); !errors.Is(err, tc.want) {
			t.Errorf("%s %+v: err = %v, want %v", tc.snap, tc.opts, err, tc.want)
		}
	}
	if n := srv.Counters().Requests["POST /v2/snaps/svcdemo"]; n != 0 {
		t.Fatalf("%d requests sent", n)
	}
}
