package snapsvc

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/snapsvc/snapsvc/internal/snapd"
	"github.com/snapsvc/snapsvc/retry"
)

// recentOwn bounds how many change ids a process remembers as claimed per
// snap: a change is claimed by the operation it was made for (or that
// adopted it after a lost answer), and a claimed change is never adopted
// by another operation.
const recentOwn = 256

// claim records id as claimed by an operation on o's snaps. It returns
// false, and records nothing, when another operation of this process
// already claimed it. Claims are taken under every snap's registry lock
// in order, so two operations can never both claim one change.
func (p processSnaps) claim(o request, id string) bool {
	ls := make([]*snapLock, len(o.t.snaps))
	for i, s := range o.t.snaps {
		ls[i] = p.of(s)
		ls[i].mu.Lock()
	}
	defer func() {
		for _, l := range ls {
			l.mu.Unlock()
		}
	}()
	for _, l := range ls {
		if slices.Contains(l.own, id) {
			return false
		}
	}
	for _, l := range ls {
		l.own = append(l.own, id)
		if len(l.own) > recentOwn {
			l.own = l.own[len(l.own)-recentOwn:]
		}
	}
	return true
}

// unclaim forgets a claim that turned out wrong (see operation.adoptedMatches).
func (p processSnaps) unclaim(o request, id string) {
	for _, s := range o.t.snaps {
		l := p.of(s)
		l.mu.Lock()
		l.own = slices.DeleteFunc(l.own, func(x string) bool { return x == id })
		l.mu.Unlock()
	}
}

// sent is when a request to act was sent, as the client knows it: its
// time on the client's clock, and the highest change id the client had
// seen by then (snapd numbers changes in order: one it had seen was made
// before the request); counted says the client had listed snapd's changes
// by then, so that every change above seen came later.
type sent struct {
	at      time.Time
	seen    int64
	counted bool
}

// findOpChange looks for the change snapd made for request o sent at s,
// and claims it: the earliest service-control change whose tasks do
// exactly what o asks on every snap (same action, same services), or for
// a refresh the earliest change of its kind and summary, made
// after the request, neither claimed by another operation of this process
// nor one it waited out (skip). It returns "" when there is none.
//
// "After the request": a change the client had seen before it sent the
// request is not its, and snapd stamps a change with its own clock when it
// creates it, after the request arrived, so its spawn time is no earlier
// than the request's send time read on snapd's clock: the machine's wall
// clock at the send, widened by any step of it since, and corrected by
// what the client's own changes taught it of a snapd with a clock of its
// own (snapdClock.spawnWindow). Enable and disable leave no trace in a
// change (the task summary is the same), so for a start --enable or a
// stop --disable the caller checks the services' state once the change is
// done (operation.adoptedMatches).
//
// until, when not zero, also leaves out changes spawned after it: snapd
// makes a request's change before it answers, so for a request that was
// answered (snapctl's "taking too long", say) nothing later is its.
func findOpChange(k *call, o request, s sent, until time.Time, skip map[string]bool) (string, error) {
	all, err := wholeSnapServices(k, o)
	if err != nil {
		return "", err
	}
	chgs, err := k.listOnce(snapd.SelectAll)
	if err != nil {
		return "", err
	}
	return claimOpChange(k, chgs, o, all, s, until, skip), nil
}

// claimOpChange is findOpChange on a listing, with all from
// wholeSnapServices; a non-zero answeredAt also leaves out changes
// spawned after snapd answered the request.
func claimOpChange(k *call, chgs []snapd.Change, o request, all map[string][]string, s sent, answeredAt time.Time, skip map[string]bool) string {
	c := k.c
	from, sure, to := c.view.clock.spawnWindow(s.at, answeredAt, c.clock.Now())
	for _, id := range opCandidates(chgs, o, all, s.seen, from, sure, to, skip) {
		if c.snaps.claim(o, id) {
			return id
		}
	}
	return ""
}

