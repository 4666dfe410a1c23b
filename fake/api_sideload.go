package fake

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path/filepath"
	"strings"
)

// postSnaps mirrors daemon/api_snaps.go postSnaps: the content type picks
// a JSON action on several snaps (not modelled: a 400 saying so) or a
// multipart upload of a local snap file (sideloadOrTrySnap).
func (s *Server) postSnaps(r *http.Request, body []byte) *response {
	ct := r.Header.Get("Content-Type")
	mediaType, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return badRequest("cannot parse content type: %v", err)
	}
	if mediaType == "application/json" {
		if cs := strings.ToUpper(params["charset"]); cs != "" && cs != "UTF-8" {
			return badRequest("unknown charset in content type: %s", ct)
		}
		return badRequest("fake snapd does not act on several snaps at once (POST /v2/snaps with JSON)")
	}
	if !strings.HasPrefix(ct, "multipart/") {
		return badRequest("unknown content type: %s", ct)
	}
	return s.sideload(body, params["boundary"])
}

// sideloadForm is what readForm keeps of a multipart upload.
type sideloadForm struct {
	values map[string][]string
	files  map[string][]sideloadFile
}

type sideloadFile struct {
	name string
	data []byte
}

func (f *sideloadForm) isTrue(key string) bool {
	v := f.values[key]
	return len(v) > 0 && v[0] == "true"
}

// readSideloadForm mirrors readForm: non-file parts are values (1 MiB in
// all), file parts are kept with their file names.
func readSideloadForm(body []byte, boundary string) (*sideloadForm, *response) {
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	f := &sideloadForm{values: map[string][]string{}, files: map[string][]sideloadFile{}}
	avail := int64(1024 * 1024)
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, badRequest("cannot read POST form: %v", err)
		}
		name := part.FormName()
		if name == "" {
			continue
		}
		data, err := io.ReadAll(part)
		if err != nil {
			return nil, badRequest("cannot read form data: %v", err)
		}
		if part.FileName() == "" {
			avail -= int64(len(data))
			if avail < 0 {
				return nil, badRequest("cannot read form data: exceeds memory limit")
			}
			f.values[name] = append(f.values[name], string(data))
			continue
		}
		f.files[name] = append(f.files[name], sideloadFile{name: part.FileName(), data: data})
	}
	return f, nil
}

