package retry_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// FuzzClassify: every error snapd could answer is classified without a
// panic, and the conflict parser and the classifier agree: a message that
// parses as a conflict makes a 400 or 409 answer a Conflict, with or
// without snapctl's prefixes, and the parsed snap comes back out.
func FuzzClassify(f *testing.F) {
	files, _ := filepath.Glob("../testdata/snapd-golden/*/*.json")
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		var env struct {
			Type       string `json:"type"`
			StatusCode int    `json:"status-code"`
			Result     struct {
				Message string          `json:"message"`
				Kind    string          `json:"kind"`
				Value   json.RawMessage `json:"value"`
			} `json:"result"`
		}
		if json.Unmarshal(b, &env) == nil && env.Type == "error" {
			f.Add(env.StatusCode, env.Result.Kind, env.Result.Message, []byte(env.Result.Value))
		}
	}
	f.Add(400, "", `snap "k8s" has "service-control" change in progress`, []byte(nil))
	f.Add(409, "snap-change-conflict", `snap "k8s" has "install-snap" change in progress`, []byte(`{"change-kind":"install-snap","snap-name":"k8s"}`))
	f.Add(400, "", "remodeling in progress, no other changes allowed until this is done", []byte(nil))
	f.Fuzz(func(t *testing.T, status int, kind, message string, value []byte) {
		apiErr := &snapd.Error{Method: "POST", Path: "/v2/apps", StatusCode: status, Kind: kind, Message: message, Value: value}
		class := retry.Classify(apiErr)
		_ = class.String()
		_ = retry.IsRetryable(apiErr)
		plain := retry.Classify(errors.New(message))
		ce := retry.ParseConflict(message)
		if ce == nil {
			return
		}
		if (status == 400 || status == 409) && class != retry.Conflict {
			t.Fatalf("%d %q parses as a conflict but classifies %v", status, message, class)
		}
		if plain != retry.Conflict {
			t.Fatalf("plain %q parses as a conflict but classifies %v", message, plain)
		}
		for _, p := range []string{"error: ", "error running snapctl: ", "snapctl: "} {
			again := retry.ParseConflict(p + message)
			if again == nil || again.Snap != ce.Snap || again.ChangeKind != ce.ChangeKind || again.AllSnaps != ce.AllSnaps {
				t.Fatalf("prefix %q changes the parse of %q: %+v vs %+v", p, message, again, ce)
			}
		}
		if !ce.AllSnaps && ce.Snap == "" {
			t.Fatalf("conflict without a snap: %+v", ce)
		}
		_ = ce.Error()
	})
}