// wholeSnapServices returns, for each snap o names as a whole in a start
// or stop (and no service of it explicitly), the sorted names of all its
// services: snapd's task summary lists them (serviceControlTs), so only
// with them can a change be told to be o's. A foreign start of one
// service of the snap must not pass for a start of all of them. It
// returns nil when o needs none.
func wholeSnapServices(k *call, o request) (map[string][]string, error) {
	var snaps []string
	for _, snap := range o.t.snaps {
		if (o.action == "start" || o.action == "stop") && namesWholeOnly(o, snap) {
			snaps = append(snaps, snap)
		}
	}
	if len(snaps) == 0 {
		return nil, nil
	}
	svcs, err := k.services(snaps)
	if err != nil {
		return nil, err
	}
	all := make(map[string][]string, len(snaps))
	for _, s := range svcs {
		all[s.Snap] = append(all[s.Snap], s.Name)
	}
	for _, snap := range snaps {
		slices.Sort(all[snap])
		all[snap] = slices.Compact(all[snap])
	}
	return all, nil
}

// namesWholeOnly reports whether o names snap as a whole and none of its
// services explicitly.
func namesWholeOnly(o request, snap string) bool {
	whole := false
	for _, n := range o.t.names {
		s, app, _ := strings.Cut(n, ".")
		if s != snap {
			continue
		}
		if app != "" {
			return false
		}
		whole = true
	}
	return whole
}

// claimBySequence claims, for a request sent at a.sent and answered once
// its change was ready (snapctl answers then), the change snapd made for
// it by snapd's change counter alone, where the clocks disagree: the lowest
// id above every change the client had listed before sending, doing
// exactly what o asks, ready, and whose run fits between the send and the
// answer. It returns "" when the client had not listed the changes before
// sending, or none fits.
func (op *operation) claimBySequence(chgs []snapd.Change, all map[string][]string, a attempt) string {
	o, skip := op.o, op.known
	if !a.sent.counted {
		return ""
	}
	// snapd's stamps measure the change's run: by the wall clock, which
	// may have stepped forward meanwhile.
	took := a.answeredAt.Sub(a.sentAt) + clockSlack + max(0, op.c.view.clock.stepped(a.sentAt, a.answeredAt))
	var ids []string
	for i := range chgs {
		chg := &chgs[i]
		n, err := strconv.ParseInt(chg.ID, 10, 64)
		if err != nil || n <= a.sent.seen || chg.Kind != o.changeKind() || skip[chg.ID] || !chg.Ready || chg.ReadyTime == nil {
			continue
		}
		if chg.ReadyTime.Sub(chg.SpawnTime) > took || !matchesOp(chg, o, all) {
			continue
		}
		ids = append(ids, chg.ID)
	}
	slices.SortFunc(ids, func(a, b string) int {
		if lessID(a, b) {
			return -1
		}
		return 1
	})
	for _, id := range ids {
		if op.c.snaps.claim(o, id) {
			return id
		}
	}
	return ""
}

// opCandidates lists the changes in chgs that may have been made for
// request o: unseen before it (an id above seen), spawned no earlier than
// from and, when to is not zero, no later than to (snapd's clock). sure
// (>= from) is the earliest snapd's clock certainly read after the
// request was sent. The likeliest first: those spawned at or after sure,
// earliest first (the request's change is the first snapd made once it
// had the request); then those spawned between from and sure, latest
// first: snapd numbers its changes in order, so an identical change of
// someone else's made just before the request has the lower id, and one
// made after it, while the request's own was running, would have
// conflicted.
func opCandidates(chgs []snapd.Change, o request, all map[string][]string, seen int64, from, sure, to time.Time, skip map[string]bool) []string {
	var after, unsure []string
	for i := range chgs {
		chg := &chgs[i]
		if chg.Kind != o.changeKind() || skip[chg.ID] || chg.SpawnTime.Before(from) {
			continue
		}
		if n, err := strconv.ParseInt(chg.ID, 10, 64); err == nil && n <= seen {
			continue
		}
		if !to.IsZero() && chg.SpawnTime.After(to) {
			continue
		}
		if !matchesOp(chg, o, all) {
			continue
		}
		if chg.SpawnTime.Before(sure) {
			unsure = append(unsure, chg.ID)
		} else {
			after = append(after, chg.ID)
		}
	}
	byID := func(a, b string) int {
		switch {
		case lessID(a, b):
			return -1
		case lessID(b, a):
			return 1
		}
		return 0
	}
	slices.SortFunc(after, byID)
	slices.SortFunc(unsure, func(a, b string) int { return byID(b, a) })
	return append(after, unsure...)
}

