package etcdbudget

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/snapsvc/snapsvc/budget"
)

// Key returns the budget key of a restart of names in its canonical form
// (budget.CanonicalKey): the names sorted, without duplicates, joined
// with "+". Every machine taking part in a rollout must use the same key
// for the same services, whatever order it names them in; Key makes "a b"
// and "b a" one key. Acquire, Status, Pause and Resume apply the same
// canonical form to every key they are given, as the core does before it
// sorts the keys an operation takes, so keys built elsewhere by joining
// names are safe too.
//
// A key names one semaphore: "a+b" is a slot for restarting a and b
// together and does not exclude "a" alone. snapsvc budgets a whole-snap
// name ("k8s") as every one of its services' keys, so a whole-snap restart
// and a restart of one of its services exclude each other, while restarts
// of two different services do not (see the package documentation, Keys).
func Key(names ...string) string {
	return budget.CanonicalKey(strings.Join(names, "+"))
}

// CheckKey reports whether key can be a budget key (Acquire, Status,
// Pause and Resume refuse it otherwise, wrapping budget.ErrRefused): not
// empty, and no '/', '#', spaces or control characters.
func CheckKey(key string) error {
	k := budget.CanonicalKey(key)
	if k == "" {
		return fmt.Errorf("empty budget key %q", key)
	}
	if i := strings.IndexFunc(k, func(r rune) bool { return r == '/' || r == '#' || unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return fmt.Errorf("invalid budget key %q (no '/', '#', spaces or control characters)", key)
	}
	return nil
}

// normaliseKey checks key and returns its canonical form (see Key). A key
// etcdbudget cannot use fails at once with an error wrapping
// budget.ErrRefused: no retry can fix it.
func normaliseKey(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", fmt.Errorf("%w: etcdbudget: %w", budget.ErrRefused, err)
	}
	return budget.CanonicalKey(key), nil
}
