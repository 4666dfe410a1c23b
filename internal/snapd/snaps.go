package snapd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"time"
)

// Error kinds of POST /v2/snaps and /v2/snaps/{name} (client/errors.go).
const (
	// KindSnapNoUpdateAvailable: a refresh found nothing newer; snapd
	// made no change (store.ErrNoUpdateAvailable, daemon/errors.go
	// errToResponse: HTTP 400, message "snap has no updates available").
	KindSnapNoUpdateAvailable = "snap-no-update-available"
	// KindSnapLocal: a store refresh of a snap installed from a file.
	KindSnapLocal = "snap-local"
	// KindSnapNotInstalled: the snap is not installed (value: its name).
	KindSnapNotInstalled = "snap-not-installed"
	// KindSnapRevisionNotAvailable: the store has no such revision.
	KindSnapRevisionNotAvailable = "snap-revision-not-available"
)

// Actions of POST /v2/snaps/{name} snapsvc sends.
const (
	ActionRefresh = "refresh"
	ActionHold    = "hold"
	ActionUnhold  = "unhold"
)

// SnapInstruction is the part of POST /v2/snaps/{name}'s body
// (daemon/api_snaps.go snapInstruction) snapsvc sends. snapd decodes it
// without DisallowUnknownFields, and validates it before it dispatches:
// time and hold-level only with "hold" (snapd >= 2.58), revision as a
// string ("42", "x2": snap.Revision's JSON form).
type SnapInstruction struct {
	Action    string `json:"action"`
	Channel   string `json:"channel,omitempty"`
	Revision  string `json:"revision,omitempty"`
	Time      string `json:"time,omitempty"`
	HoldLevel string `json:"hold-level,omitempty"`
	Amend     bool   `json:"amend,omitempty"`
	Classic   bool   `json:"classic,omitempty"`
}

// PostSnap sends inst for snap name and returns the id of the change snapd
// made (hold and unhold make one that is Done at once).
func (c *Client) PostSnap(ctx context.Context, name string, inst SnapInstruction) (string, error) {
	path := "/v2/snaps/" + url.PathEscape(name)
	rsp, err := c.do(ctx, request{method: http.MethodPost, path: path, body: inst})
	if err != nil {
		return "", err
	}
	if rsp.Type != TypeAsync || rsp.Change == "" {
		return "", &ResponseError{Method: http.MethodPost, Path: path, StatusCode: rsp.HTTPStatus, Err: ErrNoChange}
	}
	return rsp.Change, nil
}

// Sideload is a local snap file to install as POST /v2/snaps's multipart
// form does it (daemon/api_sideload_n_try.go sideloadOrTrySnap), as `snap
// install --dangerous FILE` sends it (client/snap_op.go sendSnapFiles).
type Sideload struct {
	// Path is the file. It is sent as the form's "snap-path" too, which
	// snapd names in the change's summary: `Install "NAME" snap from file
	// "PATH"` (one file with snap-path: GetSnapFiles).
	Path string
	// Name is the instance name the file must install as ("name"): snapd
	// refuses a file of another snap ("instance name %q does not match
	// snap name %q").
	Name string
	// Dangerous installs the file without assertions ("dangerous").
	Dangerous bool
	// Classic allows a classically confined snap ("classic").
	Classic bool
}

// PostSideload uploads s's file to POST /v2/snaps and returns the id of the
// install-snap change snapd made. The file is streamed from disk, opened
// afresh each time net/http sends the request.
func (c *Client) PostSideload(ctx context.Context, s Sideload) (string, error) {
	const path = "/v2/snaps"
	rsp, err := c.do(ctx, request{method: http.MethodPost, path: path, upload: s.body})
	if err != nil {
		return "", err
	}
	if rsp.Type != TypeAsync || rsp.Change == "" {
		return "", &ResponseError{Method: http.MethodPost, Path: path, StatusCode: rsp.HTTPStatus, Err: ErrNoChange}
	}
	return rsp.Change, nil
}

