package snapd

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goldenBodies returns every body captured from real snapd, to seed the
// fuzzers with what snapd really sends.
func goldenBodies(f *testing.F) [][]byte {
	f.Helper()
	files, err := filepath.Glob(filepath.Join("..", "..", "testdata", "snapd-golden", "*", "*.json"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no golden bodies: %v", err)
	}
	var out [][]byte
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// FuzzDecode: any body, with any status, decodes into an envelope or one of
// the two decoding errors, never a panic; an error envelope is always an
// *Error carrying a status.
func FuzzDecode(f *testing.F) {
	for _, b := range goldenBodies(f) {
		var env struct {
			StatusCode int `json:"status-code"`
		}
		_ = json.Unmarshal(b, &env)
		f.Add(b, env.StatusCode)
	}
	f.Add([]byte(`{"type":"error","result":null}`), 500)
	f.Add([]byte(`<html>502</html>`), 502)
	f.Fuzz(func(t *testing.T, body []byte, status int) {
		rsp, err := Decode("GET", "/v2/changes", status, body)
		var apiErr *Error
		var re *ResponseError
		switch {
		case err == nil:
			if rsp == nil || rsp.Type == "" || rsp.Type == TypeError {
				t.Fatalf("no error, response %+v", rsp)
			}
		case errors.As(err, &apiErr):
			if rsp == nil || rsp.Type != TypeError || apiErr.StatusCode == 0 && status != 0 {
				t.Fatalf("error envelope %+v decoded as %#v", rsp, apiErr)
			}
			_ = apiErr.Error()
			_ = apiErr.ValueMap()
			_ = errors.Is(err, ErrNotFound)
		case errors.As(err, &re):
			if rsp != nil {
				t.Fatalf("undecodable body returned a response %+v", rsp)
			}
			_ = re.Error()
		default:
			t.Fatalf("unexpected error type %T: %v", err, err)
		}
	})
}

// FuzzNotices: the result of GET /v2/notices (or anything in its place)
// decodes into notices or a ResponseError, and every notice decoded has
// the fields the waiting code reads.
func FuzzNotices(f *testing.F) {
	for _, b := range goldenBodies(f) {
		if strings.Contains(string(b), `"occurrences"`) {
			f.Add(b)
		}
	}
	f.Add([]byte(`{"type":"sync","status-code":200,"status":"OK","result":[{"id":"1","key":"7","last-repeated":"2026-12-02T14:00:00.5Z","last-data":{"kind":"x"}}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		rsp, err := Decode("GET", "/v2/notices", 200, body)
		if err != nil {
			return
		}
		var ns []Notice
		if err := decodeResult("GET", "/v2/notices", rsp, &ns); err != nil {
			var re *ResponseError
			if !errors.As(err, &re) {
				t.Fatalf("result error %T", err)
			}
			return
		}
		for _, n := range ns {
			_ = n.LastRepeated.After(n.FirstOccurred)
			_ = n.LastData["kind"]
		}
	})
}