// queuedIn returns the running hook change that o's service commands were
// queued into (snapctl in a configure or default-configure hook:
// ctlcmd queueCommand adds the tasks to the hook's change, to run after
// the hook), or "". The hook's change must predate snapd's answer (to)
// and the queued task must have been added while the request was handled
// (from on): the request's spawn window (snapdClock.spawnWindow).
func queuedIn(chgs []snapd.Change, o request, all map[string][]string, from, to time.Time) string {
	for i := range chgs {
		chg := &chgs[i]
		if chg.Ready || chg.SpawnTime.After(to) {
			continue
		}
		hookRunning := false
		for _, t := range chg.Tasks {
			if t.Kind == "run-hook" && t.Status == snapd.StatusDoing {
				hookRunning = true
			}
		}
		if !hookRunning || !matchesOp(chg, o, all) {
			continue
		}
		for _, t := range chg.Tasks {
			if t.Kind == "service-control" && t.Status == snapd.StatusDo && !t.SpawnTime.Before(from) {
				return chg.ID
			}
		}
	}
	return ""
}

// matchesOp reports whether a service-control change does what o asks, by
// the task summaries snapd writes (overlord/servicestate/servicestate.go
// serviceControlTs): `Run service command "restart" for services
// ["kubelet"] of snap "k8s"`, naming the services named explicitly
// (sorted), or every service of a snap named as a whole (all, from
// wholeSnapServices), except that a whole-snap restart says `... for
// running services of snap "k8s"`.
//
// A refresh matches by the change's kind and summary instead
// (matchesRefresh).
func matchesOp(chg *snapd.Change, o request, all map[string][]string) bool {
	if o.refresh != nil {
		return matchesRefresh(chg, o)
	}
	for _, snap := range o.t.snaps {
		want := expectedSummary(o, snap, all[snap])
		if !slices.ContainsFunc(chg.Tasks, func(t snapd.Task) bool { return t.Kind == "service-control" && t.Summary == want }) {
			return false
		}
	}
	return true
}

// expectedSummary returns the summary snapd gives o's task on snap; all
// lists the snap's services, for a start or stop of the whole snap.
func expectedSummary(o request, snap string, all []string) string {
	action := o.action
	if o.reload {
		action = "reload-or-restart"
	}
	var apps []string
	for _, n := range o.t.names {
		s, app, _ := strings.Cut(n, ".")
		if s == snap && app != "" && !slices.Contains(apps, app) {
			apps = append(apps, app)
		}
	}
	switch {
	case len(apps) == 0 && o.action == "restart":
		// serviceControlTs tests the request's action: a reload of the
		// whole snap says so too.
		return fmt.Sprintf("Run service command %q for running services of snap %q", action, snap)
	case len(apps) == 0:
		apps = all
	}
	slices.Sort(apps)
	return fmt.Sprintf("Run service command %q for services %q of snap %q", action, apps, snap)
}

// changeFailure recognises snapctl's report of a failed change ("cannot
// perform the following tasks: ...") in *errp, turns it into a
// *ChangeError (keeping snapd's error in the chain) and returns the
// change's id when it can be found.
func (op *operation) changeFailure(sentAt time.Time, errp *error) string {
	c, k, o := op.c, op.k, op.o
	var apiErr *snapd.Error
	if c.mode != ModeSnapctl || !errors.As(*errp, &apiErr) {
		return ""
	}
	msg := apiErr.Message
	for _, p := range []string{"error running snapctl: ", "snapctl: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	if !strings.HasPrefix(msg, "cannot perform the following tasks") {
		return ""
	}
	id, _ := findOpChange(k, o, sent{at: sentAt}, c.clock.Now(), nil) // snapctl answered: the change predates the answer
	*errp = errors.Join(&ChangeError{ID: id, Kind: "service-control", Status: snapd.StatusError, Err: msg}, *errp)
	return id
}