// uploadBody is a request body streamed from a file between a prefix and
// a trailer held in memory, of known length and content type.
type uploadBody struct {
	io.Reader
	f           *os.File
	contentType string
	length      int64
}

// Close closes the file.
func (b *uploadBody) Close() error { return b.f.Close() }

// body opens s's file and frames it as snap's client does: the fields
// (action, name, snap-path, dangerous), then the file as the "snap" part
// named by its base name. It is built without a goroutine: the framing is
// written once, around the file's bytes.
func (s Sideload) body() (*uploadBody, error) {
	f, err := os.Open(s.Path)
	if err != nil {
		return nil, fmt.Errorf("cannot open %q: %w", s.Path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("cannot read %q: %w", s.Path, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("cannot upload %q: not a regular file", s.Path)
	}
	var head, tail bytes.Buffer
	out := &switchWriter{w: &head}
	mw := multipart.NewWriter(out)
	fields := [][2]string{{"action", "install"}, {"name", s.Name}, {"snap-path", s.Path}}
	if s.Dangerous {
		fields = append(fields, [2]string{"dangerous", "true"})
	}
	if s.Classic {
		fields = append(fields, [2]string{"classic", "true"})
	}
	if s.Classic {
		fields = append(fields, [2]string{"classic", "true"})
	}
	for _, kv := range fields {
		if kv[1] == "" {
			continue
		}
		if err := mw.WriteField(kv[0], kv[1]); err != nil {
			f.Close()
			return nil, err
		}
	}
	if _, err := mw.CreateFormFile("snap", baseName(s.Path)); err != nil {
		f.Close()
		return nil, err
	}
	out.w = &tail
	if err := mw.Close(); err != nil {
		f.Close()
		return nil, err
	}
	return &uploadBody{
		Reader:      io.MultiReader(&head, io.LimitReader(f, fi.Size()), &tail),
		f:           f,
		contentType: mw.FormDataContentType(),
		length:      int64(head.Len()) + fi.Size() + int64(tail.Len()),
	}, nil
}

// switchWriter writes to w, which may be switched between writes.
type switchWriter struct{ w io.Writer }

func (s *switchWriter) Write(p []byte) (int, error) { return s.w.Write(p) }

// baseName is filepath.Base for a path that names a file.
func baseName(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}

// Publisher is a snap's publisher (client/packages.go snap.StoreAccount).
type Publisher struct {
	ID          string `json:"id"`
	Username    string `json:"username"`
	DisplayName string `json:"display-name"`
	Validation  string `json:"validation,omitempty"`
}

// Snap is the part of GET /v2/snaps/{name} snapsvc reads (client/packages.go
// Snap, filled by daemon/snap.go mapLocal).
type Snap struct {
	Name            string     `json:"name"`
	Version         string     `json:"version"`
	Revision        string     `json:"revision"`
	Channel         string     `json:"channel"`
	TrackingChannel string     `json:"tracking-channel,omitempty"`
	Confinement     string     `json:"confinement"`
	Type            string     `json:"type"`
	Publisher       *Publisher `json:"publisher,omitempty"`
	// Hold is when the refresh hold an administrator put on the snap ends
	// (snap refresh --hold; "forever" is ~292 years ahead); GatingHold
	// when the longest hold a snap's gate-auto-refresh hook put on it
	// ends. Both are absent when there is none (snapd >= 2.58).
	Hold       *time.Time `json:"hold,omitempty"`
	GatingHold *time.Time `json:"gating-hold,omitempty"`
}

// Snap reads one installed snap. A snap not installed is an *Error that
// matches ErrNotFound (404, kind snap-not-found).
func (c *Client) Snap(ctx context.Context, name string) (*Snap, error) {
	path := "/v2/snaps/" + url.PathEscape(name)
	rsp, err := c.do(ctx, request{method: http.MethodGet, path: path})
	if err != nil {
		return nil, err
	}
	var s Snap
	if err := decodeResult(http.MethodGet, path, rsp, &s); err != nil {
		return nil, err
	}
	return &s, nil
}
