package retry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// expectedGolden lists every error body captured from real snapd in
// testdata/snapd-golden with the class it must get. A body missing from the
// table fails the test, so new captures cannot go unclassified.
var expectedGolden = map[string]struct {
	class      retry.Class
	snap, kind string
	// asAct is the class the body gets as the answer to a request to act
	// (a POST), when it differs: "request canceled" may come after snapd
	// carried the request out.
	asAct retry.Class
}{
	"apps-bad-select":                     {class: retry.Permanent},
	"apps-unknown-app":                    {class: retry.Permanent},
	"apps-unknown-snap":                   {class: retry.Permanent},
	"change-not-found":                    {class: retry.Permanent},
	"conflict-restart-alpha":              {class: retry.Conflict, snap: "svcdemo", kind: "service-control"},
	"conflict-start-snap":                 {class: retry.Conflict, snap: "svcdemo", kind: "service-control"},
	"conflict-stop-beta":                  {class: retry.Conflict, snap: "svcdemo", kind: "service-control"},
	"conflict-restart-during-configure":   {class: retry.Conflict, snap: "svcdemo", kind: "configure-snap"},
	"conflict-stop-snap-during-configure": {class: retry.Conflict, snap: "svcdemo", kind: "configure-snap"},
	"rest-conflict-during-snapctl":        {class: retry.Conflict, snap: "svcdemo", kind: "service-control"},
	"snapctl-conflict-restart-alpha":      {class: retry.Conflict, snap: "svcdemo", kind: "service-control"},
	"snapctl-restart-during-configure":    {class: retry.Conflict, snap: "svcdemo", kind: "configure-snap"},
	"put-conf-during-configure":           {class: retry.Conflict, snap: "svcdemo", kind: "configure-snap"},
	"x-conflict-apps-during-install":      {class: retry.Conflict, snap: "svcdemo", kind: "install-snap"},
	"x-conflict-conf-during-install":      {class: retry.Conflict, snap: "svcdemo", kind: "install-snap"},
	"x-conflict-remove-during-install":    {class: retry.Conflict, snap: "svcdemo", kind: "install-snap"},
	"x-conflict-snapctl-during-install":   {class: retry.Conflict, snap: "svcdemo", kind: "install-snap"},
	"restart-longpoll-inflight":           {class: retry.Transient, asAct: retry.Indeterminate},
	"notices-bad-after":                   {class: retry.Permanent},
	"notices-bad-timeout":                 {class: retry.Permanent},
	"notices-snapsock":                    {class: retry.Permanent},
	"post-bad-action":                     {class: retry.Permanent},
	"post-bad-json":                       {class: retry.Permanent},
	"post-no-names":                       {class: retry.Permanent},
	"post-non-service-app":                {class: retry.Permanent},
	"post-unknown-app":                    {class: retry.Permanent},
	"post-unknown-snap":                   {class: retry.Permanent},
	"selfrestart-post-install":            {class: retry.Permanent},
	"snapctl-bad-cookie":                  {class: retry.Permanent},
	"snapctl-no-args":                     {class: retry.Permanent},
	"snapctl-other-snap-svc":              {class: retry.Permanent},
	"snapctl-services-mainsock":           {class: retry.Permanent},
	"snapctl-unknown-cmd":                 {class: retry.Permanent},
	"x-after-plus-raw":                    {class: retry.Permanent},
	"x-notice-by-id-404":                  {class: retry.Permanent},
}

