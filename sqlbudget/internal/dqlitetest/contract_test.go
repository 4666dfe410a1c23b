//go:build libsqlite3

package dqlitetest

import (
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

// The backend-agnostic budget contract on a real 3-node dqlite cluster:
// every participant is a client of the cluster with a connection pool of
// its own, its transactions run by the leader, expiry judged by the
// leader's clock.
func TestContractDqlite(t *testing.T) {
	c := cluster(t)
	h := &sqltest.Harness{TTL: contractTTL, Open: func(t *testing.T) sqlbudget.TxFunc {
		db := c.DB("contract")
		t.Cleanup(func() { db.Close() })
		return sqlbudget.DBTx(db)
	}}
	cfg := budgetcontract.Config{TTL: contractTTL, Slack: 2 * time.Second}
	budgetcontract.Run(t, h, cfg)
	budgetcontract.RunWholePath(t, h, cfg)
}
