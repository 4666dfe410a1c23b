package sqlbudget_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/sqlbudget"
)

// A database that answers and refuses for good (its tables missing, a
// read-only handle, a handle closed by the application) is a refusal:
// Acquire fails at once with an error wrapping budget.ErrRefused that
// names the key, and a FailOpen budget never grants a slot on it (issue
// 33, defect 2: these were retried as unreachability for Unreachable and
// then granted unbudgeted slots).
func TestPermanentErrorNeverFailsOpen(t *testing.T) {
	ctx := ctxT(t, time.Minute)
	for _, tc := range []struct {
		name string
		open func(t *testing.T) (*sql.DB, func(*sqlbudget.Config))
		want string // in the error
	}{
		{"missing table", func(t *testing.T) (*sql.DB, func(*sqlbudget.Config)) {
			_, db := tempDB(t)
			return db, func(c *sqlbudget.Config) { c.SkipMigrate = true }
		}, "no such table"},
		{"read-only handle", func(t *testing.T) (*sql.DB, func(*sqlbudget.Config)) {
			path, rw := tempDB(t)
			if err := sqlbudget.DBTx(rw)(ctx, sqlbudget.Migrate); err != nil {
				t.Fatal(err)
			}
			ro, err := sql.Open("sqlite3", "file:"+path+"?mode=ro&_busy_timeout=5000")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ro.Close() })
			return ro, nil
		}, "readonly"},
		{"closed handle", func(t *testing.T) (*sql.DB, func(*sqlbudget.Config)) {
			_, db := tempDB(t)
			db.Close()
			return db, nil
		}, "closed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, mod := tc.open(t)
			b := newBudget(t, sqlbudget.DBTx(db), "node-1", func(c *sqlbudget.Config) {
				c.FailOpen, c.Unreachable = true, 2*time.Second
				if mod != nil {
					mod(c)
				}
			})
			start := time.Now()
			s, err := b.Acquire(ctx, "microovn.ovn-northd", nil)
			took := time.Since(start)
			if s != nil {
				t.Fatalf("a slot was granted (%s) on a database that refuses for good", s.Holder())
			}
			var r *sqlbudget.RefusedError
			if !errors.Is(err, budget.ErrRefused) || errors.Is(err, budget.ErrUnavailable) || !errors.As(err, &r) || r.Retryable() {
				t.Fatalf("Acquire: %v; want a *RefusedError wrapping ErrRefused, not ErrUnavailable", err)
			}
			if msg := err.Error(); !strings.Contains(msg, "microovn.ovn-northd") || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q: want the key and the database's answer (%q)", msg, tc.want)
			}
			if took > time.Second {
				t.Errorf("refused after %s: a permanent answer is not retried", took)
			}
			if m := b.Metrics(); m.Unbudgeted != 0 || m.Failed != 1 {
				t.Errorf("metrics %+v: want 1 failure, no unbudgeted grant", m)
			}
		})
	}
}
