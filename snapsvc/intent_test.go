package snapsvc_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/snapsvc"
)

// leaveIntent makes a client WithIntents leave the intent of action on
// kubelet: its call's context ends while a foreign change holds the snap
// (a daemon shut down while it waited). It returns the foreign change,
// still holding the snap.
func leaveIntent(t *testing.T, srv *fake.Server, action string) *fake.Change {
	t.Helper()
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	seen, conflicts := conflictsSeen()
	c := newClient(t, srv, snapsvc.WithIntents(), seen)
	ctx, cancel := context.WithCancel(ctxT(t))
	errc := make(chan error, 1)
	go func() {
		var err error
		switch action {
		case "restart":
			_, err = c.Restart(ctx, []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		case "stop":
			_, err = c.Stop(ctx, []string{"k8s.kubelet"}, snapsvc.StopOptions{})
		}
		errc <- err
	}()
	awaitT(t, ctxT(t), conflicts, "the conflict")
	cancel()
	if err := recvT(t, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("the call ended with %v, want its context's end", err)
	}
	if got := snapsvc.IntentFiles(lockDirOf(srv)); len(got) != 1 {
		t.Fatalf("intents left by a call its context ended: %q, want 1", got)
	}
	return foreign
}

// leaveEarlierBootIntent leaves an intent of action in boot "boot-1",
// its blocker finished, and makes this boot "boot-2".
func leaveEarlierBootIntent(t *testing.T, srv *fake.Server, action string) {
	t.Helper()
	snapsvc.SetBootID(t, "boot-1")
	leaveIntent(t, srv, action).Finish()
	snapsvc.SetBootID(t, "boot-2")
}

// ownChanges are the service-control changes of srv.
func ownChanges(srv *fake.Server) []fake.ChangeInfo {
	var out []fake.ChangeInfo
	for _, c := range srv.Changes() {
		if c.Kind == "service-control" {
			out = append(out, c)
		}
	}
	return out
}

func TestIntentLeftByAnEndedCallIsCarriedOutOnceByTheNextClient(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	foreign := leaveIntent(t, srv, "restart")
	foreign.Finish()
	c := newClient(t, srv, snapsvc.WithIntents())
	rs, err := c.Startup(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Decision != snapsvc.ReplayActed || rs[0].Result == nil || rs[0].Result.Status != "Done" {
		t.Fatalf("replayed %+v, want one restart acted and done", rs)
	}
	if got := ownChanges(srv); len(got) != 1 || got[0].ID != rs[0].Result.ChangeID {
		t.Fatalf("service changes %+v, want the replay's one", got)
	}
	// A second client finds nothing left.
	again, err := newClient(t, srv).Replay(ctxT(t), "k8s")
	if err != nil || len(again) != 0 {
		t.Fatalf("a second replay did %+v, %v; want nothing", again, err)
	}
	if got := snapsvc.IntentFiles(lockDirOf(srv)); len(got) != 0 {
		t.Fatalf("intents left: %q", got)
	}
}

func TestIntentHeldByALiveCallIsNotReplayed(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	foreign := srv.AddChange(fake.ChangeSpec{Kind: "configure-snap", Snap: "k8s"})
	seen, conflicts := conflictsSeen()
	live := newClient(t, srv, snapsvc.WithIntents(), seen)
	done := make(chan error, 1)
	go func() {
		_, err := live.Restart(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
		done <- err
	}()
	awaitT(t, ctxT(t), conflicts, "the conflict")
	rs, err := newClient(t, srv).Replay(ctxT(t), "k8s")
	if err != nil || len(rs) != 0 {
		t.Fatalf("replay of a live call's intent: %+v, %v; want none", rs, err)
	}
	foreign.Finish()
	if err := recvT(t, done); err != nil {
		t.Fatal(err)
	}
	if got := ownChanges(srv); len(got) != 1 {
		t.Fatalf("service changes %d, want 1", len(got))
	}
	if got := snapsvc.IntentFiles(lockDirOf(srv)); len(got) != 0 {
		t.Fatalf("intents left by a call that returned: %q", got)
	}
}

func TestIntentOfAnEarlierBoot(t *testing.T) {
	checkLeaks(t)
	t.Run("restart: every process now started after it", func(t *testing.T) {
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
		leaveEarlierBootIntent(t, srv, "restart")
		rs, err := newClient(t, srv).Replay(ctxT(t), "k8s")
		if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayReached || !rs[0].EarlierBoot {
			t.Fatalf("replayed %+v, %v; want the restart reached by the boot", rs, err)
		}
		if got := ownChanges(srv); len(got) != 0 {
			t.Fatalf("service changes %+v, want none", got)
		}
	})
	t.Run("stop: carried out where the boot started the service again", func(t *testing.T) {
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
		leaveEarlierBootIntent(t, srv, "stop")
		rs, err := newClient(t, srv).Replay(ctxT(t), "k8s")
		if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayActed {
			t.Fatalf("replayed %+v, %v; want the stop acted", rs, err)
		}
		if st, _ := srv.Service("k8s", "kubelet"); st.Active {
			t.Fatal("kubelet still active after the replayed stop")
		}
	})
	t.Run("stop: reached where the service is stopped", func(t *testing.T) {
		srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
		leaveEarlierBootIntent(t, srv, "stop")
		srv.SetService("k8s", "kubelet", fake.AppState{Enabled: false, Active: false})
		rs, err := newClient(t, srv).Replay(ctxT(t), "k8s")
		if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayReached {
			t.Fatalf("replayed %+v, %v; want the stop reached", rs, err)
		}
		if got := ownChanges(srv); len(got) != 0 {
			t.Fatalf("service changes %+v, want none", got)
		}
	})
}

func TestIntentOfAnAsyncOperationEndsWhenSnapdAcceptsIt(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	c := newClient(t, srv, snapsvc.WithIntents())
	op, err := c.RestartAsync(ctxT(t), []string{"k8s.kubelet"}, snapsvc.RestartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := snapsvc.IntentFiles(lockDirOf(srv)); len(got) != 0 {
		t.Fatalf("intents left once snapd accepted: %q", got)
	}
	if _, err := op.Wait(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

func TestIntentReplayTakesABudgetSlot(t *testing.T) {
	checkLeaks(t)
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	foreign := leaveIntent(t, srv, "restart")
	foreign.Finish()
	b := newMemBudget(1)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	rs, err := c.Replay(ctxT(t), "k8s")
	if err != nil || len(rs) != 1 || rs[0].Decision != snapsvc.ReplayActed {
		t.Fatalf("replayed %+v, %v; want the restart acted", rs, err)
	}
	if !slices.ContainsFunc(b.steps(), func(s string) bool { return len(s) > 8 && s[:8] == "acquire " }) {
		t.Fatalf("budget steps %q: the replay took no slot", b.steps())
	}
	if n := b.heldTotal(); n != 0 {
		t.Fatalf("%d slots still held after the replay", n)
	}
}

func TestReplayWithoutALockDirectoryFails(t *testing.T) {
	srv := fake.NewServer(t, fake.AllowNonRoot(), fake.WithSnaps(k8sSnap(0)))
	_, err := newClient(t, srv, snapsvc.WithoutFileLock()).Replay(ctxT(t), "k8s")
	if err == nil {
		t.Fatal("Replay without a lock directory succeeded")
	}
}
