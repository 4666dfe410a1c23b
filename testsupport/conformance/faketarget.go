package conformance

import (
	"context"
	"fmt"
	"time"

	"github.com/snapsvc/snapsvc/fake"
)

// SvcdemoSnap is the golden captures' test snap as a fake.Snap (see the
// golden README): alpha and beta loop forever; gamma's stop takes 20 s;
// slowstart (forking, install-mode: disable) takes 20 s to start; ctl is a
// plain app. broken is added by Prepare("add-broken-app").
func SvcdemoSnap() fake.Snap {
	return fake.Snap{Name: "svcdemo", Apps: []fake.App{
		{Name: "alpha", Daemon: "simple", Enabled: true, Active: true},
		{Name: "beta", Daemon: "simple", Enabled: true, Active: true},
		{Name: "gamma", Daemon: "simple", Enabled: true, Active: true, StopDuration: 20 * time.Second},
		{Name: "slowstart", Daemon: "forking", StartDuration: 20 * time.Second},
		{Name: "ctl"},
	}}
}

// SvcdemoBroken is the failing oneshot the capture added at the end.
func SvcdemoBroken() fake.App {
	return fake.App{Name: "broken", Daemon: "oneshot", FailStart: fake.SystemctlJobFailed("svcdemo", "broken")}
}

// FakeTarget runs the conformance cases against a fake.Server on a manual
// clock: waiting advances the clock from one pending timer to the next.
type FakeTarget struct {
	S     *fake.Server
	Clock *fake.ManualClock
}

// NewFakeTarget starts a fake snapd imitating version with svcdemo installed
// the way the capture found it, including the finished install-snap change
// of svcdemo in the change history. It is closed with t.Cleanup.
func NewFakeTarget(t interface {
	Helper()
	Cleanup(func())
	Fatalf(string, ...any)
}, version fake.Version) *FakeTarget {
	t.Helper()
	clk := fake.NewManualClock(time.Date(2026, 12, 2, 14, 6, 11, 0, time.UTC))
	// The captures were made as root; the replay runs as whoever runs
	// the tests.
	s, err := fake.New(fake.AllowNonRoot(), fake.WithVersion(version), fake.WithClock(clk), fake.WithSnaps(SvcdemoSnap()))
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { s.Close() })
	// the install of svcdemo, as listed by GET /v2/changes?for=svcdemo
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	install := s.AddChange(fake.ChangeSpec{
		Kind: "install-snap", Snap: "svcdemo", WithSnapNames: true,
		Summary: "Install " + q("svcdemo") + " snap from file " + q("/root/snaps/svcdemo_1_amd64.snap"),
		APIData: map[string]any{"snap-name": "svcdemo"},
		Tasks: []fake.TaskSpec{
			{Kind: "prerequisites", Summary: "Ensure prerequisites for " + q("svcdemo") + " are available"},
			{Kind: "prepare-snap", Summary: "Prepare snap " + q("/var/lib/snapd/snaps/.local-install-1005783847") + " (unset)"},
			{Kind: "mount-snap", Summary: "Mount snap " + q("svcdemo") + " (unset)"},
			{Kind: "copy-snap-data", Summary: "Copy snap " + q("svcdemo") + " data"},
			{Kind: "setup-profiles", Summary: "Setup snap " + q("svcdemo") + " (unset) security profiles"},
			{Kind: "link-snap", Summary: "Make snap " + q("svcdemo") + " (unset) available to the system"},
			{Kind: "auto-connect", Summary: "Automatically connect eligible plugs and slots of snap " + q("svcdemo")},
			{Kind: "set-auto-aliases", Summary: "Set automatic aliases for snap " + q("svcdemo")},
			{Kind: "setup-aliases", Summary: "Setup snap " + q("svcdemo") + " aliases"},
			{Kind: "run-hook", Summary: "Run install hook of " + q("svcdemo") + " snap if present"},
			{Kind: "start-snap-services", Summary: "Start snap " + q("svcdemo") + " (unset) services"},
			{Kind: "run-hook", Summary: "Run configure hook of " + q("svcdemo") + " snap if present"},
			{Kind: "run-hook", Summary: "Run health check of " + q("svcdemo") + " snap"},
		},
	})
	install.Finish()
	clk.Advance(3 * time.Minute)
	return &FakeTarget{S: s, Clock: clk}
}

// MainSocket implements Target.
func (f *FakeTarget) MainSocket() string { return f.S.SocketPath() }

// SnapSocket implements Target.
func (f *FakeTarget) SnapSocket() string { return f.S.SnapSocketPath() }

// Cookie implements Target.
func (f *FakeTarget) Cookie() string { return f.S.Cookie("svcdemo") }

// WaitChangeReady implements Target by advancing the fake's clock.
func (f *FakeTarget) WaitChangeReady(ctx context.Context, id string) error {
	return f.S.AdvanceUntilReady(ctx, id)
}

// Await implements Target: it fires the clock's timers one deadline at a
// time until done is closed, and otherwise waits for a timer to appear.
func (f *FakeTarget) Await(ctx context.Context, done <-chan struct{}) error {
	for {
		select {
		case <-done:
			return nil
		default:
		}
		added := f.Clock.TimerAdded()
		if _, ok := f.Clock.AdvanceToNext(); ok {
			continue
		}
		select {
		case <-done:
			return nil
		case <-added:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// WaitInProgress implements Target.
func (f *FakeTarget) WaitInProgress(ctx context.Context) error {
	return f.S.WaitFor(ctx, func(v fake.View) bool { return len(v.InProgress()) > 0 })
}

// Prepare implements Target. StepSettle advances the manual clock by
// SettleDelay, firing the fake's timers on the way (e.g. the "Waiting for
// ... to stop." log a second into a slow stop), where a real target waits.
func (f *FakeTarget) Prepare(_ context.Context, step string) error {
	switch step {
	case StepSettle:
		f.Clock.Advance(SettleDelay)
		return nil
	case "add-broken-app":
		sn := SvcdemoSnap()
		// keep the current state of the other services
		for i, a := range sn.Apps {
			if st, ok := f.S.Service("svcdemo", a.Name); ok {
				sn.Apps[i].Enabled, sn.Apps[i].Active = st.Enabled, st.Active
			}
		}
		sn.Apps = append(sn.Apps, SvcdemoBroken())
		return f.S.InstallSnap(sn)
	}
	return fmt.Errorf("unknown prepare step %q", step)
}
