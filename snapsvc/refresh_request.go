package snapsvc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/snapsvc/snapsvc/internal/snapd"
)

// A refresh is a request (request.go) like a restart: it flows through the
// same phases (operation.go), its budget slots are the whole snap's, and
// only three things are its own, here: what it sends (POST /v2/snaps/NAME,
// or the multipart POST /v2/snaps of a local file), the change it makes
// (how a look-up tells it among snapd's changes, matchesRefresh), and the
// answer that is an outcome rather than a failure ("no updates
// available", operation.noUpdate).

// refreshSpec is what a refresh asks for; exactly one of channel and
// revision (or both), or file, or none (the tracked channel's latest).
type refreshSpec struct {
	channel  string
	revision string
	file     string // absolute path of a local snap file
	amend    bool
	classic  bool
}

// Refresh change kinds and summaries (daemon/api_snaps.go: changeKind,
// installRefreshMessage, in 2.57.6 snapUpdate; daemon/api_sideload_n_try.go
// sideloadSnap): a store refresh is a "refresh-snap" change summarised
// `Refresh "NAME" snap`, with ` from "CHANNEL" channel` when the request
// named a channel other than "stable"; a local file is always an
// "install-snap" change summarised `Install "NAME" snap from file "PATH"`,
// PATH being the form's snap-path (what snapsvc sends: the file's absolute
// path).
const (
	refreshKind  = "refresh-snap"
	sideloadKind = "install-snap"
)

// summary is the change summary snapd gives the refresh of snap.
func (r *refreshSpec) summary(snap string) string {
	if r.file != "" {
		return fmt.Sprintf("Install %q snap from file %q", snap, r.file)
	}
	s := fmt.Sprintf("Refresh %q snap", snap)
	if r.channel != "" && r.channel != "stable" {
		s += fmt.Sprintf(" from %q channel", r.channel)
	}
	return s
}

// kind is the kind of the change snapd makes for the refresh.
func (r *refreshSpec) kind() string {
	if r.file != "" {
		return sideloadKind
	}
	return refreshKind
}

// String says what the refresh asks for, for keys and logs.
func (r *refreshSpec) String() string {
	switch {
	case r.file != "":
		return "file=" + r.file
	case r.channel != "" && r.revision != "":
		return "channel=" + r.channel + ",revision=" + r.revision
	case r.channel != "":
		return "channel=" + r.channel
	case r.revision != "":
		return "revision=" + r.revision
	}
	return "tracked"
}

// changeKind is the kind of change o makes: "service-control" for a
// service command.
func (o request) changeKind() string {
	if o.refresh != nil {
		return o.refresh.kind()
	}
	return "service-control"
}

// matchesRefresh reports whether chg is the change refresh o would make:
// its kind and summary, for o's one snap.
func matchesRefresh(chg *snapd.Change, o request) bool {
	return chg.Kind == o.refresh.kind() && chg.Summary == o.refresh.summary(o.t.snaps[0])
}

// Errors of Refresh's input, returned before any request is sent.
var (
	// ErrInvalidRefresh: a Refresh's options are malformed (a channel or
	// revision snapd would refuse, a file that is not there, a file
	// together with a channel or revision).
	ErrInvalidRefresh = errors.New("invalid refresh")
	// ErrRefreshInSnapctl: Refresh, HoldRefresh and UnholdRefresh need
	// snapd's REST API (ModeREST): snapctl has no refresh of a snap, only
	// the gate-auto-refresh hook's answer (see GateAutoRefresh).
	ErrRefreshInSnapctl = errors.New("refreshing needs snapd's REST API (ModeREST, as root or with snapd-control): from inside a snap, snapctl only answers snapd's auto-refresh from the gate-auto-refresh hook (GateAutoRefresh)")
)

