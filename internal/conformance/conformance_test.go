package conformance_test

import (
	"testing"

	"github.com/snapsvc/snapsvc/fake"
	"github.com/snapsvc/snapsvc/internal/conformance"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// notReproducible257 lists the 2.57.6 cases the fake does not reproduce,
// with the reason. Run fails if a listed case starts matching, so the list
// cannot silently go stale (or grow without a reason written here).
var notReproducible257 = map[string]string{}

func TestFakeConforms257(t *testing.T) {
	target := conformance.NewFakeTarget(t, fake.Version257)
	conformance.Run(t, target, "testdata/2.57.6", conformance.Scenario257, notReproducible257)
}
