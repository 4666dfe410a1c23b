package sqlbudget

import (
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// canonicalKey is the one place where sqlbudget gives a key its canonical
// form: the "+"-joined parts sorted, trimmed and de-duplicated, exactly as
// etcdbudget.Key does, so "b+a" and "a+b" are one key on both backends.
// (When package snapsvc gains its canonical key function, this body
// becomes a call to it.)
func canonicalKey(key string) string {
	var parts []string
	for _, p := range strings.Split(key, "+") {
		if p = strings.TrimSpace(p); p != "" {
			parts = append(parts, p)
		}
	}
	slices.Sort(parts)
	return strings.Join(slices.Compact(parts), "+")
}

// normaliseKey checks key and returns its canonical form. A key the
// budget cannot use fails at once with an error wrapping
// snapsvc.ErrBudgetRefused: no retry can fix it.
func normaliseKey(key string) (string, error) {
	k := canonicalKey(key)
	if k == "" {
		return "", fmt.Errorf("%w: sqlbudget: empty key %q", snapsvc.ErrBudgetRefused, key)
	}
	if len(k) > 512 {
		return "", fmt.Errorf("%w: sqlbudget: key %q longer than 512 bytes", snapsvc.ErrBudgetRefused, key)
	}
	if i := strings.IndexFunc(k, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return "", fmt.Errorf("%w: sqlbudget: invalid key %q (no spaces or control characters)", snapsvc.ErrBudgetRefused, key)
	}
	return k, nil
}
