package sqlbudget

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"syscall"
	"testing"
)

// codeError is an error whose type is a struct with SQLite's result code
// in a field named Code, as go-dqlite's driver.Error is (mattn's
// sqlite3.Error too, with a Code of a named integer type).
type codeError struct {
	Code    int
	Message string
}

func (e codeError) Error() string { return e.Message }

// codeMethod is an error with a Code method, as modernc.org/sqlite's.
type codeMethod struct{ code int }

func (e *codeMethod) Error() string { return fmt.Sprintf("sqlite error %d", e.code) }
func (e *codeMethod) Code() int     { return e.code }

// Errors from the database are told apart by SQLite's result code, where
// the driver's error carries it, or else by SQLite's message: busy,
// locked, I/O and connection errors pass; a missing table, a read-only,
// full or corrupt database, a closed handle do not. What is not
// recognised is retried as unreachability.
func TestPermanent(t *testing.T) {
	for _, c := range []struct {
		err       error
		permanent bool
	}{
		{errors.New("no such table: snapsvc_budget_entries"), true},
		{fmt.Errorf("begin: %w", errors.New("attempt to write a readonly database")), true},
		{errors.New("database disk image is malformed"), true},
		{errors.New("database or disk is full"), true},
		{errors.New("sql: database is closed"), true},
		{errors.New("database is locked"), false},
		{errors.New("Database is not ready yet: Starting"), false}, // microcluster's, while it starts
		{context.DeadlineExceeded, false},
		{sql.ErrTxDone, false},
		{sql.ErrConnDone, false},
		{driver.ErrBadConn, false},
		{syscall.ECONNREFUSED, false},
		{errors.New("failed to establish network connection"), false},
		{codeError{Code: 1, Message: "no such column: x"}, true},
		{fmt.Errorf("tx: %w", codeError{Code: 8, Message: "attempt to write a readonly database"}), true},
		{codeError{Code: 8 | 1<<8, Message: "attempt to write a readonly database"}, true}, // READONLY_RECOVERY
		{codeError{Code: 13, Message: "database or disk is full"}, true},
		{codeError{Code: 11, Message: "database disk image is malformed"}, true},
		{codeError{Code: 26, Message: "file is not a database"}, true},
		{codeError{Code: 23, Message: "not authorized"}, true},
		{codeError{Code: 5, Message: "database is locked"}, false},
		{codeError{Code: 5 | 2<<8, Message: "database is locked"}, false}, // BUSY_SNAPSHOT
		{codeError{Code: 6, Message: "database table is locked"}, false},
		{codeError{Code: 10 | 40<<8, Message: "not leader"}, false},
		{codeError{Code: 10, Message: "disk I/O error"}, false},
		{codeError{Code: 1, Message: "SQL logic error"}, false}, // SQLITE_ERROR alone says too little
		{&codeMethod{code: 8}, true},
		{&codeMethod{code: 5}, false},
	} {
		if got := permanent(c.err); got != c.permanent {
			t.Errorf("permanent(%v) = %v, want %v", c.err, got, c.permanent)
		}
	}
}

// A database that answers "busy" (another writer holds the lock) is
// contended, not out: it never counts toward Unreachable.
func TestContended(t *testing.T) {
	for _, c := range []struct {
		err  error
		busy bool
	}{
		{errors.New("database is locked"), true},
		{fmt.Errorf("begin: %w", errors.New("database table is locked")), true},
		{codeError{Code: 5, Message: "database is locked"}, true},
		{codeError{Code: 5 | 2<<8, Message: "database is locked"}, true}, // BUSY_SNAPSHOT
		{codeError{Code: 6, Message: "database table is locked"}, true},
		{&codeMethod{code: 5}, true},
		{codeError{Code: 10 | 40<<8, Message: "not leader"}, false},
		{context.DeadlineExceeded, false},
		{driver.ErrBadConn, false},
		{errors.New("failed to create dqlite connection: no available dqlite leader server found"), false},
		{nil, false},
	} {
		if got := contended(c.err); got != c.busy {
			t.Errorf("contended(%v) = %v, want %v", c.err, got, c.busy)
		}
	}
}