var (
	// reRisk is a channel's risk (snap/channel: stable, candidate, beta,
	// edge); reChannelPart one part of track/risk/branch.
	reRisk        = regexp.MustCompile(`^(stable|candidate|beta|edge)$`)
	reChannelPart = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._+~-]*$`)
	// reRevision is a revision snapd parses (snap.ParseRevision): a
	// store revision, or "x" and a local one.
	reRevision = regexp.MustCompile(`^x?[1-9][0-9]*$`)
)

// validateChannel checks the shape of a channel the way snapd's
// channel.Parse does for a request: one to three non-empty parts, the
// risk where it must be (track/risk/branch, track/risk or risk/branch).
func validateChannel(ch string) error {
	parts := strings.Split(ch, "/")
	if len(parts) > 3 {
		return fmt.Errorf("channel %q has more than three parts (track/risk/branch)", ch)
	}
	for _, p := range parts {
		if !reChannelPart.MatchString(p) {
			return fmt.Errorf("channel %q has an empty or malformed part %q", ch, p)
		}
	}
	if len(parts) == 3 && !reRisk.MatchString(parts[1]) {
		return fmt.Errorf("channel %q: %q is not a risk (stable, candidate, beta or edge)", ch, parts[1])
	}
	if len(parts) == 2 && !reRisk.MatchString(parts[0]) && !reRisk.MatchString(parts[1]) {
		return fmt.Errorf("channel %q names no risk (stable, candidate, beta or edge)", ch)
	}
	return nil
}

// prepareRefresh validates a refresh of snap and returns its request.
func (c *Client) prepareRefresh(snap string, opts RefreshOptions) (request, error) {
	o := request{action: "refresh", t: target{names: []string{snap}, snaps: []string{snap}}}
	fail := func(err error) (request, error) { return o, c.opError(o, "", 0, err) }
	if snap == "" {
		return fail(fmt.Errorf("%w: no snap named", ErrInvalidName))
	}
	if strings.Contains(snap, ".") {
		return fail(fmt.Errorf("%w %q: a refresh takes a snap, not a service", ErrInvalidName, snap))
	}
	if _, _, err := ValidateName(snap); err != nil {
		return fail(err)
	}
	if c.mode == ModeSnapctl {
		return fail(ErrRefreshInSnapctl)
	}
	spec := &refreshSpec{channel: opts.Channel, revision: opts.Revision, amend: opts.Amend, classic: opts.Classic}
	switch {
	case opts.File != "" && (opts.Channel != "" || opts.Revision != "" || opts.Amend):
		return fail(fmt.Errorf("%w: a local file (%s) takes no channel, revision or amend", ErrInvalidRefresh, opts.File))
	case opts.Channel != "":
		if err := validateChannel(opts.Channel); err != nil {
			return fail(fmt.Errorf("%w: %v", ErrInvalidRefresh, err))
		}
	}
	if opts.Revision != "" && !reRevision.MatchString(opts.Revision) {
		return fail(fmt.Errorf("%w: revision %q is not a revision (a number such as 42, or x2 for a local one)", ErrInvalidRefresh, opts.Revision))
	}
	if opts.File != "" {
		abs, err := filepath.Abs(opts.File)
		if err != nil {
			return fail(fmt.Errorf("%w: %v", ErrInvalidRefresh, err))
		}
		fi, err := os.Stat(abs)
		switch {
		case err != nil:
			return fail(fmt.Errorf("%w: %v", ErrInvalidRefresh, err))
		case !fi.Mode().IsRegular():
			return fail(fmt.Errorf("%w: %s is not a regular file", ErrInvalidRefresh, abs))
		}
		spec.file = abs
	}
	o.refresh = spec
	return o, nil
}

// refreshInstruction is the body of a store refresh's POST.
func (r *refreshSpec) instruction() snapd.SnapInstruction {
	return snapd.SnapInstruction{Action: snapd.ActionRefresh, Channel: r.channel, Revision: r.revision, Amend: r.amend, Classic: r.classic}
}

// isNoUpdate reports whether err is snapd's answer that a refresh has
// nothing to do (kind snap-no-update-available: no change was made).
func isNoUpdate(err error) bool {
	var e *snapd.Error
	return errors.As(err, &e) && e.Kind == snapd.KindSnapNoUpdateAvailable
}
