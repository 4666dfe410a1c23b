package budget_test

import (
	"slices"
	"testing"

	"github.com/snapsvc/snapsvc/budget"
)

func TestCanonicalKey(t *testing.T) {
	for in, want := range map[string]string{
		"k8s.kube-apiserver": "k8s.kube-apiserver",
		"a+b":                "a+b",
		"b+a":                "a+b",
		" b + a + a ":        "a+b",
		"a++b+":              "a+b",
		"":                   "",
		"+":                  "",
	} {
		if got := budget.CanonicalKey(in); got != want {
			t.Errorf("CanonicalKey(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPauseScopes(t *testing.T) {
	for key, want := range map[string][]string{
		"k8s":                     {"k8s"},
		"k8s.kubelet":             {"k8s.kubelet", "k8s"},
		"k8s.kubelet+k8s.kubectl": {"k8s.kubelet+k8s.kubectl", "k8s.kubelet", "k8s", "k8s.kubectl"},
		"a.x+b":                   {"a.x+b", "a.x", "a", "b"},
	} {
		if got := budget.PauseScopes(key); !slices.Equal(got, want) {
			t.Errorf("PauseScopes(%q) = %q, want %q", key, got, want)
		}
	}
}
