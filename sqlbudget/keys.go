package sqlbudget

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/snapsvc/snapsvc/snapsvc"
)

// canonicalKey gives a key the one canonical form every budget uses,
// snapsvc.CanonicalKey's: the "+"-joined parts sorted, trimmed and
// de-duplicated, so "b+a" and "a+b" are one key on every backend.
func canonicalKey(key string) string { return snapsvc.CanonicalKey(key) }

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
