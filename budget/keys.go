package budget

import (
	"slices"
	"strings"
)

// CanonicalKey returns the one form of a budget key that every machine
// and every budget uses: the "+"-separated parts of key trimmed of spaces,
// sorted and without duplicates or empty parts, joined with "+". So "a+b",
// "b+a" and " b + a + a" are one key, "a+b"; a key without "+" is only
// trimmed. snapsvc takes slots in the order of canonical keys, so two
// operations naming one key in different spellings share one slot and
// cannot deadlock; every backend applies the same function to every key it
// is given.
func CanonicalKey(key string) string {
	var parts []string
	for _, p := range strings.Split(key, "+") {
		if p = strings.TrimSpace(p); p != "" {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	return strings.Join(slices.Compact(parts), "+")
}

// PauseScopes returns the keys whose pause holds key (a canonical key)
// back, the key's own first: key, each of its "+"-joined parts, and, for a
// part naming a service ("snap.app"), its snap ("snap"). Budgets that can
// be paused apply it, so that pausing a snap's name pauses every restart
// of its services (a whole-snap restart takes their keys, not the snap's).
func PauseScopes(key string) []string {
	scopes := []string{key}
	for _, p := range strings.Split(key, "+") {
		if !slices.Contains(scopes, p) {
			scopes = append(scopes, p)
		}
		if snap, _, ok := strings.Cut(p, "."); ok && snap != "" && !slices.Contains(scopes, snap) {
			scopes = append(scopes, snap)
		}
	}
	return scopes
}
