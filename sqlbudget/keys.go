package sqlbudget

import (
	"fmt"
	"strings"
	"unicode"

	"github.com/snapsvc/snapsvc/budget"
)

// normaliseKey checks key and returns its canonical form, the one every
// budget uses (budget.CanonicalKey: "b+a" and "a+b" are one key on every
// backend). A key the
// budget cannot use fails at once with an error wrapping
// budget.ErrRefused: no retry can fix it.
func normaliseKey(key string) (string, error) {
	k := budget.CanonicalKey(key)
	if k == "" {
		return "", fmt.Errorf("%w: sqlbudget: empty key %q", budget.ErrRefused, key)
	}
	if len(k) > 512 {
		return "", fmt.Errorf("%w: sqlbudget: key %q longer than 512 bytes", budget.ErrRefused, key)
	}
	if i := strings.IndexFunc(k, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return "", fmt.Errorf("%w: sqlbudget: invalid key %q (no spaces or control characters)", budget.ErrRefused, key)
	}
	return k, nil
}
