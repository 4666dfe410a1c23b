//go:build libsqlite3

package dqlitetest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/sqlbudget"
	"github.com/snapsvc/snapsvc/sqlbudget/internal/sqltest"
	"github.com/snapsvc/snapsvc/testsupport/budgetcontract"
)

// contractTTL: rows of the contract's participants (3 s: with 2 s, a
// holder on a loaded 2-core machine under -race once missed its renewals
// and lost its slot in max-never-exceeded). Every transaction
// goes to the leader over loopback, a Raft round for each write.
const contractTTL = 3 * time.Second

// The backend-agnostic budget contract on a real 3-node dqlite cluster of
// its own, whose nodes run under libfaketime (the contract steps their
// wall clock): every participant is a client of the cluster with a
// connection pool of its own, its transactions run by the leader.
func TestContractDqlite(t *testing.T) {
	if _, err := os.Stat(libfaketime); err != nil {
		t.Fatalf("%v: run .ci/dqlite-deps (Debian's libfaketime)", err)
	}
	clock := fakeClock{file: filepath.Join(t.TempDir(), "faketime.rc")}
	clock.set(t, 0)
	c := newCluster(t, clock.env()...)
	offset := time.Duration(0)
	h := &sqltest.Harness{TTL: contractTTL, Open: func(t *testing.T) sqlbudget.TxFunc {
		db := c.DB("contract")
		t.Cleanup(func() { db.Close() })
		return sqlbudget.DBTx(db)
	}, Step: func(t *testing.T, d time.Duration) {
		offset += d
		clock.set(t, offset)
		awaitOffset(ctxT(t, time.Minute), t, c, offset)
	}}
	cfg := budgetcontract.Config{TTL: contractTTL, Slack: 2 * time.Second}
	budgetcontract.Run(t, h, cfg)
	budgetcontract.RunWholePath(t, h, cfg)
}
