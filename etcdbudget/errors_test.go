package etcdbudget_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/snapsvc/snapsvc/budget"
	"github.com/snapsvc/snapsvc/etcdbudget"
)

// An etcd client the application closed is permanent: no retry can
// reach etcd through it. Acquire fails at once with an error wrapping
// budget.ErrRefused that names the key, and a FailOpen budget never
// grants a slot on it (it used to retry for Unreachable, as if etcd were
// away, and then grant an unbudgeted slot: issue 33's defect 2, on etcd).
func TestClosedClientNeverFailsOpen(t *testing.T) {
	p := cluster(t)
	ctx := ctxT(t, time.Minute)
	cli, err := newClient(p.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	cli.Close()
	b := newBudget(t, cli, "node-a", 1, func(c *etcdbudget.Config) { c.FailOpen = true; c.Unreachable = 2 * time.Second })
	start := time.Now()
	s, err := b.Acquire(ctx, "k8s.kube-apiserver", nil)
	took := time.Since(start)
	if s != nil {
		t.Fatalf("a slot was granted (%s) through a closed client", s.Holder())
	}
	if !errors.Is(err, budget.ErrRefused) || errors.Is(err, budget.ErrUnavailable) || !strings.Contains(err.Error(), "k8s.kube-apiserver") {
		t.Fatalf("Acquire through a closed client: %v; want ErrRefused naming the key, not ErrUnavailable", err)
	}
	if took > time.Second {
		t.Errorf("refused after %s: a closed client is not retried", took)
	}
	if st := b.Stats(); st.FailOpenGrants != 0 || st.Refused != 1 {
		t.Errorf("stats %+v: want 1 refusal, no fail-open grant", st)
	}
}