func TestClassifyGoldenBodies(t *testing.T) {
	files, err := filepath.Glob("../testdata/snapd-golden/*/*.json")
	if err != nil || len(files) < 200 {
		t.Fatalf("golden bodies: %d files, %v", len(files), err)
	}
	seen := map[string]bool{}
	errorBodies := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var env struct {
			Type   string `json:"type"`
			Status int    `json:"status-code"`
		}
		if err := json.Unmarshal(data, &env); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		// Decoded as the answer to a read (a GET); errorBodies below
		// checks the answer to a request to act too.
		_, decodeErr := snapd.Decode("GET", "/v2/test", env.Status, data)
		if env.Type != snapd.TypeError {
			if decodeErr != nil {
				t.Errorf("%s: a %s body decoded as an error: %v", f, env.Type, decodeErr)
			}
			continue
		}
		errorBodies++
		want, ok := expectedGolden[name]
		if !ok {
			t.Errorf("%s: error body not in the expected table: %v", f, decodeErr)
			continue
		}
		seen[name] = true
		var apiErr *snapd.Error
		if !errors.As(decodeErr, &apiErr) {
			t.Fatalf("%s: decoded as %T, want *snapd.Error", f, decodeErr)
		}
		if got := retry.Classify(decodeErr); got != want.class {
			t.Errorf("%s: class %v, want %v (%v)", f, got, want.class, decodeErr)
		}
		wantAct := want.class
		if want.asAct != 0 {
			wantAct = want.asAct
		}
		_, actErr := snapd.Decode("POST", "/v2/test", env.Status, data)
		if got := retry.Classify(actErr); got != wantAct {
			t.Errorf("%s: as the answer to a POST: class %v, want %v (%v)", f, got, wantAct, actErr)
		}
		ce, isConflict := retry.AsConflict(decodeErr)
		if isConflict != (want.class == retry.Conflict) {
			t.Errorf("%s: AsConflict = %v", f, isConflict)
		}
		if isConflict {
			if ce.Snap != want.snap || ce.ChangeKind != want.kind {
				t.Errorf("%s: conflict on snap %q kind %q, want %q %q", f, ce.Snap, ce.ChangeKind, want.snap, want.kind)
			}
			if !errors.Is(ce, decodeErr) && !errors.As(ce, &apiErr) {
				t.Errorf("%s: conflict error does not wrap the snapd error", f)
			}
		}
	}
	if errorBodies < 60 {
		t.Errorf("only %d error bodies found", errorBodies)
	}
	for name := range expectedGolden {
		if !seen[name] {
			t.Errorf("expected body %s not found in testdata", name)
		}
	}
}

func TestClassifyTextForms(t *testing.T) {
	cases := []struct {
		text      string
		class     retry.Class
		snap      string
		kind      string
		allSnaps  bool
		anyChange bool
	}{
		// k8sd's log line (snapctl binary, snapd < 2.70).
		{text: `error: error running snapctl: snap "k8s" has "service-control" change in progress`, class: retry.Conflict, snap: "k8s", kind: "service-control"},
		// snapd >= 2.70 through the snapctl binary.
		{text: `error: snapctl: snap "microk8s" has "service-control" change in progress`, class: retry.Conflict, snap: "microk8s", kind: "service-control"},
		{text: `snap "nextcloud" has "auto-refresh" change in progress`, class: retry.Conflict, snap: "nextcloud", kind: "auto-refresh"},
		{text: `snap "k8s" has changes in progress`, class: retry.Conflict, snap: "k8s", anyChange: true},
		{text: `remodeling in progress, no other changes allowed until this is done`, class: retry.Conflict, kind: "remodel", allSnaps: true},
		{text: `transition to snapd snap in progress, no other changes allowed until this is done`, class: retry.Conflict, kind: "transition-to-snapd-snap", allSnaps: true},
		{text: `snapd downgrade in progress, no other changes allowed until this is done`, class: retry.Conflict, allSnaps: true},
		{text: `error running snapctl: restart command is taking too long`, class: retry.Indeterminate},
		{text: `error: cannot communicate with server: timeout exceeded while waiting for response`, class: retry.Indeterminate},
		{text: `error: snapctl: unknown service: "other.x"`, class: retry.Permanent},
		{text: `something in progress, no other changes allowed until this is done`, class: retry.Permanent},
	}
	for _, c := range cases {
		err := errors.New(c.text)
		if got := retry.Classify(err); got != c.class {
			t.Errorf("%q: class %v, want %v", c.text, got, c.class)
		}
		if retry.IsConflict(err) != (c.class == retry.Conflict) || retry.IsRetryable(err) != (c.class != retry.Permanent) {
			t.Errorf("%q: IsConflict/IsRetryable disagree with class %v", c.text, c.class)
		}
		ce, ok := retry.AsConflict(fmt.Errorf("wrapped: %w", err))
		if ok != (c.class == retry.Conflict) {
			// AsConflict reads the whole text; a wrapped text carries a
			// prefix the parser does not strip, so only direct errors parse.
			ce, ok = retry.AsConflict(err)
		}
		if ok != (c.class == retry.Conflict) {
			t.Errorf("%q: AsConflict = %v", c.text, ok)
			continue
		}
		if ok && (ce.Snap != c.snap || ce.ChangeKind != c.kind || ce.AllSnaps != c.allSnaps) {
			t.Errorf("%q: got %+v", c.text, ce)
		}
	}
}