// sideload mirrors sideloadOrTrySnap and sideloadSnap for one snap file
// installed over the installed snap, as `snap install --dangerous FILE`
// does: an install-snap change (also over an installed snap: a refresh in
// all but its kind) with summary `Install "x" snap from file "FILE"` (FILE
// is the snap-path value when the form has one, as the snap client sends,
// else the file part's name), a
// new local revision (x1, x2, ...: every local install gets one, even of
// the same file), its services stopped and started as a refresh does.
// Without dangerous (or devmode) snapd looks for the file's assertions,
// which a local file has none of. A conflict is 409 snap-change-conflict.
//
// The fake cannot read squashfs: it reads the file as a meta/snap.yaml
// (SnapFromYAML: name, version, apps), or as a snaps file with one snap
// (ParseSnaps: durations, fail-start), or, for a real .snap, takes the name
// and version from its file name (NAME_VERSION_ARCH.snap, as `snap pack`
// names it) and keeps the installed apps. A file for a snap that is not
// installed is refused (the fake installs no new snaps).
func (s *Server) sideload(body []byte, boundary string) *response {
	form, rsp := readSideloadForm(body, boundary)
	if rsp != nil {
		return rsp
	}
	devmode, jailmode, classic := form.isTrue("devmode"), form.isTrue("jailmode"), form.isTrue("classic")
	switch {
	case jailmode && devmode:
		return badRequest("cannot use devmode and jailmode flags together")
	case devmode && classic:
		return badRequest("cannot use classic and devmode flags together")
	}
	if a := form.values["action"]; len(a) > 0 && a[0] == "try" {
		if len(form.values["snap-path"]) == 0 {
			return badRequest("need 'snap-path' value in form")
		}
		return badRequest("fake snapd does not try snaps (snap try)")
	}
	if t := form.values["transaction"]; len(t) > 0 && t[0] != "per-snap" && t[0] != "all-snaps" {
		return badRequest("transaction must be either %q or %q", "per-snap", "all-snaps")
	}
	files := form.files["snap"]
	if len(files) == 0 {
		return badRequest(`cannot find "snap" file field in provided multipart/form-data payload`)
	}
	if len(files) > 1 {
		return badRequest("fake snapd installs one snap file at a time")
	}
	file := files[0]
	// GetSnapFiles: with one file and a snap-path value (the snap client
	// sends the path it was given), that value is the file's name in the
	// summary and the errors, verbatim.
	fname := file.name
	if sp := form.values["snap-path"]; len(sp) > 0 {
		fname = sp[0]
	}
	if !form.isTrue("dangerous") && !devmode {
		what := "snap"
		if s.cfg.version.atLeast(Version268) {
			what = "snap/component"
		}
		return badRequest("cannot find signatures with metadata for %s %q", what, fname)
	}
	to, name, err := readSnapFile(fname, file.data)
	if err != nil {
		return badRequest("cannot read snap file: %v", err)
	}
	if n := form.values["name"]; len(n) > 0 && n[0] != "" && n[0] != name {
		return badRequest("instance name %q does not match snap name %q", n[0], name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.snaps[name]
	if ss == nil {
		return badRequest("fake snapd installs a snap file only over the installed snap (%q is not installed)", name)
	}
	if ce := s.conflictLocked([]string{name}, ""); ce != nil {
		return s.conflictResponseLocked(ce, true)
	}
	cur := s.currentRevLocked(ss)
	to.rev = nextLocalRevision(ss.seq)
	if to.apps == nil {
		to.apps = cur.apps
	}
	op := &snapOp{kind: "install-snap", ss: ss, to: to, file: fname}
	return s.startSnapOpLocked(op, fmt.Sprintf("Install %q snap from file %q", name, fname))
}

// nextLocalRevision is the local revision prepare-snap gives a local
// install (overlord/snapstate/handlers.go doPrepareSnap): one past the
// sequence's newest local revision, x1 when there is none.
func nextLocalRevision(seq []revState) string {
	n := 0
	for _, r := range seq {
		var k int
		if _, err := fmt.Sscanf(r.rev, "x%d", &k); err == nil && k > n {
			n = k
		}
	}
	return fmt.Sprintf("x%d", n+1)
}

// readSnapFile reads what the fake can of an uploaded snap file.
func readSnapFile(filename string, data []byte) (revState, string, error) {
	if bytes.HasPrefix(data, []byte("hsqs")) {
		// a real squashfs .snap: its name and version from its file name
		parts := strings.Split(strings.TrimSuffix(filepath.Base(filename), ".snap"), "_")
		if len(parts) < 2 || parts[0] == "" || parts[1] == "" {
			return revState{}, "", fmt.Errorf("fake snapd cannot read squashfs: name the file NAME_VERSION_ARCH.snap (got %q)", filename)
		}
		return revState{version: parts[1]}, parts[0], nil
	}
	if sn, err := SnapFromYAML(data); err == nil {
		return revState{version: sn.Version, apps: sn.Apps}, sn.Name, nil
	}
	sns, err := ParseSnaps(data)
	if err != nil || len(sns) != 1 {
		return revState{}, "", fmt.Errorf("fake snapd reads a snap file as meta/snap.yaml, a snaps file with one snap, or a squashfs named NAME_VERSION_ARCH.snap: %q is none of them", filename)
	}
	return revState{version: sns[0].Version, apps: sns[0].Apps}, sns[0].Name, nil
}
