package snapsvc

import (
	"slices"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// A lost answer's change, among identical ones: the one spawned certainly
// after the request was sent, earliest first; among those whose spawn the
// clock's uncertainty cannot place, the latest, since an identical change
// of someone else's made just before the request has the lower id. Found
// by the schedule test (seed 390): a stop took a foreign identical change
// spawned before the call began, the lowest id in the window.
func TestOpCandidatesPreferTheRequestsOwn(t *testing.T) {
	tgt, err := parseTarget([]string{"k8s.kube-apiserver", "k8s.kubelet"})
	if err != nil {
		t.Fatal(err)
	}
	o := request{action: "stop", t: tgt}
	summary := expectedSummary(o, "k8s", nil)
	sent := time.Date(2026, 12, 4, 20, 0, 0, 0, time.UTC)
	chg := func(id string, spawn time.Duration) snapd.Change {
		return snapd.Change{ID: id, Kind: "service-control", SpawnTime: sent.Add(spawn),
			Tasks: []snapd.Task{{Kind: "service-control", Summary: summary}}}
	}
	// snapd's clock is known to within [-2ms, +0.5ms] of the client's.
	from, sure := sent.Add(-2*time.Millisecond), sent.Add(500*time.Microsecond)
	for _, c := range []struct {
		name string
		chgs []snapd.Change
		want []string
	}{
		{"foreign just before, own in the uncertainty", []snapd.Change{chg("4", -time.Millisecond), chg("5", 200*time.Microsecond)}, []string{"5", "4"}},
		{"own certainly after", []snapd.Change{chg("4", -time.Millisecond), chg("5", time.Millisecond)}, []string{"5", "4"}},
		{"two certainly after: the earliest", []snapd.Change{chg("5", time.Millisecond), chg("6", 2*time.Millisecond)}, []string{"5", "6"}},
		{"before the window: none", []snapd.Change{chg("3", -3*time.Millisecond)}, nil},
	} {
		if got := opCandidates(c.chgs, o, nil, 0, from, sure, time.Time{}, nil); !slices.Equal(got, c.want) {
			t.Errorf("%s: candidates %q, want %q", c.name, got, c.want)
		}
	}
}
