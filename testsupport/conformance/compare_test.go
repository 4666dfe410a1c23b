package conformance

import (
	"strings"
	"testing"
)

func TestCompareCatchesDifferences(t *testing.T) {
	golden := `{"type":"sync","status-code":200,"status":"OK","result":{"id":"8","status":"Done","tasks":[{"id":"45","log":["2026-12-02T14:09:11Z INFO Waiting"],"spawn-time":"2026-12-02T14:09:10.2Z"}],"ready":true}}`
	for _, tc := range []struct {
		actual string
		want   string // substring of a diff; "" = no diff
	}{
		// ids, timestamps and log text may differ
		{`{"type":"sync","status-code":200,"status":"OK","result":{"id":"3","status":"Done","tasks":[{"id":"9","log":["2027-01-01T00:00:00Z INFO other text"],"spawn-time":"2030-01-01T00:00:00Z"}],"ready":true}}`, ""},
		{`{"type":"sync","status-code":200,"status":"OK","result":{"id":"3","status":"Doing","tasks":[{"id":"9","log":["x INFO y"],"spawn-time":"t"}],"ready":true}}`, `"Doing", want "Done"`},
		{`{"type":"sync","status-code":200,"status":"OK","result":{"id":"3","status":"Done","tasks":[{"id":"9","log":["x INFO y"],"spawn-time":"t"}],"ready":true,"err":"x"}}`, `extra key "err"`},
		{`{"type":"sync","status-code":200,"status":"OK","result":{"id":"3","status":"Done","tasks":[{"id":"9","spawn-time":"t"}],"ready":true}}`, `missing key "log"`},
		{`{"type":"sync","status-code":200,"status":"OK","result":{"id":"3","status":"Done","tasks":[{"id":"9","log":["x ERROR y"],"spawn-time":"t"}],"ready":true}}`, `log level "ERROR"`},
		{`{"type":"sync","status-code":200,"status":"OK","result":{"id":3,"status":"Done","tasks":[{"id":"9","log":["x INFO y"],"spawn-time":"t"}],"ready":true}}`, `type number, want string`},
		{`{"type":"sync","status-code":200,"status":"OK","result":{"id":"3","status":"Done","tasks":[],"ready":true}}`, `0 elements, want 1`},
	} {
		diffs := Compare([]byte(golden), []byte(tc.actual))
		got := strings.Join(diffs, "\n")
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("Compare(%s):\n%s\nwant %q", tc.actual, got, tc.want)
		}
	}
}

func TestCompareChangeListsUnordered(t *testing.T) {
	a := `{"result":[{"id":"1","kind":"a","summary":"s","status":"Done","ready":true},{"id":"2","kind":"b","summary":"s","status":"Doing","ready":false}]}`
	b := `{"result":[{"id":"7","kind":"b","summary":"s","status":"Doing","ready":false},{"id":"6","kind":"a","summary":"s","status":"Done","ready":true}]}`
	if d := Compare([]byte(a), []byte(b)); len(d) != 0 {
		t.Fatal(d)
	}
	c := `{"result":[{"id":"7","kind":"b","summary":"s","status":"Doing","ready":false},{"id":"6","kind":"a","summary":"s","status":"Doing","ready":true}]}`
	if d := Compare([]byte(a), []byte(c)); len(d) == 0 {
		t.Fatal("no diff for a different status")
	}
}
