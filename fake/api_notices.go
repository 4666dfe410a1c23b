package fake

import (
	"math"
	"net/http"
	"sort"
	"strconv"
	"time"
)

// noticeTypes known to snapd (overlord/state/notices.go); unknown types in
// a filter are ignored, and a filter of only unknown types matches nothing.
var noticeTypes = map[string]bool{
	"change-update": true, "warning": true, "refresh-inhibit": true, "snap-run-inhibit": true,
	"interfaces-requests-prompt": true, "interfaces-requests-rule-update": true,
}

// noticeExpireAfter is overlord/state/notices.go defaultNoticeExpireAfter:
// a notice not re-occurring for 7 days is dropped.
const noticeExpireAfter = 7 * 24 * time.Hour

// noticeJSON mirrors daemon/api_notices.go jsonNotice; user-id is null for
// public notices (no omitempty).
type noticeJSON struct {
	ID            string            `json:"id"`
	UserID        *uint32           `json:"user-id"`
	Type          string            `json:"type"`
	Key           string            `json:"key"`
	FirstOccurred time.Time         `json:"first-occurred"`
	LastOccurred  time.Time         `json:"last-occurred"`
	LastRepeated  time.Time         `json:"last-repeated"`
	Occurrences   int               `json:"occurrences"`
	LastData      map[string]string `json:"last-data,omitempty"`
	RepeatAfter   string            `json:"repeat-after,omitempty"`
	ExpireAfter   string            `json:"expire-after,omitempty"`
}

func noticeToJSON(n *notice) noticeJSON {
	ld := map[string]string{}
	for k, v := range n.lastData {
		ld[k] = v
	}
	return noticeJSON{ID: n.id, Type: n.typ, Key: n.key, FirstOccurred: n.first.UTC(), LastOccurred: n.last.UTC(),
		LastRepeated: n.lastRepeated.UTC(), Occurrences: n.occurrences, LastData: ld,
		ExpireAfter: noticeExpireAfter.String()}
}

func (s *Server) getNotice(id string) *response {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	for _, n := range s.notices {
		if n.id == id && !n.last.Add(noticeExpireAfter).Before(now) {
			return syncResp(noticeToJSON(n))
		}
	}
	return notFound("cannot find notice with id %q", id)
}

// getNotices mirrors daemon/api_notices.go: filters types/keys/after
// (strictly after last-repeated), long-polls up to timeout.
func (s *Server) getNotices(r *http.Request, stopping <-chan struct{}) *response {
	q := r.URL.Query()
	// daemon/api_notices.go: user-id / users are checked first (the fake
	// answers as root, so both are allowed; all its notices are public,
	// which every user-id filter matches).
	if len(q["user-id"]) > 0 {
		ids := commaList(q["user-id"])
		if len(ids) != 1 {
			return badRequest(`invalid "user-id" filter: must only include one "user-id"`)
		}
		n, err := strconv.ParseInt(ids[0], 10, 64)
		if err != nil {
			return badRequest(`invalid "user-id" filter: %v`, err)
		}
		if n < 0 || n > math.MaxUint32 {
			return badRequest(`invalid "user-id" filter: user ID is not a valid uint32: %d`, n)
		}
	}
	if len(q["users"]) > 0 {
		if len(q["user-id"]) > 0 {
			return badRequest(`cannot use both "users" and "user-id" parameters`)
		}
		if q.Get("users") != "all" {
			return badRequest(`invalid "users" filter: must be "all"`)
		}
	}
	var types map[string]bool
	if raw := commaList(q["types"]); len(raw) > 0 {
		types = map[string]bool{}
		for _, t := range raw {
			if noticeTypes[t] {
				types[t] = true
			}
		}
		if len(types) == 0 {
			return syncResp([]noticeJSON{})
		}
	}
	var keys map[string]bool
	if raw := commaList(q["keys"]); len(raw) > 0 {
		keys = map[string]bool{}
		for _, k := range raw {
			keys[k] = true
		}
	}
	var after time.Time
	if a := q.Get("after"); a != "" {
		t, err := time.Parse(time.RFC3339, a)
		if err != nil {
			return badRequest("invalid \"after\" timestamp: %v", err)
		}
		after = t
	}
	var timeout time.Duration
	if ts := q.Get("timeout"); ts != "" {
		d, err := time.ParseDuration(ts)
		if err != nil {
			return badRequest("invalid timeout: %v", err)
		}
		timeout = d
	}
	match := func() []noticeJSON {
		var ns []*notice
		now := s.nowLocked()
		for _, n := range s.notices {
			if n.last.Add(noticeExpireAfter).Before(now) {
				continue // expired (Notice.Expired)
			}
			if types != nil && !types[n.typ] {
				continue
			}
			if keys != nil && !keys[n.key] {
				continue
			}
			if !after.IsZero() && !n.lastRepeated.After(after) {
				continue
			}
			ns = append(ns, n)
		}
		sort.SliceStable(ns, func(i, j int) bool { return ns[i].lastRepeated.Before(ns[j].lastRepeated) })
		out := []noticeJSON{}
		for _, n := range ns {
			out = append(out, noticeToJSON(n))
		}
		return out
	}
	s.mu.Lock()
	res := match()
	if len(res) > 0 || timeout <= 0 {
		s.mu.Unlock()
		return syncResp(res)
	}
	expired := make(chan struct{})
	cancel := s.afterLocked(timeout, func() {
		// decided under s.mu: a notice that already arrived wins
		if len(match()) == 0 {
			close(expired)
		}
	})
	defer cancel()
	for {
		wake := s.noticeWake
		s.mu.Unlock()
		select {
		case <-wake:
			// The timer closes expired only while nothing matched, so a
			// closed expired means the deadline came before this notice:
			// answer as at the deadline, whichever channel select chose.
			select {
			case <-expired:
				return syncResp([]noticeJSON{})
			default:
			}
		case <-expired:
			return syncResp([]noticeJSON{})
		case <-r.Context().Done():
			return errResp(500, "", nil, "request canceled")
		case <-stopping:
			return errResp(500, "", nil, "request canceled")
		case <-s.closeCh:
			return errResp(500, "", nil, "request canceled")
		}
		s.mu.Lock()
		if res := match(); len(res) > 0 {
			s.mu.Unlock()
			return syncResp(res)
		}
	}
}
