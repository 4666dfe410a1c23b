package etcdbudget

import (
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// Key returns the budget key of a restart of names: the names sorted,
// without duplicates, joined with "+". Every machine taking part in a
// rollout must use the same key for the same services, whatever order it
// names them in; Key makes "a b" and "b a" one key. Acquire applies the
// same normalisation to any key containing "+", so keys built elsewhere
// by joining names are safe too.
func Key(names ...string) string {
	var parts []string
	for _, n := range names {
		for p := range strings.SplitSeq(n, "+") {
			if p = strings.TrimSpace(p); p != "" {
				parts = append(parts, p)
			}
		}
	}
	slices.Sort(parts)
	return strings.Join(slices.Compact(parts), "+")
}

// normaliseKey checks key and returns its normal form (see Key). A key
// etcdbudget cannot use fails at once with an error wrapping
// snapsvc.ErrBudgetRefused: no retry can fix it.
func normaliseKey(key string) (string, error) {
	k := Key(key)
	if k == "" {
		return "", fmt.Errorf("%w: etcdbudget: empty key %q", snapsvc.ErrBudgetRefused, key)
	}
	if i := strings.IndexFunc(k, func(r rune) bool { return r == '/' || r == '#' || unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return "", fmt.Errorf("%w: etcdbudget: invalid key %q (no '/', '#', spaces or control characters)", snapsvc.ErrBudgetRefused, key)
	}
	return k, nil
}