func TestClassifyTransportAndContext(t *testing.T) {
	lostPost := &snapd.ConnectionError{Method: "POST", Path: "/v2/apps", Written: true, Err: errors.New("EOF")}
	refused := &snapd.ConnectionError{Method: "POST", Path: "/v2/apps", Err: errors.New("connection refused")}
	lostGet := &snapd.ConnectionError{Method: "GET", Path: "/v2/apps", Written: true, Err: errors.New("EOF")}
	maint := &snapd.Error{StatusCode: 500, Message: "whatever", Maintenance: &snapd.Maintenance{Kind: "daemon-restart"}}
	maintNotFound := &snapd.Error{StatusCode: 404, Kind: "app-not-found", Message: "no", Maintenance: &snapd.Maintenance{Kind: "system-restart"}}
	for _, c := range []struct {
		err  error
		want retry.Class
	}{
		{lostPost, retry.Indeterminate},
		{refused, retry.Transient},
		{lostGet, retry.Transient},
		{maint, retry.Transient},
		{maintNotFound, retry.Permanent},
		{&snapd.Error{StatusCode: 503}, retry.Transient},
		{&snapd.Error{StatusCode: 401, Kind: "login-required"}, retry.Permanent},
		{context.Canceled, retry.Permanent},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), retry.Permanent},
		// A garbled answer: a read is asked again, a request to act may
		// have been accepted (a 202 certainly was).
		{&snapd.ResponseError{Method: "GET", Path: "/v2/changes/1", StatusCode: 200, Err: errors.New("bad")}, retry.Transient},
		{&snapd.ResponseError{Method: "POST", Path: "/v2/apps", StatusCode: 202, Err: errors.New("bad")}, retry.Indeterminate},
		{&snapd.ResponseError{Method: "POST", Path: "/v2/apps", StatusCode: 202, Err: snapd.ErrNoChange}, retry.Indeterminate},
		{nil, retry.Permanent},
	} {
		if got := retry.Classify(c.err); got != c.want {
			t.Errorf("%v: %v, want %v", c.err, got, c.want)
		}
	}
	if retry.IsRetryable(&snapd.Error{StatusCode: 404, Kind: "app-not-found"}) {
		t.Error("app-not-found is retryable")
	}
	if !retry.IsUnreachable(refused) || retry.IsUnreachable(lostPost) ||
		retry.IsUnreachable(&snapd.ConnectionError{Method: "GET", Connected: true, Err: errors.New("reset")}) {
		t.Error("IsUnreachable: only failures to connect count")
	}
}

// Issue 36: a socket path that is a directory or a regular file, or one
// this process may not connect to, was retried for 30 s as an unreachable
// snapd. Dialled for real, each is Permanent at once and not unreachable;
// a missing socket stays Transient.
func TestClassifyBadSocketPaths(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]retry.Class{
		dir:                          retry.Permanent,
		file:                         retry.Permanent,
		filepath.Join(dir, "absent"): retry.Transient,
	} {
		_, err := snapd.New(path).Apps(context.Background(), nil, true)
		if got := retry.Classify(err); got != want {
			t.Errorf("%s: %v is %v, want %v", path, err, got, want)
		}
		if unreachable := retry.IsUnreachable(err); unreachable != (want == retry.Transient) {
			t.Errorf("%s: IsUnreachable %t", path, unreachable)
		}
		if want == retry.Permanent && !errors.Is(err, snapd.ErrNotSocket) {
			t.Errorf("%s: %v does not match ErrNotSocket", path, err)
		}
	}
	denied := &snapd.ConnectionError{Method: "GET", Path: "/v2/apps", Err: &snapd.SocketError{Socket: "/run/snapd.socket", Problem: "cannot be connected to: permission denied", Denied: true, Err: os.ErrPermission}}
	if retry.Classify(denied) != retry.Permanent || retry.IsUnreachable(denied) || !errors.Is(denied, os.ErrPermission) {
		t.Errorf("%v: want Permanent, not unreachable, matching os.ErrPermission", denied)
	}
}
