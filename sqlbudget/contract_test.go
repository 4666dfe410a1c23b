package sqlbudget_test

import (
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/mattn/go-sqlite3"

	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/sqlbudget/internal/sqltest"
	"github.com/snapsvc/snapsvc/testsupport/budgetcontract"
)

// openSQLite opens the SQLite database at path as one machine would: a
// pool of its own, immediate transactions, a busy timeout, WAL.
func openSQLite(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_txlock=immediate&_busy_timeout=5000&_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// sqliteHarness is the contract's harness on one SQLite file, every
// participant on its own pool, on a database clock the contract may step
// (dbClock: julianday('now') moved, as a step of the machine's clock moves
// SQLite's).
func sqliteHarness(t *testing.T, ttl time.Duration) *sqltest.Harness {
	path := filepath.Join(t.TempDir(), "budget.db")
	clock := newDBClock()
	return &sqltest.Harness{TTL: ttl, Open: func(t *testing.T) sqlbudget.TxFunc { return sqlbudget.DBTx(clock.open(t, path)) },
		Step: func(_ *testing.T, d time.Duration) { clock.Step(d) }}
}

// The backend-agnostic budget contract on SQLite (in-process).
func TestContractSQLite(t *testing.T) {
	const ttl = time.Second
	h, cfg := sqliteHarness(t, ttl), budgetcontract.Config{TTL: ttl, Slack: 1500 * time.Millisecond}
	budgetcontract.Run(t, h, cfg)
	budgetcontract.RunWholePath(t, h, cfg)
}
