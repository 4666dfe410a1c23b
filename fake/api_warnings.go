package fake

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sort"
	"time"
)

// Warnings as overlord/state/warning.go keeps them: a warning is pending
// (shown by GET /v2/warnings and counted in every answer's warning-count)
// until it is okayed, then again repeat-after (24h) later; it expires
// expire-after (28 days) after it was last added.
const (
	warningRepeatAfter = 24 * time.Hour
	warningExpireAfter = 28 * 24 * time.Hour
)

type warning struct {
	message               string
	firstAdded, lastAdded time.Time
	lastShown             time.Time
}

// warningJSON mirrors state's jsonWarning.
type warningJSON struct {
	Message     string     `json:"message"`
	FirstAdded  time.Time  `json:"first-added"`
	LastAdded   time.Time  `json:"last-added"`
	LastShown   *time.Time `json:"last-shown,omitempty"`
	ExpireAfter string     `json:"expire-after,omitempty"`
	RepeatAfter string     `json:"repeat-after,omitempty"`
}

func (w *warning) json() warningJSON {
	j := warningJSON{Message: w.message, FirstAdded: w.firstAdded, LastAdded: w.lastAdded,
		ExpireAfter: warningExpireAfter.String(), RepeatAfter: warningRepeatAfter.String()}
	if !w.lastShown.IsZero() {
		ls := w.lastShown
		j.LastShown = &ls
	}
	return j
}

// showAfter mirrors Warning.ShowAfter.
func (w *warning) showAfter(t time.Time) bool {
	if w.lastShown.IsZero() {
		return !w.firstAdded.After(t)
	}
	return w.lastShown.Add(warningRepeatAfter).Before(t)
}

func (w *warning) expired(now time.Time) bool { return w.lastAdded.Add(warningExpireAfter).Before(now) }

func (s *Server) liveWarningsLocked() []*warning {
	now := s.nowLocked()
	var out []*warning
	for _, w := range s.warnings {
		if !w.expired(now) {
			out = append(out, w)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].lastAdded.Before(out[j].lastAdded) })
	return out
}

// warningsSummaryLocked mirrors State.WarningsSummary.
func (s *Server) warningsSummaryLocked() (int, time.Time) {
	now := s.nowLocked()
	var last time.Time
	n := 0
	for _, w := range s.liveWarningsLocked() {
		if w.showAfter(now) {
			n++
			if w.lastAdded.After(last) {
				last = w.lastAdded
			}
		}
	}
	return n, last
}

// getWarnings mirrors daemon/api_general.go getWarnings: select=pending
// (the default) or all, in last-added order.
func (s *Server) getWarnings(r *http.Request) *response {
	sel := r.URL.Query().Get("select")
	all := false
	switch sel {
	case "all":
		all = true
	case "pending", "":
	default:
		return badRequest("invalid select parameter: %q", sel)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	out := []warningJSON{}
	for _, w := range s.liveWarningsLocked() {
		if all || w.showAfter(now) {
			out = append(out, w.json())
		}
	}
	return syncResp(out)
}

// ackWarnings mirrors ackWarnings: {"action":"okay","timestamp":T} marks
// every warning pending at T as shown at T and answers how many.
func (s *Server) ackWarnings(body []byte) *response {
	var op struct {
		Action    string    `json:"action"`
		Timestamp time.Time `json:"timestamp"`
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&op); err != nil {
		return badRequest("cannot decode request body into warnings operation: %v", err)
	}
	if op.Action != "okay" {
		return badRequest("unknown warning action %q", op.Action)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := op.Timestamp.UTC()
	n := 0
	for _, w := range s.liveWarningsLocked() {
		if w.showAfter(t) {
			w.lastShown = t
			n++
		}
	}
	return syncResp(n)
}
