package snapd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSideloadFrames checks the multipart body as snapd's readForm reads
// it: the fields snap's client sends for `snap install --dangerous FILE`,
// the file's bytes whole under the "snap" part named by its base name,
// and a Content-Length that is the body's length.
func TestSideloadFrames(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "svcdemo_1.1_amd64.snap")
	content := bytes.Repeat([]byte("squashfs\x00\r\n--"), 5000)
	if err := os.WriteFile(path, content, 0o644); err != nil {
		t.Fatal(err)
	}
	type seen struct {
		length int64
		fields map[string]string
		file   []byte
		name   string
	}
	got := make(chan seen, 1)
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		s := seen{length: r.ContentLength, fields: map[string]string{}}
		mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "multipart/form-data" || r.Method != http.MethodPost || r.URL.Path != "/v2/snaps" {
			t.Errorf("request: %s %s %q %v", r.Method, r.URL.Path, r.Header.Get("Content-Type"), err)
		}
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			p, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Errorf("part: %v", err)
				break
			}
			b, _ := io.ReadAll(p)
			if p.FormName() == "snap" {
				s.file, s.name = b, p.FileName()
			} else {
				s.fields[p.FormName()] = string(b)
			}
		}
		got <- s
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"type":"async","status-code":202,"status":"Accepted","result":null,"change":"42"}`)
	})
	id, err := c.PostSideload(context.Background(), Sideload{Path: path, Name: "svcdemo", Dangerous: true})
	if err != nil || id != "42" {
		t.Fatalf("PostSideload: %q %v", id, err)
	}
	s := <-got
	want := map[string]string{"action": "install", "name": "svcdemo", "snap-path": path, "dangerous": "true"}
	for k, v := range want {
		if s.fields[k] != v {
			t.Errorf("field %s = %q, want %q (all: %v)", k, s.fields[k], v, s.fields)
		}
	}
	if len(s.fields) != len(want) {
		t.Errorf("fields %v, want %v", s.fields, want)
	}
	if !bytes.Equal(s.file, content) || s.name != "svcdemo_1.1_amd64.snap" {
		t.Errorf("file part %q: %d bytes, want %d", s.name, len(s.file), len(content))
	}
	if s.length <= int64(len(content)) {
		t.Errorf("Content-Length %d, want the whole body's (more than the file's %d)", s.length, len(content))
	}
}

// TestSideloadMissingFile fails before anything is sent.
func TestSideloadMissingFile(t *testing.T) {
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a request was sent: %s %s", r.Method, r.URL.Path)
	})
	_, err := c.PostSideload(context.Background(), Sideload{Path: filepath.Join(t.TempDir(), "none.snap"), Name: "svcdemo"})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want not exist", err)
	}
}

// TestPostSnapBodies checks the JSON snapd's postSnap decodes, and the
// answers it gives: a change, or the "no updates available" error kind.
func TestPostSnapBodies(t *testing.T) {
	var bodies []map[string]any
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		var m map[string]any
		json.NewDecoder(r.Body).Decode(&m)
		bodies = append(bodies, m)
		if r.URL.Path != "/v2/snaps/svcdemo" {
			t.Errorf("path %s", r.URL.Path)
		}
		if m["revision"] == "3" {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"type":"error","status-code":400,"status":"Bad Request","result":{"message":"snap has no updates available","kind":"snap-no-update-available"}}`)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"type":"async","status-code":202,"status":"Accepted","result":null,"change":"7"}`)
	})
	ctx := context.Background()
	if id, err := c.PostSnap(ctx, "svcdemo", SnapInstruction{Action: ActionHold, Time: "forever", HoldLevel: "general"}); err != nil || id != "7" {
		t.Fatalf("hold: %q %v", id, err)
	}
	_, err := c.PostSnap(ctx, "svcdemo", SnapInstruction{Action: ActionRefresh, Revision: "3"})
	var apiErr *Error
	if !errors.As(err, &apiErr) || apiErr.Kind != KindSnapNoUpdateAvailable || apiErr.StatusCode != 400 {
		t.Fatalf("refresh: %v", err)
	}
	want := []string{`{"action":"hold","hold-level":"general","time":"forever"}`, `{"action":"refresh","revision":"3"}`}
	for i, b := range bodies {
		j, _ := json.Marshal(b)
		if string(j) != want[i] {
			t.Errorf("body %d = %s, want %s", i, j, want[i])
		}
	}
}

// TestSnapReadsHolds reads a snap with the hold fields snapd (>= 2.58)
// adds, and without them.
func TestSnapReadsHolds(t *testing.T) {
	body := `{"type":"sync","status-code":200,"status":"OK","result":{"name":"svcdemo","version":"1.1","revision":"x2","channel":"","confinement":"strict","type":"app","hold":"2318-03-19T10:41:31.123456789Z","gating-hold":"2026-03-01T00:00:00Z"}}`
	s, err := replay(t, 200, []byte(body)).Snap(context.Background(), "svcdemo")
	if err != nil {
		t.Fatal(err)
	}
	if s.Revision != "x2" || s.Version != "1.1" || s.Hold == nil || s.Hold.Year() != 2318 || s.GatingHold == nil {
		t.Fatalf("snap %+v", s)
	}
	plain := strings.NewReplacer(`,"hold":"2318-03-19T10:41:31.123456789Z","gating-hold":"2026-03-01T00:00:00Z"`, "").Replace(body)
	s, err = replay(t, 200, []byte(plain)).Snap(context.Background(), "svcdemo")
	if err != nil || s.Hold != nil || s.GatingHold != nil {
		t.Fatalf("snap without holds: %+v %v", s, err)
	}
}