// ownHookChange returns the change of the hook this process runs in (its
// run-hook task for one of snaps is Doing), or "". snapd leaves that
// change out of the conflict check (hookstate Context.ChangeID), and
// waiting for it from inside the hook would never end.
func ownHookChange(k *call, snaps []string) string {
	c := k.c
	if c.view.listingRefused() {
		return "" // snapd refuses this client its changes (cadence.go)
	}
	chgs, err := k.listOnce(snapd.SelectInProgress)
	if err != nil {
		c.view.noteListing(err, c.mode)
		return ""
	}
	for _, chg := range chgs {
		for _, t := range chg.Tasks {
			if t.Kind != "run-hook" || t.Status != snapd.StatusDoing {
				continue
			}
			for _, s := range snaps {
				// hookstate: `Run configure hook of "x" snap`; the
				// gate-auto-refresh hook's (SetupGateAutoRefreshHook)
				// is `Run hook gate-auto-refresh of snap "x"`.
				if t.Summary == fmt.Sprintf("Run %s hook of %q snap", c.hook, s) || t.Summary == fmt.Sprintf("Run hook %s of snap %q", c.hook, s) {
					return chg.ID
				}
			}
		}
	}
	return ""
}

// findBlockers lists the in-progress changes that hold any of snaps (or,
// for a conflict with an exclusive change, every change of that kind).
// skip is a change to ignore (the caller's own).
func findBlockers(k *call, snaps []string, ce *retry.ConflictError, skip string) ([]string, error) {
	c := k.c
	if c.view.notices() == noticesNo {
		// Watch the state file from before the listing: a wait for the
		// blockers may then take the listing as its first read.
		c.state.open()
	}
	chgs, err := k.listOnce(snapd.SelectInProgress)
	if err != nil {
		return nil, err
	}
	patterns := make([]*regexp.Regexp, len(snaps))
	for i, s := range snaps {
		patterns[i] = summaryPattern(s)
	}
	var ids []string
	for i := range chgs {
		chg := &chgs[i]
		if chg.Ready || chg.ID == skip {
			continue
		}
		match := ce != nil && ce.AllSnaps && (ce.ChangeKind == "" || ce.ChangeKind == chg.Kind)
		for i, s := range snaps {
			if match {
				break
			}
			match = touches(chg, s, patterns[i])
		}
		if match {
			ids = append(ids, chg.ID)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return lessID(ids[i], ids[j]) })
	return ids, nil
}

// touches reports whether a change holds snap the way snapd's conflict
// check sees it (any task of a non-ready change that affects the snap,
// even a finished one). snapd >= 2.62 lists affected-snaps on tasks; every
// version names the snap in task summaries, matched by re (summaryPattern),
// e.g. `Run service command "stop" for services ["gamma"] of snap
// "svcdemo"`, `Run configure hook of "svcdemo" snap`, `stop of
// [svcdemo.gamma]`.
func touches(chg *snapd.Change, snap string, re *regexp.Regexp) bool {
	if re.MatchString(chg.Summary) {
		return true
	}
	for _, t := range chg.Tasks {
		if slices.Contains(t.Data.AffectedSnaps, snap) || re.MatchString(t.Summary) {
			return true
		}
	}
	return false
}

func summaryPattern(snap string) *regexp.Regexp {
	q := regexp.QuoteMeta(snap)
	return regexp.MustCompile(`snap "` + q + `"|"` + q + `" snap|[\[ ]` + q + `[.\] ,]|\[` + q + `\]`)
}

// lessID orders change ids numerically (they are decimal counters).
func lessID(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}
