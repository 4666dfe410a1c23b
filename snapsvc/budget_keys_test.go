package snapsvc_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// Two spellings of one combined key are one slot, taken in the order of
// canonical keys (issue 26, defect 4): before, the restart took "a+b" and
// "b+a" as two slots of one etcd key and waited behind itself, and two
// machines took the keys in opposite orders.
func TestBudgetKeysCanonical(t *testing.T) {
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	keys := map[string]string{"k8s.kubelet": "kube-apiserver+kubelet", "k8s.kube-apiserver": "kubelet+kube-apiserver", "k8s.containerd": "z+b"}
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{Key: func(n string) string { return keys[n] }}))
	if _, err := c.Restart(ctx, []string{"k8s.kubelet", "k8s.kube-apiserver", "k8s.containerd"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	got := b.steps()
	want := []string{"acquire b+z", "acquire kube-apiserver+kubelet"}
	if len(got) < 2 || !slices.Equal(got[:2], want) {
		t.Fatalf("steps %q, want first %q", got, want)
	}
}

// A whole-snap name is budgeted as every one of its services' keys, so a
// restart of "k8s" and one of "k8s.kube-apiserver" take the same slot
// (issue 26, defect 4).
func TestBudgetWholeSnapTakesServiceKeys(t *testing.T) {
	ctx := ctxT(t)
	srv := budgetServer(t)
	b := newMemBudget(1)
	c := newClient(t, srv, snapsvc.WithRestartBudget(b, snapsvc.BudgetOptions{}))
	if _, err := c.Restart(ctx, []string{"k8s"}, snapsvc.RestartOptions{}); err != nil {
		t.Fatal(err)
	}
	var acquired []string
	for _, s := range b.steps() {
		if k, ok := strings.CutPrefix(s, "acquire "); ok {
			acquired = append(acquired, k)
		}
	}
	want := []string{"k8s.containerd", "k8s.kube-apiserver", "k8s.kube-proxy", "k8s.kube-scheduler", "k8s.kubelet"}
	if !slices.Equal(acquired, want) {
		t.Fatalf("a restart of k8s took %q, want every service's key in order %q", acquired, want)
	}
}
