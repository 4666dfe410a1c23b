package sqlbudget

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/snapsvc/snapsvc/budget"
)

// RefusedError is a transaction of the budget that the database answered
// and refused for good: its tables are missing (Config.SkipMigrate
// without SchemaUpdates applied), the handle is read-only or closed, the
// database is full or corrupt, the application's user may not write it.
// Retrying cannot help until an operator acts, so it is returned at once
// and a FailOpen budget never grants a slot on it. It wraps
// budget.ErrRefused and the database's error.
type RefusedError struct {
	// What the transaction was for ("waiting for a slot of
	// microovn.ovn-northd").
	What string
	// Err is the database's answer.
	Err error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%v: sqlbudget: %s: the database refused the transaction for good (%v); retrying cannot help until an operator fixes the database or its handle",
		budget.ErrRefused, e.What, e.Err)
}

// Unwrap returns budget.ErrRefused and the database's error.
func (e *RefusedError) Unwrap() []error { return []error{budget.ErrRefused, e.Err} }

// Retryable reports false: only an operator can fix it.
func (e *RefusedError) Retryable() bool { return false }

// SQLite's primary result codes (https://sqlite.org/rescode.html) that
// no retry changes: the statement or the schema is wrong for this
// database, or the database cannot be written. Every other code (busy,
// locked, I/O, a dqlite node that is not the leader, an interrupted
// statement, a schema changed under a prepared statement) may pass.
var permanentCodes = map[int]string{
	3:  "PERM",
	8:  "READONLY",
	11: "CORRUPT",
	13: "FULL",
	14: "CANTOPEN",
	18: "TOOBIG",
	19: "CONSTRAINT",
	20: "MISMATCH",
	21: "MISUSE",
	22: "NOLFS",
	23: "AUTH",
	24: "FORMAT",
	25: "RANGE",
	26: "NOTADB",
}

// sqliteError is SQLITE_ERROR, the generic code: permanent only with the
// messages below (a missing table or column, SQL this database does not
// understand), never on its own.
const sqliteError = 1

// permanentMessages are SQLite's (and database/sql's) messages of answers
// no retry changes, for errors that carry no result code.
var permanentMessages = []string{
	"no such table",
	"no such column",
	"no such index",
	"has no column named",
	"syntax error",
	"readonly database",
	"database disk image is malformed",
	"file is not a database",
	"database or disk is full",
	"unable to open database file",
	"not authorized",
	"sql: database is closed", // database/sql: the application closed the *sql.DB
}

// permanent reports whether err, from a budget transaction, is the
// database refusing for good rather than failing for a while (busy,
// locked, no leader, a lost connection, an attempt's timeout). It reads
// SQLite's result code where the driver's error carries one (a field
// named Code, as go-dqlite's driver.Error and mattn/go-sqlite3's Error
// have, or a Code method, as modernc.org/sqlite's), else SQLite's
// message. An error it does not recognise is not permanent: it is
// retried, within Config.Unreachable.
func permanent(err error) bool {
	if err == nil {
		return false
	}
	if code, ok := sqliteCode(err); ok {
		primary := code & 0xff
		if _, ok := permanentCodes[primary]; ok {
			return true
		}
		if primary != sqliteError {
			return false
		}
	}
	msg := err.Error() // a wrapper's message includes what it wraps
	for _, m := range permanentMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// sqliteCode finds SQLite's result code in err's chain: a Code method
// returning an int, or an integer field named Code of a struct.
func sqliteCode(err error) (int, bool) {
	var found int
	ok := false
	walk(err, func(e error) bool {
		if c, is := e.(interface{ Code() int }); is {
			found, ok = c.Code(), true
			return true
		}
		v := reflect.ValueOf(e)
		for v.Kind() == reflect.Pointer && !v.IsNil() {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return false
		}
		f := v.FieldByName("Code")
		if !f.IsValid() {
			return false
		}
		switch f.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			found, ok = int(f.Int()), true
			return true
		}
		return false
	})
	return found, ok
}

// walk calls f on err and every error it wraps (Unwrap() error and
// Unwrap() []error), depth first, until f returns true.
func walk(err error, f func(error) bool) bool {
	if err == nil {
		return false
	}
	if f(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return walk(u.Unwrap(), f)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if walk(e, f) {
				return true
			}
		}
	}
	return false
}

// contended reports whether err is the database answering that it is
// busy: another writer holds the lock (SQLITE_BUSY, SQLITE_LOCKED: what
// dqlite's leader answers at once to a second writer, and SQLite after
// its busy timeout). The database answered: it is reachable, so such an
// answer never counts toward Config.Unreachable (a crowd of waiters
// contending for the lock never makes anyone fail open); the wait goes on
// within its context.
func contended(err error) bool {
	if err == nil {
		return false
	}
	if code, ok := sqliteCode(err); ok {
		switch code & 0xff {
		case 5, 6: // BUSY, LOCKED
			return true
		}
	}
	msg := err.Error()
	return strings.Contains(msg, "database is locked") || strings.Contains(msg, "database table is locked") || strings.Contains(msg, "database schema is locked")
}
